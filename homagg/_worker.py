"""One worker's local view of one tensor, and the round helper every scheme uses.

:class:`Worker` holds the nonzero positions and values of the local tensor, quantises them under
a set of block exponents (agreed, or guessed from an earlier call), answers "my grid values at
these positions", and writes the decoded sums into the result (in place when asked).
:func:`exchange` yields one round of non-empty streams and accounts for it in the statistics.
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from . import _fixedpoint, _sparse
from ._config import CodecConfig
from ._errors import ProtocolError
from ._stats import WorkerStats
from .transport import Stream
from .wire import CombineOp

__all__ = ["Worker", "Round", "exchange"]

Round = list[Stream]


class Worker:
    """Local nonzeros of one tensor; ``grid`` holds their int32 words once :meth:`quantize` ran.

    Invariants: ``idx`` is sorted (flat positions of the nonzeros); ``grid`` rows align with
    ``idx``; ``exponents`` are the exponents ``grid`` was quantised with (floats) — after the
    protocol ends they are the *agreed* exponents of this call, which is what :attr:`union` and
    :attr:`exponents` record for the next call.
    """

    def __init__(self, tensor: torch.Tensor, world_size: int, cfg: CodecConfig, inplace: bool = False) -> None:
        """A dense (strided) tensor, or a sparse COO one (whose result is then a COO tensor too)."""
        self.like: torch.Tensor | None = None  # the sparse input whose layout the result takes
        if tensor.layout == torch.sparse_coo:
            self.like = tensor
            idx, raw = _sparse.flat_nonzeros(tensor)
            self.target = None
        else:
            flat = tensor.detach().reshape(-1)
            # In place: the result overwrites the input, whose zeros outside the union already hold.
            contiguous = inplace and flat.data_ptr() == tensor.data_ptr() and tensor.is_contiguous()
            self.target = flat if contiguous else None
            idx = torch.nonzero(flat).squeeze(1)  # NaN/Inf are nonzero, so checking these suffices
            raw = flat[idx]
        self.cfg = cfg
        self.world_size = world_size
        self.dtype = tensor.dtype
        self.is_float = _fixedpoint.is_float_dtype(tensor.dtype)
        self.limbs = _fixedpoint.limb_count(tensor.dtype)
        self.numel = tensor.numel()
        self.device = tensor.device
        self.idx = idx
        if self.is_float:
            self.raw = raw.to(torch.float64)
            _fixedpoint.check_finite(self.raw)
            self.local_exponents = _fixedpoint.block_exponents(self.idx, self.raw, self.numel, cfg.block_size)
        else:
            self.raw = raw
            self.local_exponents = None
        self.exponents: torch.Tensor | None = None
        self.grid: torch.Tensor | None = None  # (nnz, L) int32
        self.union = 0  # distinct nonzeros of the combined result (recorded for the next call)

    @property
    def blocks(self) -> int:
        return -(-self.numel // self.cfg.block_size)

    def exponent_streams(self) -> Round:
        return [] if self.local_exponents is None else [Stream("exponents", CombineOp.MAX, self.local_exponents)]

    def quantize(self, exponents: torch.Tensor | None) -> None:
        """Grid words of the local nonzeros: under ``exponents`` (floats) or as 16-bit limbs (ints)."""
        if self.is_float:
            assert exponents is not None
            self.exponents = exponents
            q = _fixedpoint.quantize(self.idx, self.raw, exponents, self.cfg.block_size, self.world_size)
            self.grid = q.unsqueeze(1)
        elif self.grid is None:
            self.grid = _fixedpoint.to_limbs(self.raw, self.limbs)

    def set_exponents(self, combined: list[torch.Tensor]) -> list[torch.Tensor]:
        """Consume the exponent stream (floats) from a round's results, quantise; return the rest."""
        if self.is_float:
            self.quantize(combined[0])
            return combined[1:]
        self.quantize(None)
        return combined

    def settle(self, guess: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
        """After a round quantised under ``guess``: adopt the agreed ``fresh`` exponents.

        Returns the bool mask of blocks to redo (fresh differs from the guess and the block holds a
        nonzero somewhere); the local words are re-quantised only when there is such a block.
        """
        bad = _fixedpoint.mismatched_blocks(guess, fresh)
        if bool(bad.any()):
            self.quantize(fresh)
        else:
            self.exponents = fresh  # equal to the guess wherever a value lies: grid stays valid
        return bad

    def values_at(self, positions: torch.Tensor) -> torch.Tensor:
        """(len(positions), L) int32 of this worker's grid values at sorted ``positions`` (0 if absent)."""
        assert self.grid is not None
        out = torch.zeros((positions.numel(), self.limbs), dtype=torch.int32, device=self.device)
        if self.idx.numel() and positions.numel():
            slot = torch.searchsorted(positions, self.idx)
            slot_c = slot.clamp(max=positions.numel() - 1)
            hit = positions[slot_c] == self.idx
            out[slot_c[hit]] = self.grid[hit]
        return out

    def dense_values(self) -> torch.Tensor:
        """(numel, L) int32 grid words, zero where this worker holds no value."""
        assert self.grid is not None
        values = torch.zeros((self.numel, self.limbs), dtype=torch.int32, device=self.device)
        values[self.idx] = self.grid
        return values

    def block_positions(self, bad: torch.Tensor) -> torch.Tensor:
        """Sorted flat positions of every element of the blocks flagged in ``bad``."""
        b = self.cfg.block_size
        starts = torch.nonzero(bad).squeeze(1) * b
        pos = (starts.unsqueeze(1) + torch.arange(b, device=self.device)).reshape(-1)
        return pos[pos < self.numel]

    def decode(self, positions: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
        """Values of this call's dtype from the combined ``sums`` (U, L) at ``positions``."""
        if self.is_float:
            assert self.exponents is not None
            return _fixedpoint.dequantize(positions, sums[:, 0], self.exponents, self.cfg.block_size,
                                          self.world_size, self.dtype)
        return _fixedpoint.from_limbs(sums, self.dtype)

    def result(self, positions: torch.Tensor, sums: torch.Tensor, covers_local: bool = True) -> torch.Tensor:
        """Flat result holding the combined ``sums`` (U, L) at ``positions``, zero elsewhere.

        In place, only ``positions`` are written (O(U), no fill): every other element is already
        zero in the input provided ``positions`` covers this worker's nonzeros (``covers_local``);
        otherwise those are cleared first.  For a sparse input, a coalesced COO tensor of its layout.
        """
        if self.like is not None:
            values = self.decode(positions, sums)
            keep = torch.nonzero(values).squeeze(1)
            return _sparse.to_coo(positions.index_select(0, keep), values.index_select(0, keep), self.like)
        if self.target is not None:
            out = self.target
            if not covers_local:
                out[self.idx] = 0
        else:
            out = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        if positions.numel():
            out[positions] = self.decode(positions, sums)
        return out


def exchange(streams: Round, stats: WorkerStats) -> Generator[Round, list[torch.Tensor], list[torch.Tensor]]:
    """Yield the non-empty streams as one round; return results aligned with ``streams``.

    An all-empty round is not sent (and not counted); its "results" are the empty inputs.
    """
    sent = [s for s in streams if s.words.numel()]
    for s in sent:
        stats.bytes_per_stream[s.name] += 4 * s.words.numel()
    combined = (yield sent) if sent else []
    stats.rounds += 1 if sent else 0
    if len(combined) != len(sent):
        raise ProtocolError(f"switch returned {len(combined)} streams for a round of {len(sent)}")
    it = iter(combined)
    return [next(it) if s.words.numel() else s.words.clone() for s in streams]
