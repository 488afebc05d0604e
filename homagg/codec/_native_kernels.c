/* homagg's optional native kernels, the codec's CPU hot path: the union's positions
 * (homagg_set_bits32), the local elements' slots in the union (homagg_bit_ranks32), the gather
 * (homagg_gather32) and the float32 decode into the result (homagg_decode_into32); compact's two
 * passes over the union fused into one walk of the combined bitmap each (homagg_quantize_place64,
 * homagg_decode_bits32); two-level bitmaps (homagg_select_bits32, homagg_place_bits32).  The
 * nonzero scan (homagg_pack32, homagg_scan32, homagg_scan32z) is in homagg/codec/_scan_kernels.c,
 * compiled into the same library; homagg/codec/_native_kernels.h holds what the two share.
 *
 * Plain C, no Python API: homagg/codec/_native.py loads the built library with ctypes; homagg/codec/_hostops.py
 * uses it and falls back to its numpy (or torch) code when the library is absent (no compiler at
 * install time, or HOMAGG_NATIVE=0) or the input is not a contiguous 32-bit CPU array.  Every
 * function returns exactly what that code returns; tests/test_hostops.py checks the paths against
 * each other and against torch.  homagg_bit_ranks32 and homagg_decode_into32 check the positions
 * they are given and return -1 when one is out of range (homagg_decode_into32 then writes nothing
 * into the result); homagg_gather32 takes positions homagg_set_bits32 listed from the same
 * array's bitmap.
 *
 * popcnt (target_clones, an ifunc) and AVX2 are picked at load / run time: the library is built
 * with plain -O3 and runs on any x86-64; elsewhere the portable loops are compiled.
 *
 * Bitmaps are little-endian words: element i is bit i % 64 of 64-bit word i / 64, i.e. bit i % 8
 * of byte i / 8 -- the layout of np.packbits(..., bitorder="little") and of homagg's int32
 * bitmap words on a little-endian host.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_native_kernels.h"

/* Positions (ascending, int64) of the set bits of n 32-bit bitmap words; pos holds room for every
 * set bit plus 4 (scratch written past the end).  Returns how many were written; with pos NULL
 * only counts them.  Groups of 256 bits without a set bit are skipped with one test (sparse
 * bitmaps), the others decoded a 64-bit word at a time by decode64 (measured, 25M bits: 0.33 ms
 * at 0.1% set, 0.73 ms at 1%, 0.78 ms at 2.5%; a branch per word took 0.34 / 1.77 / 1.26 ms,
 * none 0.82 / 0.82 / 0.88 ms). */
HOMAGG_POPCNT int64_t homagg_set_bits32(const uint32_t *words, int64_t n, int64_t *pos) {
    int64_t k = 0, w = 0;
    if (!pos) {
        for (; w < n; w++)
            k += __builtin_popcount(words[w]);
        return k;
    }
    for (; w + 8 <= n; w += 8) {
        uint64_t q[4];
        memcpy(q, words + w, sizeof q);
        if (!(q[0] | q[1] | q[2] | q[3]))
            continue;
        for (int h = 0; h < 4; h++)
            k += decode64(q[h], (w + 2 * h) * 32, pos + k);
    }
    for (; w < n; w += 2) {
        uint64_t b = words[w];
        if (w + 1 < n)
            b |= (uint64_t)words[w + 1] << 32;
        k += decode64(b, w * 32, pos + k);
    }
    return k;
}

/* For positions pos[0..k) whose bits are set in n 32-bit bitmap words: out[i] = how many set bits
 * come before pos[i] (its slot among the set bits).  Two branch-free passes: the running count
 * before every word (into before[0..n)), then one lookup and one popcount per position.  Returns
 * 0, or -1 (out unspecified) when a position lies outside the words. */
HOMAGG_POPCNT int64_t homagg_bit_ranks32(const uint32_t *words, int64_t n, const int64_t *pos, int64_t k,
                                         int64_t *before, int64_t *out) {
    int64_t run = 0;
    for (int64_t w = 0; w < n; w++) {
        before[w] = run;
        run += __builtin_popcount(words[w]);
    }
    for (int64_t i = 0; i < k; i++) {
        int64_t p = pos[i];
        if (p < 0 || (p >> 5) >= n)
            return -1;
        out[i] = before[p >> 5] + __builtin_popcount(words[p >> 5] & ((1u << (p & 31)) - 1u));
    }
    return 0;
}

/* out[i] = x[pos[i]] for 32-bit elements. */
void homagg_gather32(const uint32_t *x, const int64_t *pos, int64_t k, uint32_t *out) {
    for (int64_t i = 0; i < k; i++)
        out[i] = x[pos[i]];
}

/* out[pos[i]] = (float)sums[i] * factor[pos[i] >> shift] for i < k: the float32 decode of int32
 * grid sums (factor: one exact power of two per block of 2**shift elements, nfactor of them)
 * written straight into the result.  Returns 0, or -1 (nothing written) if a position lies outside
 * [0, n) or its block outside [0, nfactor). */
int64_t homagg_decode_into32(float *out, int64_t n, const int64_t *pos, const int32_t *sums, int64_t k,
                             const float *factor, int64_t nfactor, int shift) {
    for (int64_t i = 0; i < k; i++)
        if ((uint64_t)pos[i] >= (uint64_t)n || (pos[i] >> shift) >= nfactor)
            return -1;
    for (int64_t i = 0; i < k; i++)
        out[pos[i]] = (float)sums[i] * factor[pos[i] >> shift];
    return 0;
}

/* Set bits of the 256-bit group q (four little-endian 64-bit words) below bit o (0 <= o < 256):
 * the whole words below o's word, then the bits of its word below o; no branch. */
static inline __attribute__((always_inline)) int64_t group_rank(const uint64_t q[4], int o) {
    const int full = o >> 6;
    int64_t r = __builtin_popcountll(q[full] & ((1ULL << (o & 63)) - 1));
    for (int h = 0; h < 3; h++)
        r += __builtin_popcountll(q[h]) & -(int64_t)(h < full);
    return r;
}

/* compact's encode: each local nonzero's grid word straight into its slot of the union, i.e.
 * out[bit_ranks32(words, idx)] = quantize_at64(idx, v, ...) without the slot array, the grid array
 * or the scatter.  idx strictly ascending, every bit set in the nwords bitmap words; blocks of
 * 2**bshift elements, nblocks factors (f2 may be NULL); before: room for nwords / 8 + 1 counts;
 * out: nout slots.  A first pass counts the set bits before every 256-bit group, then each
 * position's slot is that count plus a branch-free popcount inside its group; the float64 steps
 * are quantize_at64's: v * f1 (* f2), round half to even, clamp to [-limit, limit].  Returns 0;
 * -1 (nothing written) when the words hold more set bits than nout slots; -1 at the first
 * position that is not ascending, lies outside the bitmap or the factors, or whose bit is clear
 * (out is then partly written: the caller's fresh buffer, discarded). */
static inline __attribute__((always_inline)) int64_t
place64(const int64_t *idx, const double *v, int64_t k, int bshift, const double *f1, const double *f2, int64_t nblocks,
        double limit, const uint32_t *words, int64_t nwords, int64_t *before, int32_t *out, int64_t nout) {
    const int64_t groups = (nwords + 7) / 8;
    uint64_t tail[4] = {0, 0, 0, 0}; /* the last group, zero past the bitmap */
    memcpy(tail, words + 8 * (groups - 1), (size_t)(nwords - 8 * (groups - 1)) * sizeof(uint32_t));
    int64_t run = 0;
    for (int64_t g = 0; g < groups; g++) {
        uint64_t q[4];
        memcpy(q, g + 1 < groups ? (const void *)(words + 8 * g) : (const void *)tail, sizeof q);
        before[g] = run;
        run += __builtin_popcountll(q[0]) + __builtin_popcountll(q[1]) + __builtin_popcountll(q[2]) +
               __builtin_popcountll(q[3]);
    }
    if (run > nout)
        return -1;
    int64_t last = -1;
    for (int64_t i = 0; i < k; i++) {
        const int64_t p = idx[i], g = p >> 8, b = p >> bshift;
        if (p <= last || (p >> 5) >= nwords || b >= nblocks || !((words[p >> 5] >> (p & 31)) & 1u))
            return -1;
        last = p;
        uint64_t q[4];
        memcpy(q, g + 1 < groups ? (const void *)(words + 8 * g) : (const void *)tail, sizeof q);
        double x = v[i] * f1[b];
        if (f2)
            x *= f2[b];
        x = nearbyint(x);
        x = x < -limit ? -limit : x;
        x = x > limit ? limit : x;
        out[before[g] + group_rank(q, (int)(p & 255))] = (int32_t)x;
    }
    return 0;
}

#ifdef HOMAGG_X86
/* popcnt and roundsd (SSE4.1) inline: without them each popcount and nearbyint is a call */
__attribute__((target("popcnt,sse4.2"))) static int64_t place64_v2(const int64_t *idx, const double *v, int64_t k,
                                                                   int bshift, const double *f1, const double *f2,
                                                                   int64_t nblocks, double limit, const uint32_t *words,
                                                                   int64_t nwords, int64_t *before, int32_t *out,
                                                                   int64_t nout) {
    return place64(idx, v, k, bshift, f1, f2, nblocks, limit, words, nwords, before, out, nout);
}
#endif

int64_t homagg_quantize_place64(const int64_t *idx, const double *v, int64_t k, int bshift, const double *f1,
                                const double *f2, int64_t nblocks, double limit, const uint32_t *words, int64_t nwords,
                                int64_t *before, int32_t *out, int64_t nout) {
    if (k == 0 || nwords == 0)
        return k ? -1 : 0;
#ifdef HOMAGG_X86
    if (__builtin_cpu_supports("popcnt") && __builtin_cpu_supports("sse4.2"))
        return place64_v2(idx, v, k, bshift, f1, f2, nblocks, limit, words, nwords, before, out, nout);
#endif
    return place64(idx, v, k, bshift, f1, f2, nblocks, limit, words, nwords, before, out, nout);
}

/* compact's decode: out[p] = (float)sums[j] * factor[p >> shift] for the j-th set bit p of the
 * nwords bitmap words, i.e. homagg_decode_into32(out, set_bits32(words), ...) with the positions
 * listed a batch of 64 Ki bits at a time into pos (room for 65536 + 4; it stays in cache) instead
 * of a union-sized array; the writes of a batch then run as decode_into32's.  Returns 0, or -1
 * (nothing written) when the words hold other than nsums set bits, a set bit lies at or past n, or
 * its block outside the nfactor factors. */
HOMAGG_POPCNT int64_t homagg_decode_bits32(float *out, int64_t n, const uint32_t *words, int64_t nwords,
                                           const int32_t *sums, int64_t nsums, const float *factor, int64_t nfactor,
                                           int shift, int64_t *pos) {
    int64_t count = 0, top = -1;
    for (int64_t w = 0; w < nwords; w++)
        count += __builtin_popcount(words[w]);
    for (int64_t w = nwords - 1; w >= 0; w--)
        if (words[w]) {
            top = 32 * w + 31 - __builtin_clz(words[w]);
            break;
        }
    if (count != nsums || top >= n || (top >= 0 && (top >> shift) >= nfactor))
        return -1;
    const int64_t batch = 2048; /* words: 65536 bits */
    for (int64_t w0 = 0, j = 0; w0 < nwords; w0 += batch) {
        const int64_t m = homagg_set_bits32(words + w0, nwords - w0 < batch ? nwords - w0 : batch, pos);
        const int64_t base = 32 * w0;
        const int32_t *s = sums + j;
        for (int64_t i = 0; i < m; i++) {
            const int64_t p = base + pos[i];
            out[p] = (float)s[i] * factor[p >> shift];
        }
        j += m;
    }
    return 0;
}

/* Two-level bitmaps without listing the held words (homagg/codec/_bitmap.py): the words of src
 * whose bit is set in mask, in order (out: room for their count + 1, one scratch word; returns the
 * count), and back: out[j] = the next of vals where bit j of mask is set, else 0, for j < nout
 * (returns -1, nothing written, unless mask holds exactly nvals set bits below nout).  Branch-free:
 * every word is written, the index advances by the bit. */
int64_t homagg_select_bits32(const uint32_t *mask, const int32_t *src, int64_t nsrc, int32_t *out) {
    int64_t k = 0;
    for (int64_t j = 0; j < nsrc; j++) {
        out[k] = src[j];
        k += (mask[j >> 5] >> (j & 31)) & 1u;
    }
    return k;
}

HOMAGG_POPCNT int64_t homagg_place_bits32(const uint32_t *mask, const int32_t *vals, int64_t nvals, int32_t *out,
                                          int64_t nout) {
    int64_t count = 0;
    for (int64_t w = 0; w < nout / 32; w++)
        count += __builtin_popcount(mask[w]);
    if (nout % 32)
        count += __builtin_popcount(mask[nout / 32] & ((1u << (nout % 32)) - 1u));
    if (count != nvals)
        return -1;
    int64_t k = 0;
    const int64_t last = nvals ? nvals - 1 : 0;
    const int32_t none = 0;
    const int32_t *v = nvals ? vals : &none;
    for (int64_t j = 0; j < nout; j++) {
        const uint32_t bit = (mask[j >> 5] >> (j & 31)) & 1u;
        const int32_t x = v[k < last ? k : last];
        out[j] = bit ? x : 0;
        k += bit;
    }
    return 0;
}
