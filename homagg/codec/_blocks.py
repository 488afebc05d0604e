"""Fixed point on a whole dense tensor, block by block: no index tensors, a few passes.

The same grid as :mod:`homagg.codec._fixedpoint` (the index path used for nonzero lists), computed on
``(blocks, block_size)`` views of the flat tensor (the last, partial block separately) with the
block's scale broadcast, instead of gathering one exponent per element through an int64 index.

Exactness (why the results are bit-identical to the index path):

* exponents: ``frexp(max |x|)`` per block equals the maximum of the elements' frexp exponents;
  a block whose maximum is 0 is EMPTY; a non-finite maximum means a NaN/Inf in the block.
* quantise: ``x * 2**(P - E)`` is a power-of-two scaling, exact in the input's own float type
  (float32 for float32/float16/bfloat16 inputs, float64 for float64) except where the result falls
  below the smallest normal, and such values round to 0 on both paths; ``round`` is
  round-half-even on both.  Values exceed the grid only under a wrong *guessed* exponent (their
  block is redone), where the clamp keeps every word inside ``+-(2**P - 1)``.
* dequantise: int32 sums -> float64 (exact) -> times ``2**(E - P)`` (exact) -> one rounding to the
  output dtype, exactly as the index path.

Contiguous float32 CPU tensors take the native kernels where they were built
(``homagg/codec/_dense_kernels.c`` via :mod:`homagg.codec._native`): each of the three steps one pass over
memory with no temporaries, computing the same float32 operations in the same order (bit for bit
the torch code below, which every other tensor takes; ``tests/test_dense_kernels.py``).  Their
per-block factors (and the local exponents' frexp) are computed on the host in numpy
(:mod:`homagg.codec._host_factors`: a few operations on a few hundred words instead of a dozen
small torch operations per call; the same bits, ``tests/test_host_factors.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from . import _host_factors, _hostops, _native
from .._buffers import WordPool
from .._errors import NonFiniteError
from ._fixedpoint import EMPTY_EXPONENT, _pow2, join_words, precision_bits

__all__ = ["exponents", "quantize", "dequantize_into", "decodes_in_float32", "float32_grid"]


def _parts(flat: torch.Tensor, block_size: int) -> Iterator[tuple[slice, torch.Tensor]]:
    """(block slice, (nb, width) view) of the full blocks, then of the last partial block."""
    n = flat.numel()
    full = n // block_size
    if full:
        yield slice(0, full), flat[: full * block_size].view(full, block_size)
    if n > full * block_size:
        yield slice(full, full + 1), flat[full * block_size:].view(1, -1)


#: the dense words of earlier calls, written in full again once unreferenced (no page faults)
_WORDS = WordPool()


def _grid_factors(e: torch.Tensor, p: int, lo: int, hi: int, work: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per block, the exact powers of two whose product is ``2**(P - E)`` (``E`` EMPTY: 1), each
    in ``work``'s normal range; the second is None where it is 1 in every block (on a device always
    given: multiplying by 1.0 is exact, and cheaper than reading whether it is needed)."""
    shift = torch.where(e == EMPTY_EXPONENT, torch.zeros_like(e), p - e).to(torch.int64)
    first = shift.clamp(lo, hi)
    rest = shift - first
    needed = not _hostops.reads_free(rest) or bool((rest != 0).any())
    return _pow2(first, work), (_pow2(rest.clamp(lo, hi), work) if needed else None)


def _float32_limit(p: int) -> float:
    """The clamp of float32 grid words: ``2**P - 1``, or for ``P > 24`` the largest float32 below
    ``2**P`` (``2**P - 1`` is no float32 there)."""
    return float(2**p - 1) if p <= 24 else float(2**p - 2 ** (p - 24))


def float32_grid(exps: torch.Tensor, world_size: int,
                 words: int = 1) -> tuple[np.ndarray, np.ndarray | None, float]:
    """(f1, f2, limit) of float32 grid words under block exponents ``exps``: what the native
    quantisers (``homagg_quantize32``, ``homagg_fill_quantize32``, ``homagg_quantize32_wide``)
    take, as contiguous host arrays; the torch path below computes the same per block (on the
    host in numpy: :func:`homagg.codec._host_factors.grid_factors32`)."""
    p = precision_bits(world_size, words)
    e = _host_factors.host_exponents(exps)
    if e is None:
        f1, f2 = _grid_factors(exps, p, -126, 127, torch.float32)
        return f1.cpu().numpy(), (None if f2 is None else f2.cpu().numpy()), _float32_limit(p)
    h1, h2 = _host_factors.grid_factors32_kept(e, p)  # read-only: the quantisers only read them
    return h1, h2, _float32_limit(p)


def _native_float32(*tensors: torch.Tensor) -> bool:
    """Whether the native kernels serve these tensors: built, float32/int32, contiguous, on the CPU
    (a plain loop: a steady call's decode asks it every call)."""
    if not _native.AVAILABLE:
        return False
    for t in tensors:
        if not (t.is_cpu and t.is_contiguous() and not t.requires_grad and t.dtype in _NATIVE_DTYPES):
            return False
    return True


_NATIVE_DTYPES = (torch.float32, torch.int32)


def exponents(flat: torch.Tensor, block_size: int) -> torch.Tensor:
    """int32 frexp exponent of each block's largest magnitude (EMPTY where all zero).

    Raises :class:`NonFiniteError` (before anything is sent) if the tensor holds NaN or +-Inf.
    """
    blocks = -(-flat.numel() // block_size)
    peaks = None
    if flat.dtype == torch.float32 and _native_float32(flat):
        peaks, bad = _native.block_peaks32(flat.numpy(), block_size)
    else:
        peak = torch.empty(blocks, dtype=flat.dtype, device=flat.device)
        for sl, view in _parts(flat, block_size):
            torch.maximum(view.amax(dim=1), view.amin(dim=1).neg_(), out=peak[sl])  # max |x|; NaN propagates
        bad = blocks > 0 and not bool(torch.isfinite(peak).all())
    if bad:
        count = int((~torch.isfinite(flat)).sum())
        raise NonFiniteError(f"input holds {count} non-finite value(s); nothing was sent")
    if peaks is not None:  # the host's peaks: frexp in numpy (the same exponents)
        return torch.from_numpy(_host_factors.frexp_exponents32(peaks))
    e = torch.frexp(peak.to(torch.float64)).exponent.to(torch.int32)
    return torch.where(peak == 0, torch.full_like(e, EMPTY_EXPONENT), e)


def quantize(flat: torch.Tensor, exps: torch.Tensor, world_size: int, block_size: int,
             mask: torch.Tensor | None = None, words: int = 1) -> torch.Tensor:
    """Flat int32 grid words of every element of the blocks (all, or those flagged in ``mask``):
    one per element, or with ``words = 2`` each element's two limbs in turn (low, high: the words
    of :func:`homagg.codec._fixedpoint.quantize_words`).  Wide grid integers ``q`` (``< 2**P2``)
    are exact in the work type, and so is their split there: ``high = floor(q * 2**-16)`` (a
    power-of-two scaling, then floor: ``q >> 16``) and ``low = q - high * 2**16`` (in ``[0,
    2**16)``, representable).  The native kernel (``homagg_quantize32_wide``) splits the integer: the same words."""
    work = torch.float64 if flat.dtype == torch.float64 else torch.float32
    lo, hi = (-1022, 1023) if work == torch.float64 else (-126, 127)
    p = precision_bits(world_size, words)
    limit = float(2**p - 1) if work == torch.float64 else _float32_limit(p)
    if mask is None:
        if flat.dtype == torch.float32 and _native_float32(flat) and (words == 1 or _native.WIDE):
            out = torch.from_numpy(_WORDS.take(flat.numel() * words))
            f1, f2, limit = float32_grid(exps, world_size, words)
            kernel = _native.quantize32 if words == 1 else _native.quantize32_wide
            kernel(flat.numpy(), block_size, f1, f2, limit, out.numpy())
            return out
        out = torch.empty(flat.numel() * words, dtype=torch.int32, device=flat.device)
    else:
        per_block = torch.full((exps.numel(),), block_size, dtype=torch.int64, device=flat.device)
        per_block[-1] = flat.numel() - (exps.numel() - 1) * block_size
        out = torch.empty(int(per_block[mask].sum()) * words, dtype=torch.int32, device=flat.device)
    at = 0
    for sl, view in _parts(flat, block_size):
        e = exps[sl]
        if mask is not None:
            keep = torch.nonzero(mask[sl]).squeeze(1)
            view, e = view.index_select(0, keep), e.index_select(0, keep)
        f1, f2 = _grid_factors(e, p, lo, hi, work)
        x = view.to(work) * f1.unsqueeze(1)
        if f2 is not None:
            x.mul_(f2.unsqueeze(1))
        n = x.numel()
        x.round_().clamp_(-limit, limit)  # exact: integers below 2**P
        dst = out[at:at + n * words].view(*x.shape, words)
        if words == 2:
            high = torch.floor(x * 2.0**-16)
            dst[..., 1].copy_(high)
            x.add_(high, alpha=-65536.0)  # the low limb, exactly
        dst[..., 0].copy_(x)
        at += n * words
    return out


def decodes_in_float32(exps: torch.Tensor, world_size: int) -> torch.Tensor:
    """0-d bool tensor, unread: whether :func:`dequantize_into` may take its float32 path for a
    float32 output (every block's ``E - P`` in ``[-126, 127]``)."""
    shift = _decode_shift(exps, world_size)
    if shift.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=exps.device)
    return (shift.min() >= -126) & (shift.max() <= 127)


def _decode_shift(exps: torch.Tensor, world_size: int, words: int = 1) -> torch.Tensor:
    e = exps.to(torch.int64)
    return torch.where(e == EMPTY_EXPONENT, torch.zeros_like(e), e - precision_bits(world_size, words))


def dequantize_into(out: torch.Tensor, sums: torch.Tensor, exps: torch.Tensor, world_size: int,
                    block_size: int, float32_path: bool | None = None, words: int = 1) -> int | None:
    """Write the decoded values of the flat int32 ``sums`` (every element) into flat ``out``;
    return ``count_nonzero(sums)`` where the native kernel counted it in the same pass, else None.
    ``words = 2``: ``sums`` holds each element's two words (low, high), joined into the exact grid
    sum in float64 (:func:`homagg.codec._fixedpoint.join_words`), scaled there, rounded once (a
    float32 output natively: ``homagg_dequantize_wide``, which counts the elements with a nonzero
    word).

    float32 output whose every block has ``E - P >= -126`` (all results normal or zero) takes a
    float32 path: int32 -> float32 rounds once (to nearest even) and the power-of-two scaling is
    exact, which is the same single rounding as the float64 path; other cases use float64.
    ``float32_path``: :func:`decodes_in_float32`'s value where the caller read it already.

    The one native float32 decode (contiguous CPU tensors, one word per element, every ``E - P``
    in float32's range): ``homagg_dequantize32`` on the tensors' addresses under the factors kept
    per exponent set (:func:`homagg.codec._host_factors.decode_factors32_kept`: a steady call's
    agreed exponents repeat, so it builds no factor array, numpy view or ``ctypes.data`` per
    call); everything else takes the torch code below, as every device tensor does.
    """
    if out.dtype == torch.float32 and sums.dtype == torch.int32 and exps.is_cpu and _native_float32(out, sums):
        host = exps.numpy()  # the native kernels, their factors computed in numpy (bit for bit the torch code's)
        p = precision_bits(world_size, words)
        if words == 2 and _native.WIDE:
            f1, f2 = _host_factors.decode_factors64(host, p)
            return _native.dequantize_wide(sums.numpy(), block_size, f1, f2, out.numpy())
        if words == 1 and float32_path is not False and sums.numel() == out.numel():
            kept = _host_factors.decode_factors32_kept(host, p)  # a steady call's exponents repeat
            if kept is not None:  # the kernel on the tensors' addresses: no numpy views per call
                factor, address = kept
                return _native.dequantize32_at(sums.data_ptr(), out.data_ptr(), out.numel(), block_size,
                                               address, factor.size)
            float32_path = False  # some block's E - P is outside float32's range: float64 below
    shift = _decode_shift(exps, world_size, words)
    if words == 2:
        sums = join_words(sums.view(-1, 2))
        float32_path = False
    elif float32_path is None and out.dtype == torch.float32:
        float32_path = bool(decodes_in_float32(exps, world_size))
    fast = out.dtype == torch.float32 and bool(float32_path)
    for (sl, dst), (_, src) in zip(_parts(out, block_size), _parts(sums, block_size), strict=True):
        if fast:  # int32 -> float32 (one rounding), times an exact power of two, in one pass
            torch.mul(src, _pow2(shift[sl], torch.float32).unsqueeze(1), out=dst)
            continue
        first = shift[sl].clamp(-1000, 1000)
        x = src.to(torch.float64) * _pow2(first, torch.float64).unsqueeze(1)
        rest = shift[sl] - first
        if not _hostops.reads_free(rest) or bool((rest != 0).any()):
            x.mul_(_pow2(rest.clamp(-1000, 1000), torch.float64).unsqueeze(1))
        dst.copy_(x)
    return None
