"""Per-block powers of two for the native dense kernels, computed on the host in numpy.

The native kernels (:mod:`homagg.codec._native`) take one or two factors per block, which
:mod:`homagg.codec._blocks` computes from the block exponents.  The exponents are a few hundred
int32 words (one per block of 1,024 elements); computing their factors with torch costs a dozen
small tensor operations per call (several microseconds each, more with cold caches right after
a round), most of a mid-size call's decode.  These functions compute the same factors in a few
numpy operations on the host's own array of the exponents.

Invariant (``tests/test_host_factors.py``): each function's values equal, bit for bit, the torch
code it stands for (:func:`homagg.codec._blocks._grid_factors`, ``_decode_shift`` with
:func:`homagg.codec._fixedpoint._pow2`, :func:`homagg.codec._blocks.decodes_in_float32`) for
every int32 exponent, ``EMPTY_EXPONENT`` included; the torch code stays what every device tensor
(and every CPU tensor without the native kernels) takes.  Powers of two are built from their
exponent bits (``(shift + bias) << mantissa bits``), as ``_pow2`` builds them.
"""

from __future__ import annotations

import numpy as np
import torch

from ._fixedpoint import EMPTY_EXPONENT

__all__ = ["host_exponents", "grid_factors32", "grid_factors32_kept", "frexp_exponents32", "decode_factors32",
           "decode_factors32_kept", "decode_factors64"]


def host_exponents(exps: torch.Tensor) -> np.ndarray | None:
    """``exps`` as a numpy array sharing its memory where reading it is free (a CPU tensor), else
    None (a device tensor: the caller keeps its torch code)."""
    return exps.numpy() if exps.is_cpu else None


def _masked(values: np.ndarray, e: np.ndarray, empty_value: int) -> np.ndarray:
    """``values`` with ``empty_value`` where ``E`` is EMPTY (its block holds only zeros), in place."""
    values[e == EMPTY_EXPONENT] = empty_value
    return values


def _split(shift: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(``shift`` clamped to [-bound, bound + 1] (float32: ``bound`` 126) or [-bound, bound]
    (float64: 1000), what the clamp left, clamped the same, or None where it left nothing)."""
    lo, hi = -bound, bound + (1 if bound == 126 else 0)
    first = np.minimum(np.maximum(shift, lo), hi)
    rest = shift - first
    return first, (np.minimum(np.maximum(rest, lo), hi) if rest.any() else None)


def _pow2_32(shift: np.ndarray) -> np.ndarray:
    """``2**shift`` in float32 from its exponent bits (``shift`` in [-126, 127])."""
    return ((shift + 127) << 23).astype(np.int32, copy=False).view(np.float32)


def _pow2_64(shift: np.ndarray) -> np.ndarray:
    """``2**shift`` in float64 from its exponent bits (``shift`` in [-1022, 1023], int64)."""
    return ((shift + 1023) << 52).view(np.float64)


def _in_float32(biased: np.ndarray) -> bool:
    """Whether every biased float32 exponent lies in the normal range [1, 254]."""
    return not biased.size or bool(biased.min() >= 1 and biased.max() <= 254)


def grid_factors32(e: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Per block, float32 ``f1`` and ``f2`` whose product is the grid scale ``2**(P - E)`` (1 for an
    EMPTY block), each in [2**-126, 2**127]; ``f2`` None where it is 1 in every block: what
    ``_blocks._grid_factors(e, p, -126, 127, torch.float32)`` gives on the CPU.

    Computed in ``E``'s own integer type, as the torch code computes ``P - E`` (int32 wraps only
    for exponents no call carries, and then modulo 2**32 exactly as torch's): the usual case,
    every scale a normal float32, is five array operations."""
    biased = _masked(e.dtype.type(p + 127) - e, e, 127)  # 2**(P - E)'s float32 exponent bits
    if _in_float32(biased):
        return (biased << 23).astype(np.int32, copy=False).view(np.float32), None
    first, rest = _split(biased - e.dtype.type(127), 126)
    return _pow2_32(first), (None if rest is None else _pow2_32(rest))


#: the last few exponent sets' grid factors (:func:`grid_factors32_kept`): a steady call quantises
#: under the same guess call after call
_KEPT: dict[tuple[bytes, str, int], tuple[np.ndarray, np.ndarray | None]] = {}
#: the last few exponent sets' decode factors and their addresses (:func:`decode_factors32_kept`):
#: a steady call decodes under the same agreed exponents call after call
_KEPT_DECODE: dict[tuple[bytes, str, int], tuple[np.ndarray, int] | None] = {}
_KEEP = 8  #: entries each of the two holds
_MISSING = object()


def _keep(store: dict, key: tuple[bytes, str, int], value: object) -> None:
    """``store[key] = value``, the oldest entry evicted first where ``store`` holds :data:`_KEEP`."""
    if len(store) >= _KEEP:
        try:
            del store[next(iter(store))]
        except (KeyError, RuntimeError, StopIteration):  # workers on threads: another evicted meanwhile
            pass
    store[key] = value


def grid_factors32_kept(e: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`grid_factors32`, kept for the last :data:`_KEEP` distinct ``(e, p)`` (keyed by the
    exponents' bytes and dtype: equal exponents give equal factors).  The arrays are read-only (a
    writer raises instead of changing a later call's factors)."""
    key = (e.tobytes(), e.dtype.str, p)
    kept = _KEPT.get(key)
    if kept is None:
        f1, f2 = grid_factors32(e, p)
        for f in (f1, f2):
            if f is not None:
                f.flags.writeable = False
        kept = (f1, f2)
        _keep(_KEPT, key, kept)
    return kept


def decode_factors32_kept(e: np.ndarray, p: int) -> tuple[np.ndarray, int] | None:
    """(:func:`decode_factors32`'s array, its data's address), kept as :func:`grid_factors32_kept`
    keeps its factors (read-only; the kept array keeps the address valid, so a native kernel is
    handed it without reading ``ctypes.data`` per call); None where :func:`decode_factors32` gives
    None (kept too)."""
    key = (e.tobytes(), e.dtype.str, p)
    kept = _KEPT_DECODE.get(key, _MISSING)
    if kept is _MISSING:
        factor = decode_factors32(e, p)
        if factor is not None:
            factor.flags.writeable = False
        kept = None if factor is None else (factor, factor.ctypes.data)
        _keep(_KEPT_DECODE, key, kept)
    return kept  # type: ignore[return-value]


def decode_factors32(e: np.ndarray, p: int) -> np.ndarray | None:
    """Per block, float32 ``2**(E - P)`` (1 for an EMPTY block) where every block's ``E - P`` lies in
    [-126, 127] (:func:`homagg.codec._blocks.decodes_in_float32`; then the float32 decoding is
    exact), else None (the caller decodes in float64).  In ``E``'s integer type: an int32
    exponent that wraps is one far outside the range, which the torch code's int64 finds outside
    it too."""
    biased = _masked(e + e.dtype.type(127 - p), e, 127)
    if not _in_float32(biased):
        return None
    return (biased << 23).astype(np.int32, copy=False).view(np.float32)


def decode_factors64(e: np.ndarray, p: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Per block, float64 ``f1`` and ``f2`` whose product is ``2**(E - P)`` (1 for an EMPTY block),
    each ``2**s`` with ``s`` in [-1000, 1000]; ``f2`` None where it is 1 in every block: the wide
    decoding's factors (``homagg_dequantize_wide``), in int64 as the torch code computes them."""
    shift = _masked(e.astype(np.int64) - p, e, 0)
    if not shift.size or bool(shift.min() >= -1000 and shift.max() <= 1000):
        return _pow2_64(shift), None
    first, rest = _split(shift, 1000)
    return _pow2_64(first), (None if rest is None else _pow2_64(rest))


def frexp_exponents32(peaks: np.ndarray) -> np.ndarray:
    """int32 frexp exponent of each finite float32 block peak (``|x| = m * 2**e``, ``m`` in [0.5, 1)),
    EMPTY where the peak is 0: what ``torch.frexp(peak.double()).exponent`` with EMPTY at zeros
    gives (a float32 value's frexp exponent is the same in float64, subnormals included)."""
    e = np.frexp(peaks)[1].astype(np.int32, copy=False)
    e[peaks == 0] = EMPTY_EXPONENT
    return e
