"""Packed nonzero bitmaps as int32 words (bit ``i % 32`` of word ``i // 32``), combined with OR.

Both directions cost O(number of set bits + words), never a Python loop: packing adds one power of
two per set position (bits are distinct, so ADD == OR), unpacking expands only the nonzero bytes.
"""

from __future__ import annotations

import torch

from . import _hostops

__all__ = ["bitmap_words", "pack_positions", "unpack_positions", "popcount", "word_bitmap", "select_words",
           "place_words", "two_level_words"]


def bitmap_words(numel: int) -> int:
    return -(-numel // 32)


def pack_positions(idx: torch.Tensor, numel: int) -> torch.Tensor:
    """Sorted or unsorted distinct flat positions -> int32 bitmap words
    (:func:`homagg.codec._hostops.bitmap_of`: bits are distinct, so ADD == OR)."""
    return _hostops.bitmap_of(idx, numel)


def unpack_positions(words: torch.Tensor) -> torch.Tensor:
    """int32 bitmap words -> sorted int64 flat positions of the set bits.

    Expands only nonzero *bytes* (8 candidates each) of the little-endian words, so the work is
    O(words + 8 * nonzero bytes) (:func:`homagg.codec._hostops.set_bit_positions`).
    """
    return _hostops.set_bit_positions(words.contiguous())


def popcount(words: torch.Tensor) -> int:
    """Number of set bits of int32 bitmap words (native popcount, else a byte table lookup; no
    Python loop)."""
    return _hostops.count_set_bits(words.contiguous())


# -- two-level bitmaps: a bitmap of the nonzero bitmap words, then only the words the union holds --
#
# Round A combines (OR) every worker's :func:`word_bitmap` (one bit per bitmap word: n/1024 words);
# its set bits are the words nonzero in *some* worker's bitmap, i.e. in the union's.  Round B
# combines (OR) each worker's words at those positions (:func:`select_words`, in the order of the
# set bits, identical on every worker); :func:`place_words` puts them back.  Both take the word
# bitmap itself: on CPU one native pass each, the held positions never listed.  Invariant: the
# result equals the OR of the full bitmaps, since every word left out is zero on every worker.


def word_bitmap(words: torch.Tensor) -> torch.Tensor:
    """int32 bitmap (one bit per word) of the nonzero words of the int32 bitmap ``words``."""
    return _hostops.nonzero_word_bitmap(words)


def select_words(words: torch.Tensor, held: torch.Tensor, count: int | None = None) -> torch.Tensor:
    """``words`` at the word positions whose bits are set in ``held``, the OR-combined
    :func:`word_bitmap` (in order; :func:`homagg.codec._hostops.select_by_bits`); ``count``, the
    number of those bits where known, spares a device its synchronisation."""
    return _hostops.select_by_bits(words, held, count)


def place_words(selected: torch.Tensor, held: torch.Tensor, n_words: int) -> torch.Tensor:
    """The full ``n_words`` bitmap from the OR-combined :func:`select_words` of the word bitmap
    ``held`` (zero elsewhere; :func:`homagg.codec._hostops.place_by_bits`)."""
    return _hostops.place_by_bits(selected, held, n_words)


def two_level_words(numel: int, union: float) -> float:
    """Expected words a worker sends for a two-level bitmap of ``numel`` elements whose union holds
    ``union`` distinct nonzeros, placed independently at random (clustered nonzeros fill fewer
    words, so this is an upper estimate): the word bitmap plus every word the union holds."""
    n_words = bitmap_words(numel)
    if numel <= 0:
        return 0.0
    held = 1.0 - (1.0 - min(1.0, union / numel)) ** 32  # chance that a word holds a nonzero
    return bitmap_words(n_words) + held * n_words
