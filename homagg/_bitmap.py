"""Packed nonzero bitmaps as int32 words (bit ``i % 32`` of word ``i // 32``), combined with OR.

Both directions cost O(number of set bits + words), never a Python loop: packing adds one power of
two per set position (bits are distinct, so ADD == OR), unpacking expands only the nonzero bytes.
"""

from __future__ import annotations

import torch

from . import _hostops
from ._hostops import BYTE_BITS

__all__ = ["bitmap_words", "pack_positions", "unpack_positions", "popcount"]


def bitmap_words(numel: int) -> int:
    return -(-numel // 32)


def pack_positions(idx: torch.Tensor, numel: int) -> torch.Tensor:
    """Sorted or unsorted distinct flat positions -> int32 bitmap words
    (:func:`homagg._hostops.bitmap_of`: bits are distinct, so ADD == OR)."""
    return _hostops.bitmap_of(idx, numel)


def unpack_positions(words: torch.Tensor) -> torch.Tensor:
    """int32 bitmap words -> sorted int64 flat positions of the set bits.

    Expands only nonzero *bytes* (8 candidates each) of the little-endian words, so the work is
    O(words + 8 * nonzero bytes) (:func:`homagg._hostops.set_bit_positions`).
    """
    return _hostops.set_bit_positions(words.contiguous())


def popcount(words: torch.Tensor) -> int:
    """Number of set bits of int32 bitmap words (a byte table lookup, no Python loop)."""
    as_bytes = words.contiguous().view(torch.uint8).to(torch.int64)
    return int(BYTE_BITS.to(words.device)[as_bytes].sum())
