/* homagg's word loops between host-order int32 arrays and the wire's big-endian words, shared by
 * the worker's datapath (homagg/transport/_fastpath.c) and the emulator's native engine
 * (switch_emulator/_dataplane.c).
 *
 *   hg_words_to_wire    dst bytes = src words, big-endian           (a datagram's payload)
 *   hg_words_from_wire  dst words = big-endian src bytes            (a result's payload)
 *   hg_words_add/or/max r[j] = r[j] (+ | max) the big-endian word j  (the switch's combine: ADD
 *                       wraps modulo 2**32 as the P4 program's 32-bit registers do; MAX is signed)
 *
 * Each loop is written once and compiled twice (target_clones: AVX2, and the baseline x86-64 the
 * rest of the library is built for), picked once at load.  Without the AVX2 clone GCC turns the
 * byte swap into one scalar bswap per word; with it, one vpshufb per 8 words: measured on the
 * 2-core VM of docs/benchmarks.md, a 2238-word datagram's to_wire + add took 5.2 us scalar and
 * 0.44 us with AVX2.  Integer operations only, so both clones give the same bits.
 */
#ifndef HOMAGG_WIREWORDS_H
#define HOMAGG_WIREWORDS_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HG_WORDS_CLONES __attribute__((target_clones("avx2", "default"), unused))
#else
#define HG_WORDS_CLONES __attribute__((unused))
#endif

static inline uint32_t hg_load_be32(const uint8_t *p) { uint32_t b; memcpy(&b, p, 4); return __builtin_bswap32(b); }

HG_WORDS_CLONES static void hg_words_to_wire(uint8_t *restrict dst, const int32_t *restrict src, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        uint32_t b = __builtin_bswap32((uint32_t)src[j]);
        memcpy(dst + 4 * j, &b, 4);
    }
}

HG_WORDS_CLONES static void hg_words_from_wire(int32_t *restrict dst, const uint8_t *restrict src, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        dst[j] = (int32_t)hg_load_be32(src + 4 * j);
}

HG_WORDS_CLONES static void hg_words_add(int32_t *restrict r, const uint8_t *restrict src, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        r[j] = (int32_t)((uint32_t)r[j] + hg_load_be32(src + 4 * j));
}

HG_WORDS_CLONES static void hg_words_or(int32_t *restrict r, const uint8_t *restrict src, int64_t n) {
    for (int64_t j = 0; j < n; j++)
        r[j] |= (int32_t)hg_load_be32(src + 4 * j);
}

HG_WORDS_CLONES static void hg_words_max(int32_t *restrict r, const uint8_t *restrict src, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        int32_t v = (int32_t)hg_load_be32(src + 4 * j);
        r[j] = v > r[j] ? v : r[j];
    }
}

#endif
