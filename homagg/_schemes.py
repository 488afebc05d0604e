"""Worker-side protocols of the schemes, written as generators of rounds.

A protocol yields a round (a list of :class:`~homagg._switch.Stream`), receives the combined
words, and finally returns the result tensor.  It never knows how words travel.

Rounds (floats; integers have no exponent stream, ``n`` elements, ``U`` distinct nonzeros over all
workers, ``L`` words per element, ``B`` elements per exponent block):

=========  ===============================================  ================================
scheme     rounds                                           words sent per worker
=========  ===============================================  ================================
dense      1 exponents(MAX) ; 2 values(ADD)                 n/B + nL
compact    1 exponents(MAX) + bitmap(OR) ; 2 values at U    n/B + n/32 + UL
sketch     1 exponents(MAX) + union stats(MAX/ADD) ;        n/B + R + n/32 + cL   (c ~ 1.3U)
           2 bitmap(OR) + count sketch(ADD) ;
           3 repair(ADD) only if the 2-core is non-empty    + (2-core size) L
auto       round 1 of sketch, then the continuation with
           the lowest modelled cost (see :func:`choose`)
=========  ===============================================  ================================

Every scheme quantises with the same agreed exponents, so the integer sums, and therefore the
results, are bit-identical across schemes.
"""

from __future__ import annotations

from collections.abc import Generator

import torch

from . import _bitmap, _fixedpoint, _sketch
from ._config import CodecConfig, check_scheme
from ._errors import ProtocolError
from ._hashing import hll_estimate, hll_registers
from ._stats import WorkerStats
from ._switch import CombineOp, Stream

__all__ = ["protocol", "choose", "Round"]

Round = list[Stream]
Protocol = Generator[Round, list[torch.Tensor], torch.Tensor]


def choose(numel: int, union_estimate: float, limbs: int, cfg: CodecConfig) -> str:
    """``auto``'s choice once the union size is estimated (round 1 is already paid).

    Cost of a continuation = bytes on the wire / bandwidth + further rounds * RTT, with
    dense: ``4nL`` bytes, 1 round; sketch: ``n/8 + 4cL`` bytes (c cells), 1 round (a repair round
    is rare at the configured overhead); compact: ``n/8 + 4UL`` bytes, 2 rounds (its bitmap must
    come back before values can be placed).  Ties go to the simpler scheme.  The inputs are
    agreed by all workers, so every worker chooses the same continuation.
    """
    bandwidth = cfg.bandwidth_gbps * 1e9 / 8
    rtt = cfg.rtt_us * 1e-6
    cells = cfg.sketch_cells or _sketch.sketch_cells(union_estimate, cfg.sketch_overhead)
    costs = {
        "dense": 4 * numel * limbs / bandwidth + rtt,
        "compact": (numel / 8 + 4 * union_estimate * limbs) / bandwidth + 2 * rtt,
        "sketch": (numel / 8 + 4 * cells * limbs) / bandwidth + rtt,
    }
    return min(costs, key=lambda k: costs[k])


class _Worker:
    """One worker's local view of one tensor: nonzero positions and (later) their grid values."""

    def __init__(self, tensor: torch.Tensor, world_size: int, cfg: CodecConfig, inplace: bool = False) -> None:
        self.cfg = cfg
        self.world_size = world_size
        self.dtype = tensor.dtype
        self.is_float = _fixedpoint.is_float_dtype(tensor.dtype)
        self.limbs = _fixedpoint.limb_count(tensor.dtype)
        flat = tensor.detach().reshape(-1)
        # In place: the result overwrites the input, whose zeros outside the union already hold.
        self.target = flat if inplace and flat.data_ptr() == tensor.data_ptr() and tensor.is_contiguous() else None
        self.numel = flat.numel()
        self.device = flat.device
        self.idx = torch.nonzero(flat).squeeze(1)  # NaN/Inf are nonzero, so checking these suffices
        raw = flat[self.idx]
        if self.is_float:
            self.raw = raw.to(torch.float64)
            _fixedpoint.check_finite(self.raw)
            self.local_exponents = _fixedpoint.block_exponents(self.idx, self.raw, self.numel, cfg.block_size)
        else:
            self.raw = raw
            self.local_exponents = None
        self.exponents: torch.Tensor | None = None
        self.grid: torch.Tensor | None = None  # (nnz, L) int32

    def exponent_streams(self) -> Round:
        return [] if self.local_exponents is None else [Stream("exponents", CombineOp.MAX, self.local_exponents)]

    def set_exponents(self, combined: list[torch.Tensor]) -> list[torch.Tensor]:
        """Consume the exponent stream (if any) from a round's results; quantise; return the rest."""
        if self.is_float:
            self.exponents, combined = combined[0], combined[1:]
            q = _fixedpoint.quantize(self.idx, self.raw, self.exponents, self.cfg.block_size, self.world_size)
            self.grid = q.unsqueeze(1)
        else:
            self.grid = _fixedpoint.to_limbs(self.raw, self.limbs)
        return combined

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

    def result(self, positions: torch.Tensor, sums: torch.Tensor, covers_local: bool = True) -> torch.Tensor:
        """Flat result holding the combined ``sums`` (U, L) at ``positions``, zero elsewhere.

        In place, only ``positions`` are written (O(U), no fill): every other element is already
        zero in the input provided ``positions`` covers this worker's nonzeros (``covers_local``);
        otherwise those are cleared first.
        """
        if self.target is not None:
            out = self.target
            if not covers_local:
                out[self.idx] = 0
        else:
            out = torch.zeros(self.numel, dtype=self.dtype, device=self.device)
        if positions.numel():
            if self.is_float:
                assert self.exponents is not None
                out[positions] = _fixedpoint.dequantize(
                    positions, sums[:, 0], self.exponents, self.cfg.block_size, self.world_size, self.dtype
                )
            else:
                out[positions] = _fixedpoint.from_limbs(sums, self.dtype)
        return out


def _round(streams: Round, stats: WorkerStats) -> Round:
    streams = [s for s in streams if s.words.numel()]
    for s in streams:
        stats.bytes_per_stream[s.name] += 4 * s.words.numel()
    stats.rounds += 1 if streams else 0
    return streams


def _exchange(streams: Round, stats: WorkerStats) -> Generator[Round, list[torch.Tensor], list[torch.Tensor]]:
    """Yield the non-empty streams as one round; return results aligned with ``streams``."""
    sent = _round(streams, stats)
    combined = (yield sent) if sent else []
    if len(combined) != len(sent):
        raise ProtocolError(f"switch returned {len(combined)} streams for a round of {len(sent)}")
    it = iter(combined)
    return [next(it) if s.words.numel() else s.words.clone() for s in streams]


def protocol(tensor: torch.Tensor, world_size: int, scheme: str, cfg: CodecConfig, stats: WorkerStats, inplace: bool = False) -> Protocol:
    """The worker-side protocol; returns the flat result.  decode(sum of encodings) == exact sum.

    With ``inplace`` the result is written into ``tensor`` when it is contiguous (the returned flat
    tensor is then a view of it).
    """
    check_scheme(scheme)
    w = _Worker(tensor, world_size, cfg, inplace)
    if scheme == "dense":
        return (yield from _dense(w, stats))
    if scheme == "compact":
        return (yield from _compact(w, stats))
    return (yield from _sketch_or_auto(w, scheme, stats))


def _dense(w: _Worker, stats: WorkerStats, exponents_done: bool = False) -> Protocol:
    stats.schemes["dense"] += 1
    if not exponents_done:
        w.set_exponents((yield from _exchange(w.exponent_streams(), stats)))
    assert w.grid is not None
    values = torch.zeros((w.numel, w.limbs), dtype=torch.int32, device=w.device)
    values[w.idx] = w.grid
    (sums,) = yield from _exchange([Stream("values", CombineOp.ADD, values.reshape(-1))], stats)
    sums = sums.reshape(-1, w.limbs)
    nonzero = torch.nonzero(sums.any(dim=1)).squeeze(1)
    return w.result(nonzero, sums[nonzero], covers_local=False)


def _compact(w: _Worker, stats: WorkerStats, exponents_done: bool = False) -> Protocol:
    stats.schemes["compact"] += 1
    streams = [] if exponents_done else w.exponent_streams()
    streams.append(Stream("bitmap", CombineOp.OR, _bitmap.pack_positions(w.idx, w.numel)))
    combined = yield from _exchange(streams, stats)
    if not exponents_done:
        combined = w.set_exponents(combined)
    union = _bitmap.unpack_positions(combined[0])
    (sums,) = yield from _exchange([Stream("values", CombineOp.ADD, w.values_at(union).reshape(-1))], stats)
    return w.result(union, sums.reshape(-1, w.limbs))


def _hll_size(numel: int, cfg: CodecConfig) -> int:
    """HyperLogLog registers for a tensor: about numel/32 (a bitmap's size), 16..hll_registers."""
    return max(16, min(cfg.hll_registers, 1 << max(0, (numel // 32).bit_length() - 1)))


def _union_stats(w: _Worker) -> Round:
    cfg = w.cfg
    nnz = w.idx.numel()

    def small(name: str, op: CombineOp, vals: list[int]) -> Stream:
        return Stream(name, op, torch.tensor(vals, dtype=torch.int32, device=w.device))

    return [
        Stream("hll", CombineOp.MAX, hll_registers(w.idx, _hll_size(w.numel, cfg), cfg.seed)),
        small("nnz_max", CombineOp.MAX, [nnz]),
        small("nnz_sum", CombineOp.ADD, [nnz & 0xFFFF, nnz >> 16]),
    ]


def _sketch_or_auto(w: _Worker, scheme: str, stats: WorkerStats) -> Protocol:
    cfg = w.cfg
    if scheme == "sketch" and cfg.sketch_cells is not None and not w.is_float:
        estimate = 0.0  # statically sized integer sketch: a single round
    else:
        combined = yield from _exchange(w.exponent_streams() + _union_stats(w), stats)
        hll, nnz_max, nnz_sum = w.set_exponents(combined)
        upper = min(w.numel, int(nnz_sum[0]) + (int(nnz_sum[1]) << 16))
        estimate = min(max(hll_estimate(hll), float(nnz_max[0])), float(upper))
        if scheme == "auto":
            scheme = choose(w.numel, estimate, w.limbs, cfg)
            if scheme == "dense":
                return (yield from _dense(w, stats, exponents_done=True))
            if scheme == "compact":
                return (yield from _compact(w, stats, exponents_done=True))
    if w.grid is None:
        w.set_exponents([])
    assert w.grid is not None
    stats.schemes["sketch"] += 1
    cells = cfg.sketch_cells or _sketch.sketch_cells(estimate, cfg.sketch_overhead)
    stats.sketch_cells = cells
    bitmap, table = yield from _exchange(
        [
            Stream("bitmap", CombineOp.OR, _bitmap.pack_positions(w.idx, w.numel)),
            Stream("sketch", CombineOp.ADD, _sketch.encode(w.idx, w.grid, cells, cfg.seed)),
        ],
        stats,
    )
    union = _bitmap.unpack_positions(bitmap)
    sums, core = _sketch.peel(union, table, w.limbs, cfg.seed)
    if core.numel():
        stats.repaired += core.numel()
        (fixed,) = yield from _exchange([Stream("repair", CombineOp.ADD, w.values_at(union[core]).reshape(-1))], stats)
        sums[core] = fixed.reshape(-1, w.limbs)
    return w.result(union, sums)
