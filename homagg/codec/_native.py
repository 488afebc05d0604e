"""The optional native kernels (``homagg/codec/_native_kernels.c``), loaded with ctypes.

:data:`AVAILABLE` says whether the library was built (``pip install`` compiles it when a C
compiler is there; without one the install still succeeds).  Each wrapper takes and returns
numpy arrays and computes exactly what :mod:`homagg.codec._hostops`'s numpy code computes; the callers
there decide when to use them (contiguous 32-bit CPU data) and fall back otherwise.  Setting
``HOMAGG_NATIVE=0`` in the environment disables them (to compare the two paths).
"""

from __future__ import annotations

import ctypes

import numpy as np

from .._cext import load_library

__all__ = ["AVAILABLE", "pack32", "scan32", "set_bits32", "bit_ranks32", "gather32", "decode_into32", "block_peaks32",
           "quantize32", "quantize_at64", "dequantize32_at", "quantize_place64", "decode_bits32",
           "count_bits32", "block_peaks_at64", "select_bits32", "place_bits32", "FILL_QUANTIZE32",
           "quantize32_wide", "dequantize_wide", "WIDE"]


def _load() -> ctypes.CDLL | None:
    lib = load_library(__file__, "_native_kernels")
    if lib is None:
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.homagg_pack32.argtypes = [ptr, i64, ctypes.c_uint32, ptr]
    lib.homagg_pack32.restype = i64
    lib.homagg_scan32.argtypes = [ptr, i64, ctypes.c_uint32, ptr, i64, ptr, ptr, ptr]
    lib.homagg_scan32.restype = i64
    if hasattr(lib, "homagg_scan32z"):  # an older build lacks it: the caller then cannot tell (None)
        lib.homagg_scan32z.argtypes = [ptr, i64, ctypes.c_uint32, ptr, i64, ptr, ptr, ptr, ptr]
        lib.homagg_scan32z.restype = i64
    lib.homagg_set_bits32.argtypes = [ptr, i64, ptr]
    lib.homagg_set_bits32.restype = i64
    lib.homagg_decode_into32.argtypes = [ptr, i64, ptr, ptr, i64, ptr, i64, ctypes.c_int]
    lib.homagg_decode_into32.restype = i64
    lib.homagg_bit_ranks32.argtypes = [ptr, i64, ptr, i64, ptr, ptr]
    lib.homagg_bit_ranks32.restype = i64
    lib.homagg_gather32.argtypes = [ptr, ptr, i64, ptr]
    lib.homagg_gather32.restype = None
    lib.homagg_block_peaks32.argtypes = [ptr, i64, i64, ptr]
    lib.homagg_block_peaks32.restype = i64
    lib.homagg_quantize32.argtypes = [ptr, i64, i64, ptr, ptr, ctypes.c_float, ptr]
    lib.homagg_quantize32.restype = None
    lib.homagg_quantize_at64.argtypes = [ptr, ptr, i64, i64, ptr, ptr, ctypes.c_double, ptr]
    lib.homagg_quantize_at64.restype = None
    lib.homagg_dequantize32.argtypes = [ptr, i64, i64, ptr, ptr]
    lib.homagg_dequantize32.restype = i64
    if hasattr(lib, "homagg_dequantize_wide"):  # a library built before wide words lacks them (WIDE)
        lib.homagg_quantize32_wide.argtypes = [ptr, i64, i64, ptr, ptr, ctypes.c_float, ptr]
        lib.homagg_quantize32_wide.restype = None
        lib.homagg_dequantize_wide.argtypes = [ptr, i64, i64, ptr, ptr, ptr]
        lib.homagg_dequantize_wide.restype = i64
    lib.homagg_quantize_place64.argtypes = [ptr, ptr, i64, ctypes.c_int, ptr, ptr, i64, ctypes.c_double, ptr, i64,
                                             ptr, ptr, i64]
    lib.homagg_quantize_place64.restype = i64
    lib.homagg_decode_bits32.argtypes = [ptr, i64, ptr, i64, ptr, i64, ptr, i64, ctypes.c_int, ptr]
    lib.homagg_decode_bits32.restype = i64
    lib.homagg_block_peaks_at64.argtypes = [ptr, ptr, i64, i64, ctypes.c_int, i64, ptr]
    lib.homagg_block_peaks_at64.restype = i64
    lib.homagg_select_bits32.argtypes = [ptr, ptr, i64, ptr]
    lib.homagg_select_bits32.restype = i64
    lib.homagg_place_bits32.argtypes = [ptr, ptr, i64, ptr, i64]
    lib.homagg_place_bits32.restype = i64
    return lib


_LIB = _load()
AVAILABLE = _LIB is not None
#: whether the wide-word kernels are there (:func:`quantize32_wide`, :func:`dequantize_wide`)
WIDE = AVAILABLE and hasattr(_LIB, "homagg_dequantize_wide")
#: address of ``homagg_fill_quantize32`` (a :class:`~homagg.transport.WordSource`'s native fill
#: function: :mod:`homagg.codec._dense_source`), None without the native kernels
FILL_QUANTIZE32: int | None = (ctypes.cast(_LIB.homagg_fill_quantize32, ctypes.c_void_p).value
                               if _LIB is not None else None)


def pack32(x: np.ndarray, mask: int) -> tuple[np.ndarray, int]:
    """(int32 bitmap words of the elements of contiguous 32-bit ``x`` with ``x & mask != 0``,
    how many there are): ``ceil(n / 32)`` words, bit ``i % 32`` of word ``i // 32``."""
    assert _LIB is not None and x.itemsize == 4 and x.flags.c_contiguous
    if x.size == 0:
        return np.zeros(1, dtype=np.int32)[:0], 0  # a slice: numpy gives a fresh empty array stride 0
    words = np.empty(2 * -(-x.size // 64), dtype=np.int32)
    count = _LIB.homagg_pack32(x.ctypes.data, x.size, mask, words.ctypes.data)
    return words[: -(-x.size // 32)], int(count)


def scan32(x: np.ndarray, mask: int, capacity: int, with_values: bool,
           odd: list[int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(words, positions, values)`` of the elements of contiguous 32-bit ``x`` with ``x & mask !=
    0``: :func:`pack32`'s words, the sorted int64 positions (:func:`set_bits32` of the words) and,
    with ``with_values``, ``x`` at them (:func:`gather32`) -- listed in the same pass as the
    packing while they fit ``capacity`` entries, else from the words afterwards (the same arrays
    either way).  ``odd`` (a list): where the library has ``homagg_scan32z``, the scan also appends
    the OR of the raw bits of every element it found zero (nonzero: a float's -0.0 is among them)."""
    assert _LIB is not None and x.itemsize == 4 and x.flags.c_contiguous
    if x.size == 0:
        return np.zeros(1, dtype=np.int32)[:0], np.zeros(1, dtype=np.int64)[:0], (x[:0].copy() if with_values else None)
    words = np.empty(2 * -(-x.size // 64), dtype=np.int32)
    room = max(0, min(capacity, x.size)) + 68  # a group's 64 positions and decode64's scratch
    pos = np.empty(room, dtype=np.int64)
    vals = np.empty(room, dtype=x.dtype) if with_values else None
    listed = ctypes.c_int64(0)
    args = (x.ctypes.data, x.size, mask, words.ctypes.data, room, pos.ctypes.data,
            None if vals is None else vals.ctypes.data, ctypes.byref(listed))
    if odd is not None and hasattr(_LIB, "homagg_scan32z"):
        bits = ctypes.c_uint32(0)
        count = int(_LIB.homagg_scan32z(*args, ctypes.byref(bits)))
        odd.append(bits.value)
    else:
        count = int(_LIB.homagg_scan32(*args))
    words = words[: -(-x.size // 32)]
    if listed.value < 0:  # more than the room: listed from the packed words
        positions = set_bits32(words, count)
        return words, positions, (gather32(x, positions) if with_values else None)
    assert listed.value == count
    return words, pos[:count], (vals[:count] if vals is not None else None)


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


def count_bits32(words: np.ndarray) -> int:
    """Number of set bits of contiguous 32-bit ``words``."""
    assert _LIB is not None and words.itemsize == 4 and words.flags.c_contiguous
    return int(_LIB.homagg_set_bits32(words.ctypes.data, words.size, None))


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


def _blocks_of(n: int, block_size: int, per_block: np.ndarray, name: str) -> None:
    if block_size < 1 or per_block.size != -(-n // block_size):
        raise ValueError(f"{name}: {per_block.size} per-block values for {n} elements in blocks of {block_size}")


def block_peaks32(x: np.ndarray, block_size: int) -> tuple[np.ndarray, bool]:
    """(per block of contiguous float32 ``x``, its largest magnitude as a float32 (``-0.0`` counts
    as 0), whether some element is NaN or +-Inf) -- one pass."""
    assert _LIB is not None and x.dtype == np.float32 and x.flags.c_contiguous and block_size >= 1
    peak = np.empty(-(-x.size // block_size), dtype=np.uint32)
    bad = _LIB.homagg_block_peaks32(x.ctypes.data, x.size, block_size, peak.ctypes.data) if x.size else 0
    return peak.view(np.float32), bool(bad)


def block_peaks_at64(idx: np.ndarray, values: np.ndarray, numel: int, block_size: int) -> tuple[np.ndarray, bool]:
    """(per block of ``numel`` elements in blocks of ``block_size``, a power of two: the largest
    |value| of the float64 ``values`` at int64 positions ``idx`` (0.0 where none), whether some
    value is NaN or +-Inf) -- one pass; :class:`ValueError` for a position outside the blocks."""
    assert _LIB is not None and idx.dtype == np.int64 and values.dtype == np.float64 and idx.size == values.size
    assert idx.flags.c_contiguous and values.flags.c_contiguous and block_size >= 1
    assert block_size & (block_size - 1) == 0
    peak = np.empty(-(-numel // block_size), dtype=np.float64)
    bad = _LIB.homagg_block_peaks_at64(idx.ctypes.data, values.ctypes.data, idx.size, numel,
                                       block_size.bit_length() - 1, peak.size, peak.ctypes.data) if peak.size else 0
    if bad < 0 or (idx.size and not peak.size):
        raise ValueError(f"block_peaks_at64: a position outside the {numel} elements")
    return peak, bool(bad)


def _float32_factors(n: int, block_size: int, f1: np.ndarray, f2: np.ndarray | None,
                     kernel: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The per-block float32 factors of a quantise kernel over ``n`` elements, contiguous and
    checked to hold one factor per block (both, when there is a second)."""
    f1 = np.ascontiguousarray(f1, dtype=np.float32)
    _blocks_of(n, block_size, f1, kernel)
    if f2 is not None:
        f2 = np.ascontiguousarray(f2, dtype=np.float32)
        _blocks_of(n, block_size, f2, kernel)
    return f1, f2


def quantize32(x: np.ndarray, block_size: int, f1: np.ndarray, f2: np.ndarray | None, limit: float,
               out: np.ndarray) -> None:
    """``out = clamp(round_half_even(x * f1[block] (* f2[block])), -limit, limit)`` as int32, the
    products in float32 (contiguous float32 ``x`` and per-block float32 factors; ``limit`` must be
    a float32 integer below 2**31)."""
    assert _LIB is not None and x.dtype == np.float32 and x.flags.c_contiguous
    assert out.dtype == np.int32 and out.flags.c_contiguous and out.size == x.size
    f1, f2 = _float32_factors(x.size, block_size, f1, f2, "quantize32")
    if x.size:
        _LIB.homagg_quantize32(x.ctypes.data, x.size, block_size, f1.ctypes.data,
                               None if f2 is None else f2.ctypes.data, limit, out.ctypes.data)


def quantize32_wide(x: np.ndarray, block_size: int, f1: np.ndarray, f2: np.ndarray | None, limit: float,
                    out: np.ndarray) -> None:
    """Wide words of :func:`quantize32`'s grid values (``limit`` a float32 integer below 2**47):
    ``out[2i] = q & 0xFFFF``, ``out[2i + 1] = q >> 16`` (contiguous int32, two words per element)."""
    assert _LIB is not None and x.dtype == np.float32 and x.flags.c_contiguous
    assert out.dtype == np.int32 and out.flags.c_contiguous and out.size == 2 * x.size
    f1, f2 = _float32_factors(x.size, block_size, f1, f2, "quantize32_wide")
    if x.size:
        _LIB.homagg_quantize32_wide(x.ctypes.data, x.size, block_size, f1.ctypes.data,
                                    None if f2 is None else f2.ctypes.data, limit, out.ctypes.data)


def dequantize_wide(sums: np.ndarray, block_size: int, f1: np.ndarray, f2: np.ndarray | None, out: np.ndarray) -> int:
    """``out = float32((sums[2i+1] * 2**16 + sums[2i]) * f1[block] (* f2[block]))``, the products in
    float64, for contiguous int32 word pairs ``sums`` and float32 ``out``; returns how many
    elements have a nonzero word (same pass)."""
    assert _LIB is not None and sums.dtype == np.int32 and sums.flags.c_contiguous
    assert out.dtype == np.float32 and out.flags.c_contiguous and sums.size == 2 * out.size
    f1 = np.ascontiguousarray(f1, dtype=np.float64)
    _blocks_of(out.size, block_size, f1, "dequantize_wide")
    if f2 is not None:
        f2 = np.ascontiguousarray(f2, dtype=np.float64)
        _blocks_of(out.size, block_size, f2, "dequantize_wide")
    if not out.size:
        return 0
    return int(_LIB.homagg_dequantize_wide(sums.ctypes.data, out.size, block_size, f1.ctypes.data,
                                           None if f2 is None else f2.ctypes.data, out.ctypes.data))


def quantize_at64(idx: np.ndarray, values: np.ndarray, block_size: int, f1: np.ndarray, f2: np.ndarray | None,
                  limit: float) -> np.ndarray:
    """int32 ``clamp(round_half_even(values * f1[blk] (* f2[blk])), -limit, limit)``, ``blk =
    idx // block_size``, for contiguous int64 positions ``idx`` and float64 ``values`` and per-block
    float64 factors (every ``blk`` must index them)."""
    assert _LIB is not None and idx.dtype == np.int64 and values.dtype == np.float64
    assert idx.flags.c_contiguous and values.flags.c_contiguous and idx.size == values.size
    f1 = np.ascontiguousarray(f1, dtype=np.float64)
    f2 = None if f2 is None else np.ascontiguousarray(f2, dtype=np.float64)
    out = np.empty(idx.size, dtype=np.int32)
    if idx.size:
        if int(idx[-1]) // block_size >= f1.size or int(idx[0]) < 0 or (f2 is not None and f2.size != f1.size):
            raise ValueError("quantize_at64: a position outside the blocks' factors")
        _LIB.homagg_quantize_at64(idx.ctypes.data, values.ctypes.data, idx.size, block_size, f1.ctypes.data,
                                  None if f2 is None else f2.ctypes.data, limit, out.ctypes.data)
    return out


def dequantize32_at(sums: int, out: int, n: int, block_size: int, factor: int, blocks: int) -> int:
    """``out = float32(sums) * factor[block]`` on addresses (a steady dense decode's: tensors'
    ``data_ptr()`` and a kept factor array's address, no numpy views or ``ctypes.data`` per call):
    ``n`` contiguous int32 sums at ``sums``, ``n`` contiguous float32 results at ``out``,
    ``blocks`` float32 factors at ``factor``; returns how many sums are nonzero (the same pass).
    The caller guarantees those; :class:`ValueError` unless ``blocks`` is one factor per block."""
    assert _LIB is not None
    if block_size < 1 or n < 0 or blocks != -(-n // block_size):
        raise ValueError(f"dequantize32_at: {blocks} per-block values for {n} elements in blocks of {block_size}")
    return int(_LIB.homagg_dequantize32(sums, n, block_size, factor, out)) if n else 0


def quantize_place64(idx: np.ndarray, values: np.ndarray, block_size: int, f1: np.ndarray, f2: np.ndarray | None,
                     limit: float, words: np.ndarray, out: np.ndarray) -> None:
    """``out[bit_ranks32(words, idx)] = quantize_at64(idx, values, ...)`` in one pass
    (``homagg_quantize_place64``): strictly ascending int64 ``idx`` whose bits are set in the
    32-bit bitmap ``words``, float64 ``values``, per-block float64 factors (``block_size`` a power
    of two); ``out``: contiguous int32 with a slot per set bit, nothing else of it written.
    :class:`ValueError` when the positions and the bitmap or the factors disagree (``out`` may
    then be partly written)."""
    assert _LIB is not None and idx.dtype == np.int64 and values.dtype == np.float64 and words.itemsize == 4
    assert idx.flags.c_contiguous and values.flags.c_contiguous and words.flags.c_contiguous
    assert out.dtype == np.int32 and out.flags.c_contiguous and idx.size == values.size
    assert block_size >= 1 and block_size & (block_size - 1) == 0
    f1 = np.ascontiguousarray(f1, dtype=np.float64)
    f2 = None if f2 is None else np.ascontiguousarray(f2, dtype=np.float64)
    if f2 is not None and f2.size != f1.size:
        raise ValueError("quantize_place64: the two factor arrays differ in length")
    if not idx.size:
        return
    before = np.empty(words.size // 8 + 2, dtype=np.int64)
    if _LIB.homagg_quantize_place64(idx.ctypes.data, values.ctypes.data, idx.size, block_size.bit_length() - 1,
                                    f1.ctypes.data, None if f2 is None else f2.ctypes.data, f1.size, limit,
                                    words.ctypes.data, words.size, before.ctypes.data, out.ctypes.data, out.size):
        raise ValueError("quantize_place64: fewer slots than the bitmap's set bits, or positions not ascending, "
                         "outside the factors or not in the bitmap")


_DECODE_BATCH = 65536  #: bits homagg_decode_bits32 lists at a time (its batch of 2048 words)


def decode_bits32(out: np.ndarray, words: np.ndarray, sums: np.ndarray, factor: np.ndarray, shift: int) -> None:
    """``decode_into32(out, set_bits32(words), sums, factor, shift)`` without listing the positions
    (``homagg_decode_bits32``); :class:`ValueError` (nothing written) when ``sums`` does
    not hold one word per set bit, or a set bit lies outside ``out`` or its block outside ``factor``."""
    assert _LIB is not None and out.dtype == np.float32 and out.flags.c_contiguous and factor.dtype == np.float32
    assert words.itemsize == 4 and words.flags.c_contiguous
    sums = np.ascontiguousarray(sums, dtype=np.int32)
    factor = np.ascontiguousarray(factor)
    pos = np.empty(_DECODE_BATCH + 4, dtype=np.int64)
    if _LIB.homagg_decode_bits32(out.ctypes.data, out.size, words.ctypes.data, words.size, sums.ctypes.data, sums.size,
                                 factor.ctypes.data, factor.size, shift, pos.ctypes.data):
        raise ValueError(f"decode_bits32: {sums.size} sums for the bitmap's set bits, or a bit outside the "
                         f"{out.size} elements / {factor.size} factors")


def select_bits32(mask: np.ndarray, src: np.ndarray) -> np.ndarray:
    """``src[set_bits32(mask)]`` for contiguous 32-bit ``src`` and a bitmap ``mask`` covering it
    (bits past ``src`` ignored), without listing the positions."""
    assert _LIB is not None and mask.itemsize == 4 and src.itemsize == 4
    assert mask.flags.c_contiguous and src.flags.c_contiguous and mask.size >= -(-src.size // 32)
    out = np.empty(src.size + 1, dtype=np.int32)  # the kernel writes one scratch word past the count
    count = _LIB.homagg_select_bits32(mask.ctypes.data, src.ctypes.data, src.size, out.ctypes.data)
    return out[:count].view(src.dtype)


def place_bits32(mask: np.ndarray, vals: np.ndarray, nout: int) -> np.ndarray:
    """int32 ``out`` of ``nout`` words: ``vals`` in order at the set bits of ``mask`` below
    ``nout``, 0 elsewhere (:func:`select_bits32`'s inverse); :class:`ValueError` unless the mask
    has exactly ``vals.size`` set bits there."""
    assert _LIB is not None and mask.itemsize == 4 and mask.flags.c_contiguous and mask.size >= -(-nout // 32)
    vals = np.ascontiguousarray(vals, dtype=np.int32)
    out = np.empty(nout, dtype=np.int32)
    if _LIB.homagg_place_bits32(mask.ctypes.data, vals.ctypes.data, vals.size, out.ctypes.data, nout):
        raise ValueError(f"place_bits32: {vals.size} words for a mask with another number of set bits")
    return out
