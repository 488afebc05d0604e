"""auto's cost model: which continuation a call takes once the union size is estimated or remembered,
and how many levels compact's bitmap has.  Pure functions of agreed inputs (every worker decides
alike), remembered per cost-model field values (:func:`_choice`)."""

from __future__ import annotations

from functools import lru_cache

from . import _bitmap, _sketch
from ._config import CodecConfig

__all__ = ["choose", "bitmap_levels"]


def choose(numel: int, union_estimate: float, limbs: int, cfg: CodecConfig) -> str:
    """``auto``'s choice once the union size is estimated (or remembered).

    Cost of a continuation = bytes on the wire / bandwidth + further rounds * RTT + codec CPU, with
    dense: ``4nL`` bytes, 1 round, ``n * dense_ns``; sketch: ``n/8 + 4cL`` bytes (c cells), 1 round
    (a repair round is rare at the configured overhead) plus ``U * peel_ns`` of peeling; compact:
    ``n/8 + 4UL`` bytes, 2 rounds (its bitmap must come back before values can be placed),
    ``U * compact_ns``.  Measured on
    loopback, the peeling term decides: a 2-rank sparse embedding all_reduce (200k x 32, 512
    rows) took 23 ms with compact and 39-51 ms with sketch.  Ties go to the simpler scheme.  The inputs are
    agreed by all workers, so every worker chooses the same continuation.
    """
    return _choice(numel, union_estimate, limbs, cfg.bandwidth_gbps, cfg.rtt_us, cfg.sketch_cells,
                   cfg.sketch_overhead, cfg.dense_ns, cfg.compact_ns, cfg.peel_ns, cfg.bitmap_levels)


@lru_cache(maxsize=4096)
def _choice(numel: int, union_estimate: float, limbs: int, bandwidth_gbps: float, rtt_us: float,
            sketch_cells: int | None, sketch_overhead: float, dense_ns: float, compact_ns: float, peel_ns: float,
            bitmap_levels: int | None) -> str:
    """:func:`choose`, a pure function of the cost model's fields (remembered: a steady call asks
    the same question each time; hashing these costs less than a whole :class:`CodecConfig`)."""
    bandwidth = bandwidth_gbps * 1e9 / 8
    rtt = rtt_us * 1e-6
    cells = sketch_cells or _sketch.sketch_cells(union_estimate, sketch_overhead)
    costs = {
        "dense": 4 * numel * limbs / bandwidth + rtt + numel * dense_ns * 1e-9,
        "compact": (4 * union_estimate * limbs / bandwidth
                    + _bitmap_cost_of(numel, union_estimate, bandwidth_gbps, rtt_us, bitmap_levels)[0]
                    + union_estimate * compact_ns * 1e-9),
        "sketch": (numel / 8 + 4 * cells * limbs) / bandwidth + rtt + union_estimate * peel_ns * 1e-9,
    }
    return min(costs, key=lambda k: costs[k])


def _bitmap_cost(numel: int, union: float, cfg: CodecConfig) -> tuple[float, int]:
    """(modelled seconds, levels) of compact's bitmap and the rounds up to its values: one level
    (``n/32`` words, then values: 2 rounds) or two (:func:`homagg.codec._bitmap.two_level_words`, 3
    rounds); the cheaper, or ``cfg.bitmap_levels`` when set.  Agreed inputs: every worker picks
    the same."""
    return _bitmap_cost_of(numel, union, cfg.bandwidth_gbps, cfg.rtt_us, cfg.bitmap_levels)


def _bitmap_cost_of(numel: int, union: float, bandwidth_gbps: float, rtt_us: float,
                    bitmap_levels: int | None) -> tuple[float, int]:
    """:func:`_bitmap_cost` of the cost model's fields."""
    bandwidth = bandwidth_gbps * 1e9 / 8
    rtt = rtt_us * 1e-6
    costs = {1: 4 * _bitmap.bitmap_words(numel) / bandwidth + 2 * rtt,
             2: 4 * _bitmap.two_level_words(numel, union) / bandwidth + 3 * rtt}
    levels = bitmap_levels or min(costs, key=lambda k: costs[k])
    return costs[levels], levels


def bitmap_levels(numel: int, union: float | None, cfg: CodecConfig) -> int:
    """Levels of compact's bitmap for a tensor of ``numel`` elements with an agreed (remembered or
    estimated) ``union`` size: ``cfg.bitmap_levels``, else the cheaper by the cost model, else
    (no union known) 1."""
    if union is None:
        return cfg.bitmap_levels or 1
    return _bitmap_cost(numel, union, cfg)[1]
