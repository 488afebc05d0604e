/* The steady small call's encode and decode in C (homagg/codec/_small.py, _Steady; wrapped by
 * homagg/codec/_small_native.py): a tensor of at most one block read from its own memory and
 * written back there, the words in the port's own arrays.  One struct argument per call (ctypes
 * converts one pointer, not a dozen numbers).
 *
 * Invariant: the words, exponents and values are those of homagg/codec/_small_grid.py's Python
 * arithmetic (local_exponent, quantize, decode), bit for bit: frexp's exponent of the largest |x|;
 * round half to even (nearbyint in the default rounding mode, as Python's round of a float) of
 * x * 2**(P - guess), clamped to +-limit; the two limbs (q & 0xFFFF, q >> 16); the decoded value
 * the exact integer sum times 2**(used - P) in double, stored as the dtype by C's cast (numpy's
 * float64 -> float32 assignment).  tests/test_small_native.py compares both on random inputs.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EMPTY INT32_MIN /* the exponent of a block without a nonzero (MAX's identity) */

typedef struct {
    /* the signature's, set once */
    int64_t n;        /* elements */
    int32_t limbs;    /* int32 words per element: 1 or 2 */
    int32_t is64;     /* the tensor holds doubles (else floats) */
    int32_t p;        /* the grid's precision P */
    int32_t raise_by; /* the guess's margin above the previous exponent */
    int64_t limit;    /* the clamp */
    int64_t slack;    /* the window: a guess in [agreed, agreed + slack] is used */
    const int32_t *head_tpl; /* the descriptor's words and two spare words (head_len) */
    int64_t head_len;
    /* the call's */
    const void *src;  /* the tensor's elements (encode) */
    void *dst;        /* ... where the results go (decode) */
    int32_t previous; /* the exponent the last call agreed (EMPTY: none nonzero) */
    int32_t *head;    /* the MAX array sent: the template, then local and -guess */
    int32_t *words;   /* the ADD array sent: n * limbs words */
    const int32_t *head_out; /* the combined MAX array (head_len words) */
    const int32_t *sums;     /* the combined ADD array */
    /* results */
    int32_t local;    /* encode: frexp exponent of the largest |x| (EMPTY for all zeros) */
    int32_t guess;    /* encode: the exponent the words are quantised under */
    int32_t agreed;   /* decode: the combined local exponents' MAX */
    int32_t nonfinite; /* encode: elements that are NaN or infinite (then nothing is written) */
    int64_t union_count; /* decode: elements with a nonzero combined word */
} hg_small_call;

static inline double element(const hg_small_call *c, int64_t i) {
    return c->is64 ? ((const double *)c->src)[i] : (double)((const float *)c->src)[i];
}

/* 0: head and words written; -1: a non-finite element (nonfinite counts them; nothing written). */
int homagg_small_encode(hg_small_call *c) {
    double peak = 0.0;
    int32_t bad = 0;
    for (int64_t i = 0; i < c->n; i++) {
        double a = fabs(element(c, i));
        if (!isfinite(a))
            bad++;
        else if (a > peak)
            peak = a;
    }
    c->nonfinite = bad;
    if (bad)
        return -1;
    int e = 0;
    int32_t local = EMPTY;
    if (peak != 0.0) {
        frexp(peak, &e);
        local = e;
    }
    int32_t guess = local;
    if (local != EMPTY && c->previous != EMPTY) {
        int64_t raised = (int64_t)c->previous + c->raise_by;
        if (raised > local)
            guess = (int32_t)raised;
    }
    c->local = local;
    c->guess = guess;
    int shift = guess == EMPTY ? 0 : c->p - guess;
    double limit = (double)c->limit;
    for (int64_t i = 0; i < c->n; i++) {
        double q = nearbyint(ldexp(element(c, i), shift));
        if (q < -limit)
            q = -limit;
        else if (q > limit)
            q = limit;
        int64_t v = (int64_t)q;
        if (c->limbs == 1) {
            c->words[i] = (int32_t)v;
        } else {
            c->words[2 * i] = (int32_t)(v & 0xFFFF);
            c->words[2 * i + 1] = (int32_t)(v >> 16); /* arithmetic: Python's floor shift */
        }
    }
    memcpy(c->head, c->head_tpl, (size_t)c->head_len * sizeof(int32_t));
    c->head[c->head_len - 2] = local;
    c->head[c->head_len - 1] = guess == EMPTY ? EMPTY : -guess;
    return 0;
}

/* 0: the values written to dst (agreed, union_count set); 1: the guess missed the agreed window
 * (agreed set, nothing written: the caller redoes the round under agreed). */
int homagg_small_decode(hg_small_call *c) {
    int32_t agreed = c->head_out[c->head_len - 2];
    int64_t used = -(int64_t)c->head_out[c->head_len - 1];
    c->agreed = agreed;
    if (agreed == EMPTY)
        used = EMPTY;
    else if (used < agreed || used > (int64_t)agreed + c->slack)
        return 1;
    int shift = used == EMPTY ? 0 : (int)(used - c->p);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < c->n; i++) {
        int64_t s;
        if (c->limbs == 1) {
            s = c->sums[i];
            nonzero += s != 0;
        } else {
            int32_t lo = c->sums[2 * i], hi = c->sums[2 * i + 1];
            s = (int64_t)hi * 65536 + lo;
            nonzero += (lo | hi) != 0;
        }
        double v = ldexp((double)s, shift);
        if (c->is64)
            ((double *)c->dst)[i] = v;
        else
            ((float *)c->dst)[i] = (float)v;
    }
    c->union_count = nonzero;
    return 0;
}
