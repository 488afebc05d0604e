"""The per-block exponent kernels (``homagg/codec/_exponent_kernels.c``), loaded with ctypes.

They are compiled into the codec's native library (``homagg.codec._native_kernels``, setup.py)
beside :mod:`homagg.codec._native`'s kernels; a library built before them lacks their symbols, and
a machine without a C compiler has no library: :data:`AVAILABLE` is then False and
:mod:`homagg.codec._exponents` keeps its numpy path (``HOMAGG_NATIVE=0`` turns them off too).
Both wrappers take addresses (tensors' ``data_ptr()``): a steady call's guess and settling are one
C call each, with no numpy views.
"""

from __future__ import annotations

import ctypes

from .._cext import load_library

__all__ = ["AVAILABLE", "WINDOW_LIMIT", "guess32", "settle32"]

#: the kernels' int64 intermediates are exact for every int32 exponent while the window's
#: ``raise_by`` and ``slack`` lie strictly within +-WINDOW_LIMIT
WINDOW_LIMIT = 2**62


def _load() -> ctypes.CDLL | None:
    lib = load_library(__file__, "_native_kernels")
    if lib is None or not hasattr(lib, "homagg_settle32"):
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.homagg_guess32.argtypes = [ptr, ptr, i64, i64, ptr, ptr]
    lib.homagg_guess32.restype = None
    lib.homagg_settle32.argtypes = [ptr, ptr, i64, i64, ptr, ptr, ptr, i64, ptr]
    lib.homagg_settle32.restype = None
    return lib


_LIB = _load()
AVAILABLE = _LIB is not None
_COUNTS = ctypes.c_int64 * 2  # settle32's (blocks held in both calls, those that moved)


def _check(name: str, **window: int) -> None:
    for key, value in window.items():
        if not -WINDOW_LIMIT < value < WINDOW_LIMIT:
            raise ValueError(f"{name}: {key} {value} outside the kernel's range (+-2**62)")


def guess32(prev: int, local: int, n: int, raise_by: int, guess: int, negated: int) -> None:
    """``homagg_guess32``: ``n`` contiguous int32 exponents each at ``prev`` and ``local``; writes
    ``n`` int32 guesses at ``guess`` and their wrapping negation at ``negated``
    (:func:`homagg.codec._exponents.guess_and_negated`'s values).  The caller guarantees the
    addresses; :class:`ValueError` for ``raise_by`` outside :data:`WINDOW_LIMIT`."""
    assert _LIB is not None
    _check("guess32", raise_by=raise_by)
    _LIB.homagg_guess32(prev, local, n, raise_by, guess, negated)


def settle32(agreed: int, max_negated_guess: int, n: int, slack: int, bad: int, exponents: int,
             prev: int | None, raise_by: int) -> tuple[int, int] | None:
    """``homagg_settle32``: ``n`` contiguous int32 values each at ``agreed``,
    ``max_negated_guess`` (and ``prev`` where given); writes ``n`` bools (one byte, 0 or 1) at
    ``bad`` and ``n`` int32 decode exponents at ``exponents``; returns (blocks held in both calls,
    those outside the window ``(raise_by, slack)``) where ``prev`` is given, else None
    (:func:`homagg.codec._exponents.settle_exponents`'s values).  :class:`ValueError` for a window
    outside :data:`WINDOW_LIMIT`."""
    assert _LIB is not None
    _check("settle32", raise_by=raise_by, slack=slack)
    counts = _COUNTS()
    _LIB.homagg_settle32(agreed, max_negated_guess, n, slack, bad, exponents, prev, raise_by, counts)
    return None if prev is None else (counts[0], counts[1])
