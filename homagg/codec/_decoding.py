"""How a worker turns combined words into its result: the decoding half of :class:`~homagg.codec._worker.Worker`.

:class:`Decoding` is a mixin of :class:`~homagg.codec._worker.Worker` (it uses the worker's input,
exponents and options): the dense result from every element's sums, the result at the union's
positions (bitmap or listed), and, for a device input, the one host read after a dense round
(:meth:`Decoding.read_dense`).  Invariant: the same values whichever path decodes (CPU native
kernels, numpy, torch on any device), bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from . import _bitmap, _blocks, _fixedpoint, _hostops, _sparse
from ._config import CodecConfig

__all__ = ["Decoding"]


class Decoding:
    """The result methods of :class:`~homagg.codec._worker.Worker` (see there for the attributes)."""

    cfg: CodecConfig
    world_size: int
    dtype: torch.dtype
    is_float: bool
    limbs: int
    numel: int
    device: torch.device
    like: torch.Tensor | None
    target: torch.Tensor | None
    exponents: torch.Tensor | None
    union: int
    device_path: bool
    _union_positions: torch.Tensor | None
    #: the local scan proved every element it found zero +0.0 (no -0.0 in the input): set by
    #: :attr:`Worker.idx` where the native scan can tell, else False (an in-place result is filled)
    plain_zeros: bool = False

    if TYPE_CHECKING:
        def fetch(self, **scalars: torch.Tensor) -> dict[str, int]: ...
    def decode(self, positions: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
        """Values of this call's dtype from the combined ``sums`` (U, L) at ``positions``."""
        if self.is_float:
            assert self.exponents is not None
            return _fixedpoint.dequantize(positions, _fixedpoint.join_words(sums), self.exponents,
                                          self.cfg.block_size, self.world_size, self.dtype, words=self.limbs)
        return _fixedpoint.from_limbs(sums, self.dtype)

    def read_dense(self, sums: torch.Tensor, bad: torch.Tensor | None) -> dict[str, int]:
        """After a dense round: ``redo`` (whether a block in ``bad`` must be redone) and, for a
        device input, what :meth:`dense_result` would read (the union's size, the float32
        decoding's range), with :meth:`fetch`'s history counts: one read."""
        if not self.device_path:  # the host reads ``bad`` (a CPU mask in numpy: one operation)
            if bad is None:
                return {"redo": 0}
            return {"redo": int(np.count_nonzero(bad.numpy()) > 0 if bad.is_cpu else bool(bad.any()))}
        redo = bad.any() if bad is not None else torch.zeros((), dtype=torch.bool, device=sums.device)
        union = torch.count_nonzero(sums.reshape(-1, self.limbs).any(dim=1) if self.limbs > 1 else sums)
        if self.dtype != torch.float32 or self.limbs > 1:
            return self.fetch(redo=redo, union=union)
        assert self.exponents is not None
        return self.fetch(redo=redo, union=union, float32_path=_blocks.decodes_in_float32(self.exponents,
                                                                                         self.world_size))

    def dense_result(self, sums: torch.Tensor, known: dict[str, int] | None = None) -> torch.Tensor:
        """Result from the combined words of *every* element (``sums``: (numel, L), or flat as
        combined: (numel * L,)); ``known``: :meth:`read_dense`'s figures of these sums, where read."""
        known = known or {}
        if self.like is not None:
            rows = sums.reshape(-1, self.limbs)
            nonzero = torch.nonzero(rows.any(dim=1)).squeeze(1)
            self.union = nonzero.numel()
            return self.result(nonzero, rows.index_select(0, nonzero))
        out = self.target if self.target is not None else torch.empty(self.numel, dtype=self.dtype, device=self.device)
        counted = None  # the native float32 kernels count the nonzero sums while they decode them
        if self.is_float:
            assert self.exponents is not None
            path = known.get("float32_path")
            counted = _blocks.dequantize_into(out, sums if sums.dim() == 1 else sums.reshape(-1), self.exponents,
                                              self.world_size, self.cfg.block_size,
                                              None if path is None else bool(path), self.limbs)
        else:
            out.copy_(_fixedpoint.from_limbs(sums.reshape(-1, self.limbs), self.dtype))
        if "union" in known:
            self.union = known["union"]
        else:
            self.union = counted if counted is not None else int(
                torch.count_nonzero(sums.reshape(-1, self.limbs).any(dim=1) if self.limbs > 1 else sums))
        return out

    def result_at_bits(self, words: torch.Tensor, sums: torch.Tensor, in_range: bool | None = None) -> torch.Tensor:
        """:meth:`result` at the set bits of the OR-combined bitmap ``words`` (``sums``: one row
        per set bit, in order); a dense float32 result is decoded from the bitmap in one pass,
        without listing the positions (:func:`homagg.codec._hostops.decode_bits_into_`), or at
        the union's positions where :meth:`union_values` listed them.  ``in_range``: as
        :func:`homagg.codec._fixedpoint.float32_factors`."""
        positions = self._union_positions
        if self.like is None and self.dtype == torch.float32 and self.limbs == 1:
            assert self.exponents is not None
            factor = _fixedpoint.float32_factors(self.exponents, self.world_size, in_range=in_range)
            if factor is not None:
                out = self._zeroed()
                if positions is not None:
                    _hostops.decode_into_(out, positions, sums[:, 0].contiguous(), factor, self.cfg.block_size)
                else:
                    _hostops.decode_bits_into_(out, words, sums[:, 0].contiguous(), factor, self.cfg.block_size)
                return out
        return self.result(_bitmap.unpack_positions(words) if positions is None else positions, sums, in_range)

    def result(self, positions: torch.Tensor, sums: torch.Tensor, in_range: bool | None = None) -> torch.Tensor:
        """Result holding the combined ``sums`` (U, L) at ``positions`` (which cover every local
        nonzero), +0.0 (integers: 0) elsewhere (:meth:`_zeroed`).  For a sparse input, a coalesced
        COO tensor of its layout.
        """
        if self.like is not None:
            values = self.decode(positions, sums)
            keep = torch.nonzero(values).squeeze(1)
            return _sparse.to_coo(positions.index_select(0, keep), values.index_select(0, keep), self.like)
        out = self._zeroed()
        if positions.numel():
            factor = None
            if self.dtype == torch.float32 and self.limbs == 1:
                assert self.exponents is not None
                factor = _fixedpoint.float32_factors(self.exponents, self.world_size, in_range=in_range)
            if factor is not None:  # decoded straight into the result (what decode + scatter_ give)
                _hostops.decode_into_(out, positions, sums[:, 0].contiguous(), factor, self.cfg.block_size)
            else:
                _hostops.scatter_(out, positions, self.decode(positions, sums))
        return out

    def _zeroed(self) -> torch.Tensor:
        """Where a result at the union's positions goes, every element +0.0 (integers: 0) before
        the union's sums are written: a fresh tensor, or the in-place target.  The target's
        elements outside the union are zeros already, but a float's may be -0.0: dense decodes
        every element (a zero sum to +0.0), so one fill (a memset, as out of place) gives every
        scheme dense's bits on every rank, whatever sign each rank's zeros had.  Where the native
        scan of the input (:attr:`plain_zeros`) found no -0.0, the target's zeros are +0.0 already
        and the fill is skipped (it cost a 25M-element in-place call ~13 ms per rank)."""
        out = self.target
        if out is None:
            return torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        if self.is_float and not self.plain_zeros:
            out.zero_()
        return out
