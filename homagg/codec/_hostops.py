"""The codec's O(n) scans and scatters, fast on CPU tensors, plain torch elsewhere.

On a CPU the codec's cost at low density is a handful of whole-tensor passes: finding the local
nonzeros, expanding the combined bitmap, locating the local positions in the union and writing
the result.  torch's CPU ``nonzero`` makes two passes and allocates a tensor-sized temporary,
which on a virtual machine mostly costs page faults (measured, 25M fp32, 1% nonzeros, one core:
``torch.nonzero`` 43 ms, the chunked scan below 14 ms; bitmap expansion 43 ms -> 8 ms;
``searchsorted`` 16 ms -> 9 ms; the result scatter 14 ms -> 7 ms).  Here those passes run through
numpy on views of the same memory (no copies), in cache-sized chunks with reused buffers.

Where the optional native kernels are built (:mod:`homagg.codec._native`), contiguous 32-bit CPU data
skips numpy's passes: the scan packs the bitmap in one vectorised pass and lists the positions
from it (25M fp32 at 1%: 11 -> 7 ms), set bits are decoded four per step (a 2.5% union of 25M:
4.7 -> 2.6 ms), slots in the union take two branch-free passes (0.50 -> 0.15 ms per 2**23
elements), and float32 results are decoded straight into the output (:func:`decode_into_`).

Every function returns exactly what its torch fallback returns (same values, dtype int64 for
positions, same order); the fallback runs for tensors on other devices (CUDA: torch's kernels are
the fast path there) and for dtypes numpy has no type for.  ``tests/test_hostops.py`` checks both
paths against each other.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from . import _native

__all__ = ["nonzero_positions", "nonzeros_and_bitmap", "nonzero_word_bitmap", "bitmap_of", "set_bit_positions", "bit_ranks", "sorted_slots", "decode_into_",
           "decode_bits_into_", "count_set_bits", "select_by_bits", "place_by_bits", "scatter_", "gather",
           "reads_free", "nonzero_bitmap", "set_bit_count", "on_host_copy"]

_CHUNK = 1 << 20  #: elements per chunk of the nonzero scan (its bool buffer stays in cache)

#: dtypes whose numpy view compares with 0 exactly as torch does (-0.0 == 0, NaN != 0)
_DIRECT = {torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
           torch.int64}


def _host(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad


def reads_free(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s values on the host costs no device synchronisation (a CPU tensor).
    Where it does (CUDA), the codec batches what it must read into one transfer per round and
    makes no read it can avoid: sizes it already knows, checks it can fold into arithmetic."""
    return t.is_cpu  # the same as ``t.device.type == "cpu"``, without building a device object


def nonzero_positions(flat: torch.Tensor) -> torch.Tensor:
    """Sorted int64 positions of the nonzero elements of 1-D ``flat`` (``-0.0`` counts as zero,
    NaN as nonzero), as ``torch.nonzero(flat).squeeze(1)``."""
    return _scan(flat, with_values=False)[0]


def nonzeros_and_bitmap(flat: torch.Tensor, capacity: int | None = None,
                        odd: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(positions, values, words)`` of the nonzero elements of 1-D ``flat``: the positions as
    :func:`nonzero_positions`, the values ``flat[positions]`` (``flat``'s dtype) and the int32
    bitmap words of the positions (``bitmap_of(positions, flat.numel())``).  On CPU one pass: each
    chunk's values are gathered and its mask packed while the chunk is still in cache
    (``np.packbits``: ~1 ms per 25M elements, against 3-13 ms for :func:`bitmap_of` at 1-10%).
    The native scan lists the positions and values in its pass too while they fit ``capacity``
    (an expected count, e.g. the last call's local count; default an eighth of the elements), else
    from the bitmap afterwards: the same results either way.  ``odd``: the native scan appends the
    OR of the bits of the elements it found zero (0: every zero is +0.0), where it can tell."""
    positions, values, words = _scan(flat, with_values=True, with_bitmap=True, capacity=capacity, odd=odd)
    assert values is not None
    return positions, values, words if words is not None else bitmap_of(positions, flat.numel())


#: 32-bit dtypes of the native scan, and the bits that make an element nonzero (not a float's sign)
_NATIVE_MASKS = {torch.float32: 0x7FFFFFFF, torch.int32: 0xFFFFFFFF}


def _scan(flat: torch.Tensor, with_values: bool, with_bitmap: bool = False, capacity: int | None = None,
          odd: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The chunked scan behind both: positions, the values and the packed bitmap only when asked
    for (no bitmap from the torch fallback: the caller packs the positions)."""
    if not _host(flat) or flat.dim() != 1 or flat.dtype not in _DIRECT and flat.dtype != torch.bfloat16:
        idx = torch.nonzero(flat).squeeze(1)
        return idx, flat[idx] if with_values else None, None
    if _native.AVAILABLE and flat.dtype in _NATIVE_MASKS:
        return _native_scan(flat, with_values, flat.numel() // 8 if capacity is None else capacity, odd)
    bf16 = flat.dtype == torch.bfloat16  # numpy has no bfloat16: its bits without the sign bit
    a = flat.view(torch.int16).numpy() if bf16 else flat.numpy()
    n = a.size
    mask = np.empty(min(n, _CHUNK), dtype=bool)
    bits = np.empty(min(n, _CHUNK), dtype=np.int16) if bf16 else None
    # chunks of whole bytes (8 elements) pack in place; the last chunk's final byte is zero-padded
    packed = _bitmap_bytes(n) if with_bitmap and _CHUNK % 8 == 0 else None
    parts, vals = [], []
    for off in range(0, n, _CHUNK):
        chunk = a[off:off + _CHUNK]
        m = mask[: chunk.size]
        if bits is not None:
            np.bitwise_and(chunk, 0x7FFF, out=bits[: chunk.size])
            np.not_equal(bits[: chunk.size], 0, out=m)
        else:
            np.not_equal(chunk, 0, out=m)
        if packed is not None:
            row = np.packbits(m, bitorder="little")
            packed[off // 8: off // 8 + row.size] = row
        found = np.flatnonzero(m)
        if found.size:
            if with_values:
                vals.append(chunk.take(found))
            found += off
            parts.append(found)
    found_all = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    positions = torch.from_numpy(found_all.astype(np.int64, copy=False))
    words = torch.from_numpy(packed.view(np.int32)) if packed is not None else None
    if not with_values:
        return positions, None, words
    values = torch.from_numpy(np.concatenate(vals) if vals else np.empty(0, dtype=a.dtype))
    return positions, values.view(torch.bfloat16) if bf16 else values, words


def _native_scan(flat: torch.Tensor, with_values: bool, capacity: int,
                 odd: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """:func:`_scan` of a 32-bit tensor by the native kernels: one packing pass over the input that
    also lists the positions and gathers the values while they fit ``capacity`` entries
    (:func:`homagg.codec._native.scan32`)."""
    words, positions, values = _native.scan32(flat.numpy(), _NATIVE_MASKS[flat.dtype], capacity, with_values, odd)
    return (torch.from_numpy(positions), torch.from_numpy(values) if values is not None else None,
            torch.from_numpy(words))


def _bitmap_bytes(n: int) -> np.ndarray:
    """Zeroed bytes of the int32 bitmap words of ``n`` positions, for ``np.packbits`` rows
    (little bit order: byte ``k`` holds positions ``8k .. 8k+7``)."""
    return np.zeros(4 * -(-n // 32), dtype=np.uint8)


def bitmap_of(idx: torch.Tensor, numel: int) -> torch.Tensor:
    """int32 bitmap words (bit ``i % 32`` of word ``i // 32``) of distinct int64 positions ``idx``.

    Distinct bits of a word add up to their OR; on CPU the per-word sums are a weighted
    ``bincount`` in float64, exact (below ``2**32``)."""
    words = -(-numel // 32)
    if not _host(idx) or words == 0:
        out = torch.zeros(words, dtype=torch.int64, device=idx.device)
        out.index_add_(0, idx >> 5, torch.ones_like(idx) << (idx & 31))
        return (out - ((out >> 31) << 32)).to(torch.int32)  # reinterpret the low 32 bits as signed
    p = idx.numpy()
    bits = np.left_shift(np.uint32(1), (p & 31).astype(np.uint32)).astype(np.float64)
    sums = np.bincount(p >> 5, weights=bits, minlength=words)
    return torch.from_numpy(sums.astype(np.uint32).view(np.int32))


def nonzero_word_bitmap(words: torch.Tensor) -> torch.Tensor:
    """int32 bitmap (bit ``j % 32`` of word ``j // 32``) of the nonzero entries of 1-D ``words``:
    ``bitmap_of(nonzero_positions(words), words.numel())``; on CPU one compare and ``np.packbits``."""
    if not _host(words):
        return nonzero_bitmap(words)
    packed = _bitmap_bytes(words.numel())
    row = np.packbits(words.numpy() != 0, bitorder="little")
    packed[: row.size] = row
    return torch.from_numpy(packed.view(np.int32))


def set_bit_positions(words: torch.Tensor, count: int | None = None) -> torch.Tensor:
    """Sorted int64 positions of the set bits of int32 bitmap ``words`` (bit ``i % 32`` of word
    ``i // 32``).  Only nonzero bytes are expanded: O(words + 8 * nonzero bytes); where most bytes
    are nonzero (a union of a few % of the elements and up), every bit is listed in one pass
    instead, which skips the byte gather and the position arithmetic (measured, 2**23 elements:
    35 -> 6 ms at 88% nonzero bytes; 3.3 ms either way below 20%).

    ``count``, the number of set bits where the caller knows it, lets a device tensor's bits be
    listed without a synchronisation (``torch.nonzero_static``)."""
    if not _host(words):
        return _set_bit_positions_torch(words) if count is None else _set_bits_counted(words, count)
    if _native.AVAILABLE and words.dtype == torch.int32:
        return torch.from_numpy(_native.set_bits32(words.numpy()))
    as_bytes = words.numpy().view(np.uint8)
    if 2 * np.count_nonzero(as_bytes) > as_bytes.size:
        return torch.from_numpy(np.flatnonzero(np.unpackbits(as_bytes, bitorder="little").view(bool)))
    nz = np.flatnonzero(as_bytes != 0)
    bits = np.unpackbits(as_bytes[nz], bitorder="little").view(bool)
    found = np.flatnonzero(bits)
    out = nz[found >> 3]
    out <<= 3
    out += found & 7
    return torch.from_numpy(out.astype(np.int64, copy=False))


def _set_bit_positions_torch(words: torch.Tensor) -> torch.Tensor:
    as_bytes = words.contiguous().view(torch.uint8)
    nz = torch.nonzero(as_bytes).squeeze(1)
    if nz.numel() == 0:
        return nz
    shifts = torch.arange(8, dtype=torch.uint8, device=words.device)
    bits = (as_bytes[nz].unsqueeze(1) >> shifts) & 1
    byte_idx, bit = torch.nonzero(bits, as_tuple=True)
    return nz[byte_idx] * 8 + bit


def _set_bits_counted(words: torch.Tensor, count: int) -> torch.Tensor:
    """:func:`_set_bit_positions_torch` of ``words`` holding ``count`` set bits, listed without
    reading the device: every bit expanded to a byte (little-endian: position ``8 * byte + bit``)."""
    as_bytes = words.contiguous().view(torch.uint8)
    bits = (as_bytes.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8, device=words.device)) & 1
    return torch.nonzero_static(bits.view(-1), size=count).squeeze(1)


def nonzero_bitmap(flat: torch.Tensor) -> torch.Tensor:
    """int32 bitmap words of the nonzero elements of 1-D ``flat`` (``-0.0`` counts as zero, NaN as
    nonzero): ``bitmap_of(nonzero_positions(flat), flat.numel())`` without listing the positions
    (on a device, no synchronisation: a mask packed eight elements to a byte)."""
    if _host(flat):
        return nonzeros_and_bitmap(flat)[2]
    n = flat.numel()
    mask = torch.zeros(32 * -(-n // 32), dtype=torch.bool, device=flat.device)
    torch.ne(flat, 0, out=mask[:n])
    weights = _constant(_BIT_WEIGHTS, flat.device)
    packed = (mask.view(-1, 8).view(torch.uint8) * weights).sum(dim=1, dtype=torch.uint8)
    return packed.view(torch.int32)


def set_bit_count(words: torch.Tensor) -> torch.Tensor:
    """The number of set bits of int32 bitmap ``words`` as a 0-d int64 tensor on their device (no
    host read: :func:`count_set_bits` is its value)."""
    as_bytes = words.contiguous().view(torch.uint8).to(torch.int64)
    return _constant(BYTE_BITS, words.device)[as_bytes].sum()


BYTE_BITS = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int64)  #: set bits of each byte value
_BIT_WEIGHTS = torch.tensor([1 << j for j in range(8)], dtype=torch.uint8)  #: bit j of a byte
_CONSTANTS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _constant(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``table`` (a constant of this module) on ``device``, copied there once."""
    if device.type == "cpu":
        return table
    key = (id(table), device)
    if key not in _CONSTANTS:
        _CONSTANTS[key] = table.to(device)
    return _CONSTANTS[key]


def bit_ranks(words: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """For int64 ``positions`` whose bits are set in the int32 bitmap ``words``: how many set bits
    come before each (its slot among the set bits), i.e. ``searchsorted(set_bit_positions(words),
    positions)``, from per-word popcounts and their prefix sums (O(words + positions))."""
    if _native.AVAILABLE and _host(words) and _host(positions) and words.dtype == torch.int32:
        return torch.from_numpy(_native.bit_ranks32(words.numpy(), positions.numpy()))
    if _host(words) and _host(positions) and hasattr(np, "bitwise_count"):
        w = words.numpy().view(np.uint32)
        counts = np.bitwise_count(w)
        before = np.cumsum(counts, dtype=np.int64)
        before -= counts
        p = positions.numpy()
        wi = p >> 5
        below = w[wi] & ((np.uint32(1) << (p & 31).astype(np.uint32)) - np.uint32(1))
        out = before[wi]
        out += np.bitwise_count(below)
        return torch.from_numpy(out)
    as_bytes = words.contiguous().view(torch.uint8).to(torch.int64)
    table = _constant(BYTE_BITS, words.device)
    per_word = table[as_bytes].view(-1, 4).sum(dim=1)
    before = torch.cumsum(per_word, 0) - per_word
    wi = positions >> 5
    below = (words.index_select(0, wi).to(torch.int64) & 0xFFFFFFFF) & ((1 << (positions & 31)) - 1)
    low = table[below & 0xFF] + table[(below >> 8) & 0xFF] + table[(below >> 16) & 0xFF] + table[below >> 24]
    return before.index_select(0, wi) + low


def sorted_slots(haystack: torch.Tensor, needles: torch.Tensor) -> torch.Tensor:
    """``torch.searchsorted(haystack, needles)`` (left) for sorted int64 ``haystack``."""
    if not (_host(haystack) and _host(needles)):
        return torch.searchsorted(haystack, needles)
    return torch.from_numpy(np.searchsorted(haystack.numpy(), needles.numpy()).astype(np.int64, copy=False))


def gather(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``src[index]`` for 1-D ``src`` and int64 ``index``."""
    if not (_host(src) and _host(index)) or src.dtype == torch.bfloat16:
        return src[index]
    return torch.from_numpy(src.numpy().take(index.numpy()))


def decode_into_(out: torch.Tensor, positions: torch.Tensor, sums: torch.Tensor, factor: torch.Tensor,
                 block_size: int) -> None:
    """``out[positions] = sums.to(float32) * factor[positions // block_size]`` for 1-D float32
    ``out`` (distinct positions, int32 ``sums``, one float32 factor per block): on CPU one native
    pass without the block index, gathered factors and decoded values as temporaries."""
    if (_native.AVAILABLE and block_size & (block_size - 1) == 0 and out.dtype == torch.float32
            and sums.dtype == torch.int32 and _host(out) and _host(positions) and _host(sums) and _host(factor)):
        _native.decode_into32(out.numpy(), positions.numpy(), sums.numpy(), factor.numpy(), block_size.bit_length() - 1)
        return
    scatter_(out, positions, sums.to(torch.float32) * factor.index_select(0, positions // block_size))


def count_set_bits(words: torch.Tensor) -> int:
    """Number of set bits of int32 bitmap ``words`` (one native pass where built)."""
    if _native.AVAILABLE and _host(words) and words.dtype == torch.int32:
        return _native.count_bits32(words.numpy())
    as_bytes = words.contiguous().view(torch.uint8).to(torch.int64)
    return int(_constant(BYTE_BITS, words.device)[as_bytes].sum())


def decode_bits_into_(out: torch.Tensor, words: torch.Tensor, sums: torch.Tensor, factor: torch.Tensor,
                      block_size: int) -> None:
    """``decode_into_(out, set_bit_positions(words), sums, factor, block_size)``: on CPU one native
    pass over the bitmap, the positions never listed."""
    if (_native.AVAILABLE and block_size & (block_size - 1) == 0 and out.dtype == torch.float32
            and sums.dtype == torch.int32 and words.dtype == torch.int32 and _host(out) and _host(words)
            and _host(sums) and _host(factor)):
        _native.decode_bits32(out.numpy(), words.numpy(), sums.numpy(), factor.numpy(), block_size.bit_length() - 1)
        return
    decode_into_(out, set_bit_positions(words), sums, factor, block_size)


def select_by_bits(src: torch.Tensor, mask: torch.Tensor, count: int | None = None) -> torch.Tensor:
    """``gather(src, set_bit_positions(mask))`` for 1-D int32 ``src`` and an int32 bitmap ``mask``
    of its elements (no bit set past ``src``): on CPU one native pass, the positions never listed."""
    if _native.AVAILABLE and _host(src) and _host(mask) and src.dtype == mask.dtype == torch.int32:
        return torch.from_numpy(_native.select_bits32(mask.numpy(), src.numpy()))
    return gather(src, set_bit_positions(mask, count))


def place_by_bits(vals: torch.Tensor, mask: torch.Tensor, n: int) -> torch.Tensor:
    """int32 tensor of ``n`` elements: ``vals`` at the set bits of ``mask`` (all below ``n``), 0
    elsewhere -- :func:`select_by_bits`'s inverse; on CPU one native pass."""
    if _native.AVAILABLE and _host(vals) and _host(mask) and vals.dtype == mask.dtype == torch.int32:
        return torch.from_numpy(_native.place_bits32(mask.numpy(), vals.numpy(), n))
    out = torch.zeros(n, dtype=torch.int32, device=vals.device)
    scatter_(out, set_bit_positions(mask, vals.numel()), vals)  # one value per set bit
    return out


def scatter_(out: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """``out[index] = values`` for 1-D ``out`` (distinct ``index``; ``values`` of ``out``'s dtype)."""
    if not (_host(out) and _host(index) and _host(values)) or out.dtype == torch.bfloat16:
        out[index] = values
        return
    out.numpy()[index.numpy()] = values.numpy()


def on_host_copy(tensor: torch.Tensor, inplace: bool, run: Callable[[torch.Tensor], object]) -> torch.Tensor:
    """A device tensor's call on a host copy: ``run`` on a contiguous CPU copy (in place), then the
    result back, into ``tensor``'s memory where ``inplace`` (through a detached view: a leaf that
    requires grad takes no in-place op itself), else as a new tensor on its device.  One transfer
    each way; the host call's results, bit for bit."""
    host = tensor.detach().to("cpu").contiguous()
    run(host)
    if not inplace:
        return host.to(tensor.device)
    tensor.detach().copy_(host)
    return tensor
