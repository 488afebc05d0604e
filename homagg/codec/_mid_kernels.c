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

/* homagg_settle32 and the decode factors: 0 (factor set for every block), 1 (a block to redo) or 2
 * (a decode factor outside float32's normal range, or wide words); held and moved set on all three. */
static int settle_factors(hg_mid_call *c) {
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
    return 0;
}

/* homagg_dequantize32 of elements [lo, hi) (any bounds: a block cut by them decodes its part with
 * its factor, element by element the same operation): the count of nonzero sums among them. */
static int64_t dequantize_range(const hg_mid_call *c, const int32_t *sums, int64_t lo, int64_t hi) {
    const int64_t bs = c->block_size;
    int64_t nonzero = 0;
    while (lo < hi) {
        const int64_t b = lo / bs, end = (b + 1) * bs < hi ? (b + 1) * bs : hi;
        nonzero += homagg_dequantize32(sums + lo, end - lo, bs, c->factor + b, c->dst + lo);
        lo = end;
    }
    return nonzero;
}

/* 0: the results written to dst (union_count, held, moved set); 1: a block to redo; 2: a decode
 * factor outside float32's normal range, or wide words (the float64 decode); on 1 and 2 nothing is
 * written to dst (held and moved are set). */
int homagg_mid_decode(hg_mid_call *c) {
    const int rc = settle_factors(c);
    if (rc)
        return rc;
    c->union_count = homagg_dequantize32(c->sums, c->n, c->block_size, c->factor, c->dst);
    return 0;
}

/* The decode of a round's values chunks while later ones are in flight (the round's results hook,
 * homagg/transport/_fastpath.h hg_results_fn; homagg/codec/_mid.py passes it to OwnRound.run).
 * The round's streams are [descriptor, exponents, guess, values] (stream VALUES).  Once stream 0 is
 * verified and every chunk of the first three completed, the hook settles (the same steps as
 * homagg_mid_decode, on the round's output arrays); where that settles with no block to redo and
 * float32 factors (state DECODING), every values chunk completed from the lowest not yet decoded up
 * is decoded into dst, in chunk order, as its results come; else (state REFUSED) it writes nothing
 * and the call decodes after the round as before.  homagg_mid_finish decodes the chunks left.
 *
 * Invariant: dst's elements are written only with their final results (a chunk completed at this
 * rank holds the switch's combined words, final; a block to redo is never decoded here), and the
 * call's result, union and counts are homagg_mid_decode's bit for bit (the same factors, the same
 * per-element operation; tests/test_mid_calls.py). */
enum { VALUES = 3, WAITING = 0, DECODING = 1, REFUSED = 2 };

typedef struct {
    hg_mid_call *call;
    /* per round (reset by the caller: state WAITING, next 0, union_count 0, sums NULL) */
    int64_t state;
    int64_t next;            /* chunk id of the lowest values chunk not decoded yet (0: not known) */
    int64_t first;           /* chunk id of the values stream's first chunk (0: not known) */
    int64_t union_count;     /* nonzero sums among the decoded chunks */
    const int32_t *sums;     /* the round's values output the hook decoded from */
    const int32_t *off, *wc; /* the round's chunk table (the hook's arguments) */
    int64_t total;
} hg_mid_sink;

/* Decode the values chunks from k->next up to (not including) chunk ``end``. */
static void decode_chunks(hg_mid_sink *k, int64_t end) {
    for (int64_t i = k->next; i < end; i++)
        k->union_count += dequantize_range(k->call, k->sums, k->off[i], k->off[i] + k->wc[i]);
    if (end > k->next)
        k->next = end;
}

void homagg_mid_results(hg_mid_sink *k, int32_t *const *out, const int32_t *stream, const int32_t *off,
                        const int32_t *wc, const uint8_t *completed, int64_t total, int64_t verified) {
    hg_mid_call *c = k->call;
    if (k->state == WAITING) {
        if (!verified)
            return;
        int64_t first = 0;
        for (; first < total && stream[first] < VALUES; first++)
            if (!completed[first])
                return;
        c->agreed = out[1];
        c->mng = out[2];
        c->sums = k->sums = out[VALUES];
        k->off = off;
        k->wc = wc;
        k->total = total;
        k->next = k->first = first;
        k->state = settle_factors(c) == 0 ? DECODING : REFUSED;
    }
    if (k->state != DECODING)
        return;
    int64_t end = k->next;
    while (end < total && completed[end])
        end++;
    decode_chunks(k, end);
}

/* After the round, with the call's agreed/mng/sums bound to the round's results: where the hook
 * decoded from these very results, the values chunks it left (chunk ids next .. total) and 0
 * (union_count the whole count); else homagg_mid_decode (a fallback's results are other arrays). */
int homagg_mid_finish(hg_mid_sink *k) {
    hg_mid_call *c = k->call;
    if (k->state != DECODING || k->sums != c->sums)
        return homagg_mid_decode(c);
    decode_chunks(k, k->total);
    c->union_count = k->union_count;
    return 0;
}
