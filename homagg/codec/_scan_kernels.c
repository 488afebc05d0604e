/* homagg's nonzero scan, the first pass of the codec's sparse CPU path over a 32-bit input:
 *
 *   homagg_pack32   the nonzero bitmap (an element is nonzero when (x & mask) != 0) and its count.
 *   homagg_scan32   homagg_pack32 with the listing (homagg_set_bits32) and the gather
 *                   (homagg_gather32) fused in, each 64-element group listed while it is in L1,
 *                   while room lasts.
 *   homagg_scan32z  homagg_scan32 that also ORs the raw bits of the elements counted as zero (a
 *                   float's -0.0 under the mask 0x7FFFFFFF), so the caller knows whether every
 *                   zero is +0.0.
 *
 * Plain C, loaded with ctypes by homagg/codec/_native.py and compiled into the same library as
 * homagg/codec/_native_kernels.c (setup.py), whose header comment holds what both files assume
 * (the fallbacks, the bitmaps' layout); homagg/codec/_native_kernels.h holds what they share.
 * Each kernel has a scalar loop and an AVX2 one, chosen at run time; tests/test_hostops.py checks
 * them against the numpy path and torch.
 */
#include <stdint.h>

#include "_native_kernels.h"

static int64_t pack32_tail(const uint32_t *x, int64_t from, int64_t n, uint32_t mask, uint64_t *words) {
    int64_t count = 0;
    if (from < n) {
        uint64_t b = 0;
        for (int64_t i = from; i < n; i++)
            b |= (uint64_t)((x[i] & mask) != 0) << (i - from);
        words[from / 64] = b;
        count = __builtin_popcountll(b);
    }
    return count;
}

HOMAGG_POPCNT static int64_t pack32_scalar(const uint32_t *x, int64_t n, uint32_t mask, uint64_t *words) {
    int64_t full = n / 64, count = 0;
    for (int64_t w = 0; w < full; w++) {
        const uint32_t *p = x + w * 64;
        uint64_t b = 0;
        for (int i = 0; i < 64; i++)
            b |= (uint64_t)((p[i] & mask) != 0) << i;
        words[w] = b;
        count += __builtin_popcountll(b);
    }
    return count + pack32_tail(x, full * 64, n, mask, words);
}

#ifdef HOMAGG_X86
__attribute__((target("avx2,popcnt"))) static int64_t pack32_avx2(const uint32_t *x, int64_t n, uint32_t mask,
                                                                   uint64_t *words) {
    int64_t full = n / 64, count = 0;
    const __m256i m = _mm256_set1_epi32((int)mask), zero = _mm256_setzero_si256();
    for (int64_t w = 0; w < full; w++) {
        const uint32_t *p = x + w * 64;
        uint64_t b = 0;
        for (int i = 0; i < 8; i++) {
            __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 8 * i)), m);
            uint32_t is_zero = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, zero)));
            b |= (uint64_t)(~is_zero & 0xFFu) << (8 * i);
        }
        words[w] = b;
        count += __builtin_popcountll(b);
    }
    return count + pack32_tail(x, full * 64, n, mask, words);
}
#endif

/* Pack the nonzero bitmap of n 32-bit elements into ceil(n / 64) words; an element counts as
 * nonzero when (x & mask) != 0 (mask 0x7FFFFFFF for float32: -0.0 is zero, NaN is not).
 * Returns the number of nonzero elements. */
int64_t homagg_pack32(const uint32_t *x, int64_t n, uint32_t mask, uint64_t *words) {
#ifdef HOMAGG_X86
    if (__builtin_cpu_supports("avx2"))
        return pack32_avx2(x, n, mask, words);
#endif
    return pack32_scalar(x, n, mask, words);
}

/* The nonzero scan that also lists what it finds: homagg_pack32's words and count, and while room
 * lasts the positions (ascending, int64) and, with vals, the 32-bit values at them, each 64-element
 * group listed while it is in L1 (homagg_pack32 + homagg_set_bits32 + homagg_gather32 read the
 * bitmap once more and the input a second time, cache-cold).  pos has room for cap entries; the
 * listing stops for good before a group could overflow it (a group may need 64 + 4 scratch).
 * Returns the count; *listed = the entries listed when every one was, else -1 (the caller lists
 * them from the words). */
#define HOMAGG_SCAN_BODY(GROUP_BITS)                                                                   \
    const int64_t full = n / 64;                                                                       \
    int64_t count = 0, k = 0;                                                                          \
    int listing = pos != NULL;                                                                         \
    for (int64_t w = 0; w < full; w++) {                                                               \
        const uint32_t *p = x + w * 64;                                                                \
        const uint64_t b = GROUP_BITS;                                                                 \
        words[w] = b;                                                                                  \
        count += __builtin_popcountll(b);                                                              \
        if (listing) {                                                                                 \
            if (k + 68 > cap) {                                                                        \
                listing = 0;                                                                           \
                continue;                                                                              \
            }                                                                                          \
            /* no branch on b: an empty group lists nothing; scratch entries lie inside the group */   \
            const int c = decode64(b, w * 64, pos + k);                                                \
            if (vals)                                                                                  \
                for (int j = 0; j < c || j < 4; j += 4)                                                \
                    for (int i = 0; i < 4; i++)                                                        \
                        vals[k + j + i] = x[pos[k + j + i]];                                           \
            k += c;                                                                                    \
        }                                                                                              \
    }                                                                                                  \
    count += pack32_tail(x, full * 64, n, mask, words);                                                \
    if (listing && full * 64 < n) {                                                                    \
        if (k + 68 > cap) {                                                                            \
            listing = 0;                                                                               \
        } else {                                                                                       \
            const int c = decode64(words[full], full * 64, pos + k);                                   \
            if (vals)                                                                                  \
                for (int j = 0; j < c; j++)                                                            \
                    vals[k + j] = x[pos[k + j]];                                                       \
            k += c;                                                                                    \
        }                                                                                              \
    }                                                                                                  \
    *listed = listing ? k : -1;                                                                        \
    return count;

static inline __attribute__((always_inline)) uint64_t group_bits_scalar(const uint32_t *p, uint32_t mask) {
    uint64_t b = 0;
    for (int i = 0; i < 64; i++)
        b |= (uint64_t)((p[i] & mask) != 0) << i;
    return b;
}

HOMAGG_POPCNT static int64_t scan32_scalar(const uint32_t *x, int64_t n, uint32_t mask, uint64_t *words, int64_t cap,
                                           int64_t *pos, uint32_t *vals, int64_t *listed) {
    HOMAGG_SCAN_BODY(group_bits_scalar(p, mask))
}

#ifdef HOMAGG_X86
__attribute__((target("avx2,popcnt"))) static inline uint64_t group_bits_avx2(const uint32_t *p, __m256i m) {
    const __m256i zero = _mm256_setzero_si256();
    uint64_t b = 0;
    for (int i = 0; i < 8; i++) {
        __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 8 * i)), m);
        uint32_t is_zero = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(v, zero)));
        b |= (uint64_t)(~is_zero & 0xFFu) << (8 * i);
    }
    return b;
}

__attribute__((target("avx2,popcnt"))) static int64_t scan32_avx2(const uint32_t *x, int64_t n, uint32_t mask,
                                                                  uint64_t *words, int64_t cap, int64_t *pos,
                                                                  uint32_t *vals, int64_t *listed) {
    const __m256i m = _mm256_set1_epi32((int)mask);
    HOMAGG_SCAN_BODY(group_bits_avx2(p, m))
}
#endif

int64_t homagg_scan32(const uint32_t *x, int64_t n, uint32_t mask, uint64_t *words, int64_t cap, int64_t *pos,
                      uint32_t *vals, int64_t *listed) {
#ifdef HOMAGG_X86
    if (__builtin_cpu_supports("avx2"))
        return scan32_avx2(x, n, mask, words, cap, pos, vals, listed);
#endif
    return scan32_scalar(x, n, mask, words, cap, pos, vals, listed);
}

/* homagg_scan32 that also tells whether an element counted as zero had any bit set (a float's -0.0
 * under the mask 0x7FFFFFFF): *odd = the OR of the raw bits of every element with (x & mask) == 0.
 * The result keeps a float's zeros only where *odd == 0 (then every zero is +0.0); the extra test
 * runs on each 64-element group while it is in L1 (no second pass over the input). */
static inline void odd_tail(const uint32_t *x, int64_t from, int64_t n, uint32_t mask, uint32_t *odd) {
    for (int64_t i = from; i < n; i++)
        if ((x[i] & mask) == 0)
            *odd |= x[i];
}

static inline uint64_t group_bits_scalar_z(const uint32_t *p, uint32_t mask, uint32_t *odd) {
    uint64_t b = 0;
    uint32_t o = 0;
    for (int i = 0; i < 64; i++) {
        const uint32_t nz = (p[i] & mask) != 0;
        b |= (uint64_t)nz << i;
        o |= nz ? 0u : p[i];
    }
    *odd |= o;
    return b;
}

HOMAGG_POPCNT static int64_t scan32z_scalar(const uint32_t *x, int64_t n, uint32_t mask, uint64_t *words, int64_t cap,
                                            int64_t *pos, uint32_t *vals, int64_t *listed, uint32_t *odd) {
    HOMAGG_SCAN_BODY(group_bits_scalar_z(p, mask, odd))
}

#ifdef HOMAGG_X86
__attribute__((target("avx2,popcnt"))) static inline uint64_t group_bits_avx2_z(const uint32_t *p, __m256i m,
                                                                                uint32_t *odd) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i o = zero;
    uint64_t b = 0;
    for (int i = 0; i < 8; i++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 8 * i));
        const __m256i z = _mm256_cmpeq_epi32(_mm256_and_si256(raw, m), zero);
        const uint32_t is_zero = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(z));
        b |= (uint64_t)(~is_zero & 0xFFu) << (8 * i);
        o = _mm256_or_si256(o, _mm256_and_si256(z, raw));
    }
    if (!_mm256_testz_si256(o, o))
        *odd |= 1u;
    return b;
}

__attribute__((target("avx2,popcnt"))) static int64_t scan32z_avx2(const uint32_t *x, int64_t n, uint32_t mask,
                                                                   uint64_t *words, int64_t cap, int64_t *pos,
                                                                   uint32_t *vals, int64_t *listed, uint32_t *odd) {
    const __m256i m = _mm256_set1_epi32((int)mask);
    HOMAGG_SCAN_BODY(group_bits_avx2_z(p, m, odd))
}
#endif

int64_t homagg_scan32z(const uint32_t *x, int64_t n, uint32_t mask, uint64_t *words, int64_t cap, int64_t *pos,
                       uint32_t *vals, int64_t *listed, uint32_t *odd) {
    *odd = 0;
    odd_tail(x, n / 64 * 64, n, mask, odd);
#ifdef HOMAGG_X86
    if (__builtin_cpu_supports("avx2"))
        return scan32z_avx2(x, n, mask, words, cap, pos, vals, listed, odd);
#endif
    return scan32z_scalar(x, n, mask, words, cap, pos, vals, listed, odd);
}
