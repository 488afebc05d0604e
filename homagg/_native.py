"""The optional native kernels (``homagg/_native_kernels.c``), loaded with ctypes.

:data:`AVAILABLE` says whether the library was built (``pip install`` compiles it when a C
compiler is there; without one the install still succeeds).  Each wrapper takes and returns
numpy arrays and computes exactly what :mod:`homagg._hostops`'s numpy code computes; the callers
there decide when to use them (contiguous 32-bit CPU data) and fall back otherwise.  Setting
``HOMAGG_NATIVE=0`` in the environment disables them (to compare the two paths).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path

import numpy as np

__all__ = ["AVAILABLE", "pack32", "set_bits32", "bit_ranks32", "gather32", "decode_into32"]


def _load() -> ctypes.CDLL | None:
    if os.environ.get("HOMAGG_NATIVE", "1") == "0":
        return None
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_native_kernels{suffix}"
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                return None
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            lib.homagg_pack32.argtypes = [ptr, i64, ctypes.c_uint32, ptr]
            lib.homagg_pack32.restype = i64
            lib.homagg_set_bits32.argtypes = [ptr, i64, ptr]
            lib.homagg_set_bits32.restype = i64
            lib.homagg_decode_into32.argtypes = [ptr, i64, ptr, ptr, i64, ptr, i64, ctypes.c_int]
            lib.homagg_decode_into32.restype = i64
            lib.homagg_bit_ranks32.argtypes = [ptr, i64, ptr, i64, ptr, ptr]
            lib.homagg_bit_ranks32.restype = i64
            lib.homagg_gather32.argtypes = [ptr, ptr, i64, ptr]
            lib.homagg_gather32.restype = None
            return lib
    return None


_LIB = _load()
AVAILABLE = _LIB is not None


def pack32(x: np.ndarray, mask: int) -> tuple[np.ndarray, int]:
    """(int32 bitmap words of the elements of contiguous 32-bit ``x`` with ``x & mask != 0``,
    how many there are): ``ceil(n / 32)`` words, bit ``i % 32`` of word ``i // 32``."""
    assert _LIB is not None and x.itemsize == 4 and x.flags.c_contiguous
    if x.size == 0:
        return np.zeros(1, dtype=np.int32)[:0], 0  # a slice: numpy gives a fresh empty array stride 0
    words = np.empty(2 * -(-x.size // 64), dtype=np.int32)
    count = _LIB.homagg_pack32(x.ctypes.data, x.size, mask, words.ctypes.data)
    return words[: -(-x.size // 32)], int(count)


def set_bits32(words: np.ndarray, count: int | None = None) -> np.ndarray:
    """Sorted int64 positions of the set bits of contiguous 32-bit ``words`` (``count``: how many
    bits are set, when known)."""
    assert _LIB is not None and words.itemsize == 4 and words.flags.c_contiguous
    if count is None:
        count = int(_LIB.homagg_set_bits32(words.ctypes.data, words.size, None))
    if count == 0:
        return np.zeros(1, dtype=np.int64)[:0]
    pos = np.empty(count + 4, dtype=np.int64)  # the kernel writes up to 3 scratch entries past the end
    written = _LIB.homagg_set_bits32(words.ctypes.data, words.size, pos.ctypes.data)
    assert written == count
    return pos[:count]


def bit_ranks32(words: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """For int64 ``positions`` (any order) whose bits are set in contiguous 32-bit ``words``: how
    many set bits come before each; :class:`IndexError` for a position outside the words."""
    assert _LIB is not None and words.itemsize == 4 and words.flags.c_contiguous
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    out = np.empty(positions.size + 1, dtype=np.int64)[: positions.size]  # never a stride-0 empty array
    before = np.empty(words.size + 1, dtype=np.int64)
    if _LIB.homagg_bit_ranks32(words.ctypes.data, words.size, positions.ctypes.data, positions.size,
                               before.ctypes.data, out.ctypes.data):
        raise IndexError(f"a position lies outside the {32 * words.size} bits")
    return out


def gather32(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``x[pos]`` for contiguous 32-bit ``x`` and in-range int64 ``pos``."""
    assert _LIB is not None and x.itemsize == 4 and x.flags.c_contiguous and pos.dtype == np.int64
    if pos.size == 0:
        return np.zeros(1, dtype=x.dtype)[:0]
    out = np.empty(pos.size, dtype=x.dtype)
    _LIB.homagg_gather32(x.ctypes.data, pos.ctypes.data, pos.size, out.ctypes.data)
    return out


def decode_into32(out: np.ndarray, pos: np.ndarray, sums: np.ndarray, factor: np.ndarray, shift: int) -> None:
    """``out[pos] = sums.astype(float32) * factor[pos >> shift]`` for contiguous float32 ``out``,
    int64 ``pos``, int32 ``sums`` and float32 ``factor`` (one per block of ``2**shift`` elements,
    covering every ``pos``); :class:`IndexError` (nothing written) for a position outside ``out``
    or a block without a factor."""
    assert _LIB is not None and out.dtype == np.float32 and out.flags.c_contiguous and factor.dtype == np.float32
    pos = np.ascontiguousarray(pos, dtype=np.int64)
    sums = np.ascontiguousarray(sums, dtype=np.int32)
    factor = np.ascontiguousarray(factor)
    if pos.size != sums.size:
        raise ValueError(f"decode_into32: {sums.size} sums for {pos.size} positions")
    if pos.size and _LIB.homagg_decode_into32(out.ctypes.data, out.size, pos.ctypes.data, sums.ctypes.data, pos.size,
                                              factor.ctypes.data, factor.size, shift):
        raise IndexError(f"a position is outside [0, {out.size}) or its block outside the {factor.size} factors")
