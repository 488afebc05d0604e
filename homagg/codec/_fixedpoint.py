"""Fixed point: floats -> int32 with a shared exponent per block, integers -> exact 16-bit limbs.

Floats.  Elements are grouped in blocks of ``block_size``.  Each worker sends, per block, the
frexp exponent ``e`` of its largest magnitude (``max|x| < 2**e``); a MAX-combine gives the block's
agreed exponent ``E``.  With ``h = ceil(log2(W))`` headroom bits the precision is ``P = 31 - h`` and
every worker sends ``q = clamp(round(x * 2**(P - E)), +-(2**P - 1))``, so ``|sum of q| <= W *
(2**P - 1) < 2**31``: the sum over all workers never overflows int32.  The result is
``(sum of q) * 2**(E - P)`` rounded once to the input dtype.

Error bound (per element, ``M`` = max|x| over the block and all workers, so ``M >= 2**(E-1)``):
each worker's rounding/clamping error is at most one grid unit ``2**(E-P) <= 2M * 2**-P``, and the
final conversion adds at most half an ulp of the output.  For float32 output and ``W <= 128``
(``P >= 24``)::

    |result - exact sum| <= W * 2M * 2**-P + 2**-24 * W * M <= W * 2**-22 * M

For larger W the first term grows as ``W * 2**(h-30) * M``.  float64 results carry only the
quantisation term; float16/bfloat16 results add their own final rounding.

Wide words (``CodecConfig.precision``, :func:`float_words`): two int32 words per value, the limbs
of the integer path (``q & 0xFFFF`` unsigned, ``q >> 16`` signed) with ``P2 = 47 - h`` bits; limb
sums fit int32 (W <= 2**15) and ``low + high * 2**16`` (``< 2**47``) is exact in float64, rounded
once.  The W workers' quantisation error ``W * 2M * 2**-P2 = 2**(2h-46) M`` (``2**-26 M`` at W =
1024) stays, with the steady window (:func:`guess_slack`), within ``2**-24 M``: one float32
rounding at the block's scale (an fp32 ring makes W - 1).  Float32 results add half an ulp.  Values already on the
grid (multiples of ``2**(E-P)``, e.g. small integers) are summed exactly, and the integer sums are
identical for every scheme, so every scheme returns bit-identical results.

Integers.  int64 values are split into four 16-bit limbs (two for narrower types), the top one
signed; limb sums cannot overflow for ``W < 2**15``; carries are propagated after the combine and an
exact result outside the dtype's range raises :class:`IntegerOverflowError`.
"""

from __future__ import annotations

import torch

from .._errors import InputError, IntegerOverflowError, NonFiniteError
from . import _hostops, _native
from ._config import PRECISIONS
# the steady calls' per-block exponent bookkeeping lives in _exponents; its names stay importable from here
from ._exponents import (EMPTY_EXPONENT, changed_counts, decode_exponents, guess_exponents, mismatched_blocks,
                         negated_guess, outside_window)

__all__ = [
    "float32_factors",
    "EMPTY_EXPONENT",
    "precision_bits",
    "PRECISIONS",
    "float_words",
    "is_float_dtype",
    "limb_count",
    "check_finite",
    "block_exponents",
    "guess_slack",
    "guess_exponents",
    "negated_guess",
    "mismatched_blocks",
    "decode_exponents",
    "outside_window",
    "changed_counts",
    "float32_in_range",
    "quantize",
    "quantize_words",
    "join_words",
    "quantize_into_slots",
    "places_natively",
    "dequantize",
    "to_limbs",
    "from_limbs",
]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INTS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)




def precision_bits(world_size: int, words: int = 1) -> int:
    """Fraction bits each worker may use without overflow: ``P = 31 - ceil(log2(world_size))`` in
    one int32 word, ``P2 = 47 - ceil(log2(world_size))`` in two (a 16-bit unsigned low limb and a
    signed high limb whose sum over the workers fits int32)."""
    assert words in (1, 2), words
    return 31 + 16 * (words - 1) - (world_size - 1).bit_length()


def float_words(precision: str, world_size: int) -> int:
    """int32 words per float value: 2 for ``"wide"``, 1 for ``"single"``; ``"auto"``: 2 where one
    word keeps fewer than float32's 24 significant bits below a block's exponent (``P < 24``:
    ``W > 128``, where homagg's error on real gradients exceeds an fp32 ring's), else 1.  Depends
    on agreed inputs only: every worker of a job decides alike."""
    if precision == "wide":
        return 2
    if precision == "single":
        return 1
    if precision != "auto":
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return 2 if precision_bits(world_size) < 24 else 1


def is_float_dtype(dtype: torch.dtype) -> bool:
    if dtype in _FLOATS:
        return True
    if dtype in _INTS:
        return False
    raise InputError(f"homagg aggregates float16/bfloat16/float32/float64 and integer tensors, not {dtype}")


def limb_count(dtype: torch.dtype, float_words: int = 1) -> int:
    """Words per element: ``float_words`` (:func:`float_words`) for floats, 4 for int64, 2 for
    narrower integers."""
    if is_float_dtype(dtype):
        return float_words
    return 4 if dtype == torch.int64 else 2


def check_finite(values: torch.Tensor) -> None:
    """Raise NonFiniteError if any value is NaN or +-Inf (one host sync)."""
    if values.numel() and not bool(torch.isfinite(values).all()):
        bad = values[~torch.isfinite(values)]
        raise NonFiniteError(f"input holds {bad.numel()} non-finite value(s) (e.g. {bad[0].item()}); nothing was sent")


def _pow2(shift: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Exact ``2**shift`` in ``dtype`` built from the exponent bits (float64: integer shift in
    [-1022, 1023]; float32: [-126, 127])."""
    if dtype == torch.float64:
        return ((shift.to(torch.int64) + 1023) << 52).view(torch.float64)
    return ((shift.to(torch.int32) + 127) << 23).view(torch.float32)


def block_exponents(idx: torch.Tensor, values: torch.Tensor, numel: int, block_size: int) -> torch.Tensor:
    """Per block, the frexp exponent of the largest |value| (EMPTY_EXPONENT where no value).

    ``idx`` are the flat positions of ``values`` (float64, nonzero).  Raises
    :class:`NonFiniteError` if a value is NaN or +-Inf (on CPU found in the same native pass as
    the peaks).
    """
    blocks = -(-numel // block_size)
    if not values.numel():
        return torch.full((blocks,), EMPTY_EXPONENT, dtype=torch.int32, device=values.device)
    # frexp's exponent grows with |x|: the exponent of each block's largest |value| is the largest
    # exponent, so frexp runs once per block, not once per value
    if (_native.AVAILABLE and block_size & (block_size - 1) == 0 and idx.device.type == "cpu"
            and values.device.type == "cpu" and idx.dtype == torch.int64 and values.dtype == torch.float64
            and idx.is_contiguous() and values.is_contiguous()):
        peaks, bad = _native.block_peaks_at64(idx.numpy(), values.numpy(), numel, block_size)
        if bad:
            check_finite(values)
        peak = torch.from_numpy(peaks)
    else:
        check_finite(values)
        peak = torch.zeros(blocks, dtype=values.dtype, device=values.device)
        peak.scatter_reduce_(0, _block_of(idx, block_size), values.abs(), reduce="amax")
    e = torch.frexp(peak).exponent.to(torch.int32)
    return torch.where(peak == 0, torch.full_like(e, EMPTY_EXPONENT), e)


#: the steady window of wide words where the bound allows it: single words' at W = 4
WIDE_SLACK = 5


def guess_slack(world_size: int, words: int = 1) -> int:
    """Precision bits the error bound leaves unused.

    One word: ``max(0, P - 24)`` (5 at W = 4, 0 at W >= 128).  The bound needs 24 bits below a
    block's agreed exponent ``E`` (see the module docstring), and words carry ``P``: quantising
    under any common exponent ``G`` with ``E <= G <= E + slack`` keeps every element within the
    bound (the grid unit is at most ``2M * 2**-24``) and every sum inside int32 (``|x| < 2**E <=
    2**G``).

    Two words: ``min(max(WIDE_SLACK, P - 24), P2 - 25 - h)`` (7 at W = 1, 5 from W = 4 to 256, 4 at
    512, 2 at 1024): never narrower than single words' window, and the W workers' quantisation
    error under ``G <= E + slack``, ``W * 2**(G-P2) <= 2**(E-25) <= 2**-24 M``, stays within one
    float32 rounding at the block's scale.
    """
    if words == 2:
        room = precision_bits(world_size, 2) - 25 - (world_size - 1).bit_length()
        return max(0, min(max(WIDE_SLACK, precision_bits(world_size) - 24), room))
    return max(0, precision_bits(world_size) - 24)


def _block_factors(shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per block, two exact power-of-two factors whose product is ``2**shift`` (clamped to
    ``+-2000``): ``x * f1 * f2`` is exact while the result is a normal number.  The second is
    ``None`` where it is 1 in every block (multiplying by 1.0 changes nothing); on a device it is
    always given (one multiplication more costs less than reading whether it is needed)."""
    first = shift.clamp(-1000, 1000)
    rest = (shift - first).clamp(-1000, 1000)
    needed = not _hostops.reads_free(rest) or bool(rest.any())
    return _pow2(first), (_pow2(rest) if needed else None)


def _scale_by_block(x: torch.Tensor, blk: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``x * 2**shift[blk]`` in float64, the factors computed once per block and gathered per
    element (the same two multiplications as scaling element by element; a factor of 1.0 skipped)."""
    f1, f2 = _block_factors(shift)
    out = x * f1.index_select(0, blk)
    if f2 is not None:
        out.mul_(f2.index_select(0, blk))
    return out


def _block_of(idx: torch.Tensor, block_size: int) -> torch.Tensor:
    return idx >> (block_size.bit_length() - 1) if block_size & (block_size - 1) == 0 else idx // block_size


def quantize(idx: torch.Tensor, values: torch.Tensor, exponents: torch.Tensor, block_size: int, world_size: int,
             words: int = 1) -> torch.Tensor:
    """Grid values of ``values`` (float64) at flat positions ``idx`` under agreed exponents: int32
    (one word per value), or int64 below ``2**P2`` (``words = 2``; :func:`quantize_words` splits
    them; the native kernel, which writes int32, is skipped)."""
    p = precision_bits(world_size, words)
    e = exponents.to(torch.int64)
    # No value lies in a block whose exponent is EMPTY; keep its (unused) shift in range.
    shift = torch.where(e == EMPTY_EXPONENT, torch.zeros_like(e), p - e)
    limit = float(2**p - 1)
    if (words == 1 and _native.AVAILABLE and idx.device.type == "cpu" and values.dtype == torch.float64
            and idx.dtype == torch.int64 and idx.is_contiguous() and values.is_contiguous()):  # one C pass, same steps
        f1, f2 = _block_factors(shift)
        return torch.from_numpy(_native.quantize_at64(idx.numpy(), values.numpy(), block_size, f1.numpy(),
                                                      None if f2 is None else f2.numpy(), limit))
    q = torch.round(_scale_by_block(values, _block_of(idx, block_size), shift)).clamp_(-limit, limit)
    return q.to(torch.int32 if words == 1 else torch.int64)


def quantize_words(idx: torch.Tensor, values: torch.Tensor, exponents: torch.Tensor, block_size: int,
                   world_size: int, words: int = 1) -> torch.Tensor:
    """(n, words) int32 words of :func:`quantize`: the grid value itself, or its two limbs
    (:func:`to_limbs`: low 16 bits unsigned, ``q >> 16`` signed)."""
    q = quantize(idx, values, exponents, block_size, world_size, words)
    return q.unsqueeze(1) if words == 1 else to_limbs(q, 2)


def join_words(sums: torch.Tensor) -> torch.Tensor:
    """(n, L) combined words of floats -> (n,) exact grid sums: the one column (int32), or for two
    words ``high * 2**16 + low`` in float64 (``|.| < 2**47``: exact)."""
    if sums.shape[1] == 1:
        return sums[:, 0]
    return sums[:, 1].to(torch.float64).mul_(65536.0).add_(sums[:, 0])


def places_natively(idx: torch.Tensor, values: torch.Tensor, words: torch.Tensor, block_size: int) -> bool:
    """Whether :func:`quantize_into_slots` runs (the native kernels, contiguous CPU int64 positions,
    float64 values and int32 bitmap words, blocks of a power of two)."""
    return (_native.AVAILABLE and block_size & (block_size - 1) == 0
            and all(t.device.type == "cpu" and t.is_contiguous() for t in (idx, values, words))
            and idx.dtype == torch.int64 and values.dtype == torch.float64 and words.dtype == torch.int32)


def quantize_into_slots(idx: torch.Tensor, values: torch.Tensor, exponents: torch.Tensor, block_size: int,
                        world_size: int, words: torch.Tensor, out: torch.Tensor) -> None:
    """``out[bit_ranks(words, idx)] = quantize(idx, values, exponents, ...)``: each local grid word
    straight into its slot among the set bits of the OR-combined bitmap ``words`` (which holds
    every bit of the sorted ``idx``), one native pass (:func:`places_natively` must hold); ``out``:
    contiguous int32, one slot per set bit; nothing else of it is written."""
    p = precision_bits(world_size)
    e = exponents.to(torch.int64)
    shift = torch.where(e == EMPTY_EXPONENT, torch.zeros_like(e), p - e)
    f1, f2 = _block_factors(shift)
    _native.quantize_place64(idx.numpy(), values.numpy(), block_size, f1.numpy(), None if f2 is None else f2.numpy(),
                             float(2**p - 1), words.numpy(), out.numpy())


def dequantize(idx: torch.Tensor, sums: torch.Tensor, exponents: torch.Tensor, block_size: int, world_size: int,
               dtype: torch.dtype, in_range: bool | None = None, words: int = 1) -> torch.Tensor:
    """Combined grid sums at positions ``idx`` (int32; for two words :func:`join_words`'s float64)
    -> values of ``dtype`` (one final rounding); ``in_range`` as :func:`float32_factors`."""
    shift = _dequantize_shift(exponents, world_size, words)
    blk = _block_of(idx, block_size)
    factor = (float32_factors(exponents, world_size, shift, in_range)
              if dtype == torch.float32 and words == 1 else None)
    if factor is not None:
        return sums.to(torch.float32) * factor.index_select(0, blk)
    return _scale_by_block(sums.to(torch.float64), blk, shift).to(dtype)


def _dequantize_shift(exponents: torch.Tensor, world_size: int, words: int = 1) -> torch.Tensor:
    e = exponents.to(torch.int64)
    # A block whose exponent is EMPTY can only hold zero sums; keep its shift in range.
    return torch.where(e == EMPTY_EXPONENT, torch.zeros_like(e), e - precision_bits(world_size, words))


def float32_in_range(exponents: torch.Tensor, world_size: int) -> torch.Tensor:
    """0-d bool tensor: whether :func:`float32_factors` gives factors (every block's decoding
    scale inside float32's normal range), computed where the exponents are, unread."""
    shift = _dequantize_shift(exponents, world_size)
    return ((shift >= -126) & (shift <= 96)).all()


def float32_factors(exponents: torch.Tensor, world_size: int, shift: torch.Tensor | None = None,
                    in_range: bool | None = None) -> torch.Tensor | None:
    """Per block, the float32 power of two that turns an int32 grid sum into its float32 result
    (``float32(sum) * factor``), or ``None`` when some block's scale leaves float32's normal range
    (then only float64 scaling and one rounding give the exact float32).

    Every nonzero result |sum| * 2**shift (1 <= |sum| < 2**31) with shift in [-126, 96] is a normal
    float32: rounding the sum to float32 once and scaling by an exact power of two gives the same
    float32 as scaling exactly in float64 and rounding once (round-to-nearest-even commutes with
    2**k).  ``in_range``: :func:`float32_in_range`'s value where the caller read it already."""
    if shift is None:
        shift = _dequantize_shift(exponents, world_size)
    if in_range is None:
        in_range = bool(((shift >= -126) & (shift <= 96)).all())
    if not in_range:
        return None
    return _pow2(shift, torch.float32)


def to_limbs(values: torch.Tensor, limbs: int) -> torch.Tensor:
    """(n,) integers -> (n, limbs) int32: 16-bit unsigned limbs, the top one signed."""
    v = values.to(torch.int64)
    parts = [(v >> (16 * k)) & 0xFFFF for k in range(limbs - 1)]
    parts.append(v >> (16 * (limbs - 1)))
    return torch.stack(parts, dim=1).to(torch.int32)


def from_limbs(sums: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(n, limbs) exact limb sums -> (n,) values of ``dtype``; IntegerOverflowError if out of range."""
    limbs = sums.shape[1]
    s = sums.to(torch.int64)
    carry = torch.zeros_like(s[:, 0])
    total = torch.zeros_like(carry)
    for k in range(limbs - 1):
        t = s[:, k] + carry
        total |= (t & 0xFFFF) << (16 * k)
        carry = t >> 16
    top = s[:, limbs - 1] + carry
    if bool(((top < -(2**15)) | (top >= 2**15)).any()):
        raise IntegerOverflowError(f"the exact integer sum does not fit {dtype}")
    total += top << (16 * (limbs - 1))
    info = torch.iinfo(dtype)
    if dtype != torch.int64 and bool(((total < info.min) | (total > info.max)).any()):
        raise IntegerOverflowError(f"the exact integer sum does not fit {dtype} [{info.min}, {info.max}]")
    return total.to(dtype)
