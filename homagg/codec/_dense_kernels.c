/* homagg's dense fixed-point kernels: the three whole-tensor passes of a dense float32 call, each
 * one pass over memory with no temporaries (homagg/codec/_blocks.py's torch code makes 2-6 passes and
 * allocates a tensor-sized temporary per step, which on a VM mostly costs page faults).
 *
 *   homagg_block_peaks32  per block of bs elements, the bits of its largest |x|: an IEEE float's
 *                         magnitude orders as its bits do, so max(bits & 0x7FFFFFFF) is max |x|,
 *                         and a NaN or Inf shows as a peak >= 0x7F800000 (returned as 1).
 *   homagg_quantize32     out[i] = (int32)clamp(nearbyintf(x[i] * f1[b] (* f2[b])), -limit, limit)
 *                         with b = i / bs: the float32 grid words of _blocks.quantize, the same
 *                         float32 multiplications in the same order, round-half-even, the same clamp.
 *   homagg_fill_quantize32  the words of homagg_quantize32 at [off, off + n), big-endian, into a
 *                         datagram's payload: the transport's native datapath calls it per chunk
 *                         (homagg/transport/_base.py WordSource), so the dense words never exist
 *                         as a tensor; the same float32 operations, so the same words.
 *   homagg_quantize_at64  out[i] = clamp(round_half_even(v[i] * f1[b] (* f2[b])), -limit, limit),
 *                         b = idx[i] / bs: float64 values at sorted flat positions (compact's and
 *                         sketch's local nonzeros), the products in float64 as the torch code does.
 *   homagg_block_peaks_at64  per block of 2**bshift elements, the largest |v| of the float64 values
 *                         at flat positions idx (compact's and sketch's local nonzeros): the
 *                         scatter-amax of _fixedpoint.block_exponents, and whether a value is NaN
 *                         or +-Inf, in one pass.
 *   homagg_dequantize32   out[i] = (float)sums[i] * factor[b]: int32 -> float32 rounds once (to
 *                         nearest even, as torch's copy_), the power-of-two factor is exact;
 *                         returns how many sums are nonzero (the result's union, in the same pass).
 *   homagg_quantize32_wide  wide words (two per value): q = clamp(nearbyintf(x[i] * f1[b] (* f2[b])),
 *                         -limit, limit) as homagg_quantize32 (|q| < 2**47, an integer in float32),
 *                         then out[2i] = q & 0xFFFF and out[2i+1] = q >> 16 (the limbs; the torch
 *                         code splits in float32, exactly: floor(q * 2**-16) and the remainder).
 *   homagg_dequantize_wide  out[i] = (float)(((double)sums[2i+1] * 65536 + sums[2i]) * f1[b] (* f2[b])):
 *                         the exact grid sum in float64 (|.| < 2**47), the power-of-two factors
 *                         in float64 as the torch code applies them, one rounding to float32;
 *                         returns how many elements have a nonzero word (the torch code's union).
 *
 * Plain C, loaded with ctypes by homagg/codec/_native.py and compiled into the same library as
 * homagg/codec/_native_kernels.c (setup.py).  Every loop is written once and compiled twice
 * (target_clones: AVX2, SSE4.1 and baseline x86-64, picked at load); no -ffast-math anywhere, so the
 * vectorised loops compute the IEEE operations the scalar ones do.  tests/test_dense_kernels.py
 * checks each kernel bit for bit against the torch code.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define HOMAGG_CLONES __attribute__((target_clones("avx2", "sse4.1", "default")))
#else
#define HOMAGG_CLONES
#endif

HOMAGG_CLONES int64_t homagg_block_peaks32(const uint32_t *x, int64_t n, int64_t bs, uint32_t *peak) {
    uint32_t worst = 0;
    for (int64_t b = 0, i0 = 0; i0 < n; b++, i0 += bs) {
        const int64_t end = i0 + bs < n ? i0 + bs : n;
        uint32_t m = 0;
        for (int64_t i = i0; i < end; i++) {
            const uint32_t v = x[i] & 0x7FFFFFFFu;
            m = v > m ? v : m;
        }
        peak[b] = m;
        worst = m > worst ? m : worst;
    }
    return worst >= 0x7F800000u;
}

static inline float clamp_limit(float v, float limit) {
    v = v < -limit ? -limit : v;
    return v > limit ? limit : v;
}

HOMAGG_CLONES void homagg_quantize32(const float *x, int64_t n, int64_t bs, const float *f1, const float *f2,
                                     float limit, int32_t *out) {
    for (int64_t b = 0, i0 = 0; i0 < n; b++, i0 += bs) {
        const int64_t end = i0 + bs < n ? i0 + bs : n;
        const float a = f1[b];
        if (f2) {
            const float c = f2[b];
            for (int64_t i = i0; i < end; i++)
                out[i] = (int32_t)clamp_limit(nearbyintf((x[i] * a) * c), limit);
        } else {
            for (int64_t i = i0; i < end; i++)
                out[i] = (int32_t)clamp_limit(nearbyintf(x[i] * a), limit);
        }
    }
}

/* homagg_fill_quantize32's context (homagg/codec/_dense_source.py _QuantCtx mirrors it). */
typedef struct {
    const float *x;      /* the stream's float32 elements */
    const float *f1, *f2;  /* per block factors (f2 NULL: 1 everywhere) */
    float limit;
    int64_t bs;          /* elements per block */
} hg_quant_src;

HOMAGG_CLONES void homagg_fill_quantize32(const hg_quant_src *q, uint8_t *dst, int64_t off, int64_t n) {
    const float *x = q->x;
    const float limit = q->limit;
    for (int64_t i = 0; i < n;) {
        const int64_t b = (off + i) / q->bs;
        int64_t end = (b + 1) * q->bs - off;
        end = end < n ? end : n;
        /* without f2 the second factor is 1.0f: IEEE multiplication by one is exact, so the words
         * are homagg_quantize32's, which skips that multiplication */
        const float a = q->f1[b], c = q->f2 ? q->f2[b] : 1.0f;
        for (; i < end; i++) {
            const uint32_t w = __builtin_bswap32((uint32_t)(int32_t)clamp_limit(nearbyintf((x[off + i] * a) * c), limit));
            memcpy(dst + 4 * i, &w, 4);
        }
    }
}

HOMAGG_CLONES void homagg_quantize_at64(const int64_t *idx, const double *v, int64_t k, int64_t bs,
                                        const double *f1, const double *f2, double limit, int32_t *out) {
    for (int64_t i = 0; i < k; i++) {
        const int64_t b = idx[i] / bs;
        double x = v[i] * f1[b];
        if (f2)
            x *= f2[b];
        x = nearbyint(x);
        out[i] = (int32_t)(x < -limit ? -limit : (x > limit ? limit : x));
    }
}

HOMAGG_CLONES int64_t homagg_dequantize32(const int32_t *sums, int64_t n, int64_t bs, const float *factor, float *out) {
    int64_t nonzero = 0;
    for (int64_t b = 0, i0 = 0; i0 < n; b++, i0 += bs) {
        const int64_t end = i0 + bs < n ? i0 + bs : n;
        const float f = factor[b];
        for (int64_t i = i0; i < end; i++) {
            out[i] = (float)sums[i] * f;
            nonzero += sums[i] != 0;
        }
    }
    return nonzero;
}

/* peak[b] = max |v[i]| over the i with idx[i] >> bshift == b (0.0 where none), for b < nblocks.
 * Returns 0, 1 when some value is NaN or +-Inf (the peaks are then not to be used), or -1 when a
 * position lies outside [0, n) or its block outside [0, nblocks) (peak unspecified). */
HOMAGG_CLONES int64_t homagg_block_peaks_at64(const int64_t *idx, const double *v, int64_t k, int64_t n, int bshift,
                                              int64_t nblocks, double *peak) {
    for (int64_t b = 0; b < nblocks; b++)
        peak[b] = 0.0;
    int64_t bad = 0;
    for (int64_t i = 0; i < k; i++) {
        const int64_t b = idx[i] >> bshift;
        if (idx[i] < 0 || idx[i] >= n || b >= nblocks)
            return -1;
        const double a = fabs(v[i]);
        bad |= !(a <= DBL_MAX);
        peak[b] = a > peak[b] ? a : peak[b];
    }
    return bad;
}

HOMAGG_CLONES void homagg_quantize32_wide(const float *x, int64_t n, int64_t bs, const float *f1, const float *f2,
                                          float limit, int32_t *out) {
    for (int64_t b = 0, i0 = 0; i0 < n; b++, i0 += bs) {
        const int64_t end = i0 + bs < n ? i0 + bs : n;
        /* without f2 the second factor is 1.0f: multiplying by one is exact (homagg_fill_quantize32) */
        const float a = f1[b], c = f2 ? f2[b] : 1.0f;
        for (int64_t i = i0; i < end; i++) {
            const int64_t q = (int64_t)clamp_limit(nearbyintf((x[i] * a) * c), limit);
            out[2 * i] = (int32_t)(q & 0xFFFF);
            out[2 * i + 1] = (int32_t)(q >> 16); /* arithmetic: floor(q / 2**16) */
        }
    }
}

HOMAGG_CLONES int64_t homagg_dequantize_wide(const int32_t *sums, int64_t n, int64_t bs, const double *f1,
                                             const double *f2, float *out) {
    int64_t nonzero = 0;
    for (int64_t b = 0, i0 = 0; i0 < n; b++, i0 += bs) {
        const int64_t end = i0 + bs < n ? i0 + bs : n;
        const double a = f1[b];
        for (int64_t i = i0; i < end; i++) {
            const int32_t low = sums[2 * i], high = sums[2 * i + 1];
            double v = ((double)high * 65536.0 + (double)low) * a;
            if (f2)
                v *= f2[b];
            out[i] = (float)v;
            nonzero += (low | high) != 0;
        }
    }
    return nonzero;
}
