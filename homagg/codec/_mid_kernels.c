/* The mid-size steady call's encode and decode (homagg/codec/_mid.py; wrapped by
 * homagg/codec/_mid_native.py): the general path's steady dense steps on one float32 CPU tensor, in
 * two C calls instead of a dozen Python ones, each step the library's own kernel:
 *
 *   homagg_mid_encode  homagg_block_peaks32 (and the refusal of NaN/Inf), each block's frexp
 *                      exponent into the round's exponents array (EMPTY for a block of zeros:
 *                      _host_factors.frexp_exponents32), homagg_guess32 (the guess, its negation
 *                      into the round's guess array), the grid factors of the guess
 *                      (_host_factors.grid_factors32) and homagg_quantize32 (or _wide) into the
 *                      round's values array;
 *   homagg_mid_decode  homagg_settle32 (the blocks to redo, the decode exponents, the counts
 *                      behind ``changed``); where no block is redone and every decode factor is a
 *                      normal float32 (_host_factors.decode_factors32), homagg_dequantize32 into
 *                      the tensor and its count of nonzero sums.  Otherwise it writes nothing and
 *                      says which: the caller runs the Python steps (the redo round, the float64
 *                      decode), which are these steps' reference.
 *
 * Invariant: the words, exponents, results and counts are those of the Python steps bit for bit
 * (the same kernels; the factors' integer arithmetic is the numpy code's): tests/test_mid_calls.py.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define EMPTY INT32_MIN

int64_t homagg_block_peaks32(const uint32_t *x, int64_t n, int64_t bs, uint32_t *peak);
void homagg_quantize32(const float *x, int64_t n, int64_t bs, const float *f1, const float *f2, float limit,
                       int32_t *out);
void homagg_quantize32_wide(const float *x, int64_t n, int64_t bs, const float *f1, const float *f2, float limit,
                            int32_t *out);
int64_t homagg_dequantize32(const int32_t *sums, int64_t n, int64_t bs, const float *factor, float *out);
void homagg_guess32(const int32_t *prev, const int32_t *local, int64_t n, int64_t raise_by, int32_t *guess,
                    int32_t *negated);
void homagg_settle32(const int32_t *agreed, const int32_t *mng, int64_t n, int64_t slack, uint8_t *bad,
                     int32_t *exponents, const int32_t *prev, int64_t raise_by, int64_t *counts);

typedef struct {
    /* the signature's, set once */
    int64_t n;          /* elements */
    int64_t block_size;
    int64_t blocks;
    int32_t limbs;      /* 1, or 2 (wide words) */
    int32_t p;          /* the grid's precision P */
    int64_t raise_by;   /* the guess's margin */
    int64_t slack;      /* the window */
    float limit;        /* the float32 clamp */
    /* scratch, blocks each (the caller's arrays) */
    uint32_t *peak;
    int32_t *guess;
    float *f1, *f2, *factor;
    uint8_t *bad;
    int32_t *exps;      /* the decode exponents */
    /* the round's arrays */
    int32_t *head;      /* the MAX descriptor sent: the template copied in */
    const int32_t *head_tpl;
    int64_t head_len;
    int32_t *local;     /* the exponents stream sent */
    int32_t *negated;   /* the guess stream sent */
    int32_t *words;     /* the values stream sent */
    const int32_t *agreed;  /* the combined exponents */
    const int32_t *mng;     /* the combined negated guesses */
    const int32_t *sums;    /* the combined values */
    /* the call's */
    const float *src;
    float *dst;
    const int32_t *previous; /* the exponents the last call agreed */
    /* results */
    int64_t union_count;
    int64_t held, moved;     /* settle's counts: blocks held in both calls, those outside the window */
} hg_mid_call;

static inline uint32_t float_bits(int32_t biased) { return (uint32_t)biased << 23; }

/* 0: the round's arrays written; -1: a NaN or an infinity (nothing written). */
int homagg_mid_encode(hg_mid_call *c) {
    const int64_t nb = c->blocks;
    if (homagg_block_peaks32((const uint32_t *)c->src, c->n, c->block_size, c->peak))
        return -1;
    for (int64_t b = 0; b < nb; b++) {
        float peak;
        memcpy(&peak, &c->peak[b], sizeof peak);
        int e = 0;
        if (peak != 0.0f)
            frexp((double)peak, &e);
        c->local[b] = peak != 0.0f ? (int32_t)e : EMPTY;
    }
    homagg_guess32(c->previous, c->local, nb, c->raise_by, c->guess, c->negated);
    /* grid_factors32: biased = P + 127 - E (int32, wrapping as numpy's), 127 for EMPTY */
    int normal = 1;
    for (int64_t b = 0; b < nb; b++) {
        int32_t e = c->guess[b];
        int32_t biased = e == EMPTY ? 127 : (int32_t)((uint32_t)(c->p + 127) - (uint32_t)e);
        c->exps[b] = biased; /* scratch until decode */
        normal &= biased >= 1 && biased <= 254;
    }
    const float *f2 = 0;
    if (normal) {
        for (int64_t b = 0; b < nb; b++) {
            uint32_t bits = float_bits(c->exps[b]);
            memcpy(&c->f1[b], &bits, sizeof bits);
        }
    } else { /* _split(biased - 127, 126): first in [-126, 127], the rest likewise */
        int rest_any = 0;
        for (int64_t b = 0; b < nb; b++) {
            int32_t shift = c->exps[b] - 127;
            int32_t first = shift < -126 ? -126 : (shift > 127 ? 127 : shift);
            int32_t rest = shift - first;
            rest_any |= rest != 0;
            rest = rest < -126 ? -126 : (rest > 127 ? 127 : rest);
            uint32_t a = float_bits(first + 127), r = float_bits(rest + 127);
            memcpy(&c->f1[b], &a, sizeof a);
            memcpy(&c->f2[b], &r, sizeof r);
        }
        f2 = rest_any ? c->f2 : 0;
    }
    if (c->limbs == 1)
        homagg_quantize32(c->src, c->n, c->block_size, c->f1, f2, c->limit, c->words);
    else
        homagg_quantize32_wide(c->src, c->n, c->block_size, c->f1, f2, c->limit, c->words);
    memcpy(c->head, c->head_tpl, (size_t)c->head_len * sizeof(int32_t));
    return 0;
}

/* 0: the results written to dst (union_count, held, moved set); 1: a block to redo; 2: a decode
 * factor outside float32's normal range, or wide words (the float64 decode); on 1 and 2 nothing is
 * written to dst (held and moved are set). */
int homagg_mid_decode(hg_mid_call *c) {
    const int64_t nb = c->blocks;
    int64_t counts[2] = {0, 0};
    homagg_settle32(c->agreed, c->mng, nb, c->slack, c->bad, c->exps, c->previous, c->raise_by, counts);
    c->held = counts[0];
    c->moved = counts[1];
    for (int64_t b = 0; b < nb; b++)
        if (c->bad[b])
            return 1;
    if (c->limbs != 1)
        return 2;
    /* decode_factors32: biased = E + 127 - P (int32, wrapping), 127 for EMPTY */
    for (int64_t b = 0; b < nb; b++) {
        int32_t e = c->exps[b];
        int32_t biased = e == EMPTY ? 127 : (int32_t)((uint32_t)e + (uint32_t)(127 - c->p));
        if (biased < 1 || biased > 254)
            return 2;
        uint32_t bits = float_bits(biased);
        memcpy(&c->factor[b], &bits, sizeof bits);
    }
    c->union_count = homagg_dequantize32(c->sums, c->n, c->block_size, c->factor, c->dst);
    return 0;
}
