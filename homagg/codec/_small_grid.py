"""The small-call path's scalar arithmetic (:mod:`homagg.codec._small`): the grid of one block
(:mod:`homagg.codec._fixedpoint`), quantising and decoding on Python numbers (at most ``SCALAR``
elements) or numpy arrays, and the history's one-word exponent tensors.

Invariant: these compute the general path's integers (:func:`homagg.codec._blocks.quantize`,
:func:`~homagg.codec._blocks.dequantize_into`): the float32 and float64 grid steps are exact
power-of-two scalings followed by one round-half-even, so Python's float64 arithmetic gives the same
words and the same float64 values (``tests/test_small_calls.py``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from .._errors import NonFiniteError
from ._fixedpoint import EMPTY_EXPONENT, guess_slack, precision_bits
from ._history import Agreed

__all__ = ["EMPTY", "exponent_tensor", "previous_exponent", "changed_figure", "grid", "local_exponent", "quantize",
           "dequantize", "nonzero_rows", "decode"]

EMPTY = EMPTY_EXPONENT
#: 1-element int32 exponent tensors for the history, one per exponent (never mutated)
_EXPONENTS: dict[int, torch.Tensor] = {}
#: ... and their values, by the tensor's id (the tensors above live as long as the module)
_VALUES: dict[int, int] = {}


def exponent_tensor(e: int) -> torch.Tensor:
    t = _EXPONENTS.get(e)
    if t is None:
        t = _EXPONENTS[e] = torch.tensor([e], dtype=torch.int32)
        _VALUES[id(t)] = e
    return t


def previous_exponent(prior: Agreed | None) -> int | None:
    """The exponent ``prior`` agreed (None where there is none or it is not one block's)."""
    held = prior.exponents if prior is not None else None
    if held is None:
        return None
    previous = _VALUES.get(id(held))
    if previous is None or _EXPONENTS.get(previous) is not held:  # not one of ours (ours hold one word)
        previous = int(held[0]) if held.numel() == 1 else None
    return previous


def changed_figure(previous: int | None, agreed: int, slack: int) -> float:
    """``_schemes._changed`` for one block: 1.0 where ``agreed`` left the window the previous
    call's exponent would guess (0.0 without both exponents)."""
    if previous is None or agreed == EMPTY or previous == EMPTY:
        return 0.0
    g = previous + slack // 2
    return 1.0 if (agreed > g or g > agreed + slack) else 0.0


@lru_cache(maxsize=256)
def grid(world: int, limbs: int, float64: bool, window: bool) -> tuple[int, int, int]:
    """(P, clamp limit, guess slack) of a call (:func:`homagg.codec._blocks.quantize`'s limit: the
    largest float32 below ``2**P`` where the work type is float32 and ``P > 24``)."""
    p = precision_bits(world, limbs)
    limit = (2**p - 1) if float64 or p <= 24 else 2**p - 2 ** (p - 24)
    return p, limit, (guess_slack(world, limbs) if window else 0)


def local_exponent(values: list[float] | np.ndarray) -> int:
    """frexp exponent of the largest |value| (EMPTY for all zeros); NonFiniteError for NaN/Inf."""
    if isinstance(values, list):
        peak = 0.0
        for x in values:
            a = abs(x)
            if not a <= peak:
                if a != a or a == math.inf:
                    peak = math.nan
                    break
                peak = a
    else:
        peak = float(np.max(np.abs(values)))
    if not math.isfinite(peak):
        bad = sum(1 for v in values if not math.isfinite(v))
        raise NonFiniteError(f"input holds {bad} non-finite value(s); nothing was sent")
    return math.frexp(peak)[1] if peak else EMPTY


def quantize(values: list[float] | np.ndarray, exponent: int, p: int, limit: int, limbs: int,
             out: np.ndarray | None = None) -> np.ndarray:
    """int32 grid words of ``values`` under ``exponent`` (:func:`homagg.codec._blocks.quantize`):
    each ``clamp(round(x * 2**(P - E)), +-limit)``, one word or the two limbs (low, high); written
    into ``out`` (int32, ``len(values) * limbs`` words) and returned where given, else a new array."""
    shift = 0 if exponent == EMPTY else p - exponent
    if isinstance(values, list):
        ldexp = math.ldexp
        qs = [min(max(round(ldexp(x, shift)), -limit), limit) for x in values]
        if limbs != 1:
            qs = [w for q in qs for w in (q & 0xFFFF, q >> 16)]
        if out is None:
            return np.array(qs, dtype=np.int32)
        out[:] = qs
        return out
    q = np.clip(np.rint(np.ldexp(values, shift)), -limit, limit).astype(np.int64)
    words = q.astype(np.int32) if limbs == 1 else np.stack([q & 0xFFFF, q >> 16], axis=1).reshape(-1).astype(np.int32)
    if out is None:
        return words
    np.copyto(out, words)
    return out


def dequantize(sums: np.ndarray, exponent: int, p: int, limbs: int, scalar: bool) -> list[float] | np.ndarray:
    """float64 values ``sum * 2**(E - P)`` (exact: |sum| < 2**47), rounded once to the dtype by
    the caller's conversion, as :func:`homagg.codec._blocks.dequantize_into`."""
    if scalar:
        return _scalar_values(sums.tolist(), exponent, p, limbs)
    shift = 0 if exponent == EMPTY else exponent - p
    joined = sums.astype(np.float64) if limbs == 1 else sums[1::2].astype(np.float64) * 65536.0 + sums[0::2]
    return np.ldexp(joined, shift)


def _scalar_values(s: list[int], exponent: int, p: int, limbs: int) -> list[float]:
    """:func:`dequantize` of the combined words ``s`` as Python numbers."""
    shift = 0 if exponent == EMPTY else exponent - p
    ldexp = math.ldexp
    if limbs == 1:
        return [ldexp(v, shift) for v in s]
    return [ldexp(s[i + 1] * 65536 + s[i], shift) for i in range(0, len(s), 2)]


def nonzero_rows(sums: np.ndarray, limbs: int) -> int:
    """Elements with a nonzero combined word (the dense scheme's union count)."""
    if limbs == 1:
        return int(np.count_nonzero(sums))
    return int(np.count_nonzero(sums.reshape(-1, limbs).any(axis=1)))


def decode(sums: np.ndarray, exponent: int, p: int, limbs: int, scalar: bool) -> tuple[list[float] | np.ndarray, int]:
    """:func:`dequantize` and :func:`nonzero_rows` of ``sums`` at once (the steady call's decode:
    one pass over the words where ``scalar``)."""
    if not scalar:
        return dequantize(sums, exponent, p, limbs, False), nonzero_rows(sums, limbs)
    s = sums.tolist()
    if limbs == 1:
        union = len(s) - s.count(0)
    else:  # a row counts where either limb is nonzero (a carry may sum to 0)
        union = sum(1 for i in range(0, len(s), 2) if s[i] or s[i + 1])
    return _scalar_values(s, exponent, p, limbs), union
