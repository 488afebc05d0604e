/* What homagg's codec kernels in C share: homagg/codec/_native_kernels.c (the bit listing, the
 * decode, compact's fused union passes) and homagg/codec/_scan_kernels.c (the nonzero scan):
 * HOMAGG_X86 (x86-64 with GCC or clang: AVX2 chosen at run time), HOMAGG_POPCNT (a function
 * compiled twice, with and without popcnt, chosen at load) and decode64 (a 64-bit word's set bits
 * as positions).  Each file gets its own inlined copy of decode64; nothing here is exported.
 */
#ifndef HOMAGG_NATIVE_KERNELS_H
#define HOMAGG_NATIVE_KERNELS_H

#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HOMAGG_X86 1
/* a popcnt instruction where the CPU has one (else a libgcc call), chosen once at load (ifunc) */
#define HOMAGG_POPCNT __attribute__((target_clones("popcnt", "default")))
#else
#define HOMAGG_POPCNT
#endif

/* Write the positions base + i of the set bits i of b to out (ascending); returns how many.  Four
 * trailing-zero counts per step whatever the word holds: a branch per four bits, not per bit
 * (Lemire's bitset decoding); up to 3 scratch entries are written past the returned count. */
static inline __attribute__((always_inline)) int decode64(uint64_t b, int64_t base, int64_t *out) {
    int count = __builtin_popcountll(b);
    for (int j = 0; j < 4; j++) {
        out[j] = base + __builtin_ctzll(b | 1ULL << 63); /* an emptied word: scratch */
        b &= b - 1;
    }
    for (int j = 4; j < count; j += 4) {
        for (int i = 0; i < 4; i++) {
            out[j + i] = base + __builtin_ctzll(b | 1ULL << 63);
            b &= b - 1;
        }
    }
    return count;
}

#endif
