"""Packed nonzero bitmaps as int32 words (bit ``i % 32`` of word ``i // 32``), combined with OR.

Both directions cost O(number of set bits + words), never a Python loop: packing adds one power of
two per set position (bits are distinct, so ADD == OR), unpacking expands only the nonzero words.
"""

from __future__ import annotations

import torch

__all__ = ["bitmap_words", "pack_positions", "unpack_positions"]


def bitmap_words(numel: int) -> int:
    return -(-numel // 32)


def pack_positions(idx: torch.Tensor, numel: int) -> torch.Tensor:
    """Sorted or unsorted distinct flat positions -> int32 bitmap words."""
    words = torch.zeros(bitmap_words(numel), dtype=torch.int64, device=idx.device)
    words.index_add_(0, idx >> 5, torch.ones_like(idx) << (idx & 31))
    return (words - ((words >> 31) << 32)).to(torch.int32)  # reinterpret the low 32 bits as signed


def unpack_positions(words: torch.Tensor) -> torch.Tensor:
    """int32 bitmap words -> sorted int64 flat positions of the set bits."""
    nz = torch.nonzero(words).squeeze(1)
    if nz.numel() == 0:
        return nz
    bits = (words[nz].to(torch.int64).unsqueeze(1) >> torch.arange(32, device=words.device)) & 1
    word_idx, bit = torch.nonzero(bits, as_tuple=True)
    return nz[word_idx] * 32 + bit
