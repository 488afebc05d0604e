/* homagg's per-block exponent kernels: a steady call's guess and its settling, each one C call over
 * the one-per-block int32 exponents (homagg/codec/_exponents.py's numpy path makes 16-20 numpy calls
 * for them, each a few microseconds with cold caches right after a round's wait).
 *
 *   homagg_guess32   guess[i] = local[i] where prev[i] or local[i] is EMPTY, else
 *                    max(prev[i] + raise_by, local[i]) in int64 wrapped to int32 (modulo 2**32);
 *                    negated[i] = -guess[i] modulo 2**32 (EMPTY stays EMPTY): _np_guess and
 *                    _np_negated.
 *   homagg_settle32  with held = agreed[i] != EMPTY and s = mng[i] + agreed[i] in int64:
 *                    bad[i] = held && (s > 0 || s < -slack); exponents[i] = -mng[i] modulo 2**32
 *                    where held && !bad, else agreed[i] (_np_settle); with prev given, counts[0] =
 *                    blocks held in both calls and counts[1] = those with t = agreed - prev (int64)
 *                    outside [raise_by - slack, raise_by] (_np_outside's two count_nonzero).
 *
 * The int64 intermediates are exact for every int32 input while |raise_by| and |slack| stay below
 * 2**62 (homagg/codec/_native.py checks that, else the numpy path runs).  Plain C, loaded with
 * ctypes by homagg/codec/_native.py, compiled into the same library as _native_kernels.c
 * (setup.py); tests/test_exponents_native.py checks both kernels bit for bit against the numpy
 * and torch paths.
 */
#include <stdint.h>

#define HOMAGG_EMPTY_EXPONENT INT32_MIN

static inline int32_t wrap32(int64_t x) { return (int32_t)(uint32_t)(uint64_t)x; }

static inline int32_t negate32(int32_t x) { return (int32_t)(0u - (uint32_t)x); }

void homagg_guess32(const int32_t *prev, const int32_t *local, int64_t n, int64_t raise_by, int32_t *guess,
                    int32_t *negated) {
    for (int64_t i = 0; i < n; i++) {
        int32_t p = prev[i], l = local[i], g = l;
        if (p != HOMAGG_EMPTY_EXPONENT && l != HOMAGG_EMPTY_EXPONENT) {
            int64_t raised = (int64_t)p + raise_by;
            g = wrap32(raised > (int64_t)l ? raised : (int64_t)l);
        }
        guess[i] = g;
        negated[i] = negate32(g);
    }
}

void homagg_settle32(const int32_t *agreed, const int32_t *mng, int64_t n, int64_t slack, uint8_t *bad,
                     int32_t *exponents, const int32_t *prev, int64_t raise_by, int64_t *counts) {
    for (int64_t i = 0; i < n; i++) {
        int32_t a = agreed[i];
        int held = a != HOMAGG_EMPTY_EXPONENT;
        int64_t s = (int64_t)mng[i] + a;
        int b = held && (s > 0 || s < -slack);
        bad[i] = (uint8_t)b;
        exponents[i] = held && !b ? negate32(mng[i]) : a;
    }
    if (prev == 0)
        return;
    int64_t both = 0, moved = 0, low = raise_by - slack;
    for (int64_t i = 0; i < n; i++) {
        int32_t a = agreed[i], p = prev[i];
        int held = a != HOMAGG_EMPTY_EXPONENT && p != HOMAGG_EMPTY_EXPONENT;
        int64_t t = (int64_t)a - p;
        both += held;
        moved += held && (t > raise_by || t < low);
    }
    counts[0] = both;
    counts[1] = moved;
}
