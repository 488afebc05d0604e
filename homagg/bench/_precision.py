"""``homagg bench precision``: homagg's error on real gradients at large W, beside an fp32 ring.

Every rank's gradient is one backward pass of the same conv net (VGG19, channels / 8, 32x32
inputs) on its own random batch.  For each world size W the figures compare, per element, against
the exact sum (float64, exact for these inputs):

* **homagg**: the codec's result (dense; every scheme is bit-identical on a first call) with the
  W workers' protocols run in lockstep in one thread and the switch's combine (``combine_words``),
  which a tree of switches reproduces bit for bit (docs/trees.md);
* **homagg wide** (``precision="wide"``: two int32 words per value, ``P2 = 47 - ceil(log2 W)``
  bits): the same first call, and its steady worst case (``homagg_wide_steady_*``): every block
  quantised under the top of the guess window, ``E + guess_slack(W, 2)`` (a :class:`History`
  entry whose exponents make every worker guess it), the coarsest grid a steady call keeps;
* **fp32 ring**: what gloo's ring allreduce computes: the tensor cut into W chunks, chunk ``c``
  summed in float32 along the ring starting at rank ``c + 1``.

Reported: the documented bound's factor (``bound / M``, docs/trees.md), the largest error in units
of the element's block max ``M`` (the bound's scale), the median and 99th percentile of the error
relative to ``|exact|`` over elements with ``|exact| > 1e-3 M``, the fraction of elements where
homagg's error exceeds the ring's, and the bytes per value of the values stream (4 single, 8 wide).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from .. import _options as opt
from ..codec._config import CodecConfig
from ..codec._fixedpoint import EMPTY_EXPONENT, guess_slack, precision_bits
from ..codec._history import Agreed, History
from ..codec._schemes import protocol
from ..codec._stats import WorkerStats
from ..transport import combine_words

__all__ = ["configure_parser", "run", "measure", "bound_factor", "wide_bound_factor", "ring_sum_fp32"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worlds", default="64,256,1024", help="world sizes (default 64,256,1024)")
    p.add_argument("--batch", type=int, default=4, help="samples per rank's batch (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the records to this file")


def bound_factor(world: int) -> float:
    """The documented per-element bound over ``M`` for float32 results: ``W * (2**(1-P) + 2**-24)``,
    ``P = 31 - ceil(log2 W)`` (the quantisation term of every worker plus the final rounding)."""
    return world * (2.0 ** (1 - precision_bits(world)) + 2.0**-24)


def wide_bound_factor(world: int, steady: bool = True) -> float:
    """The bound over ``M`` of wide words (float32 results): ``W * 2**(1 + s - P2) + W * 2**-24``
    (``P2 = 47 - ceil(log2 W)``; ``s``: the guess window's slack on a steady call, 0 on a first
    call); ``W * 2**(1+s-P2) <= 2**-24`` at every W <= 1024."""
    s = guess_slack(world, 2) if steady else 0
    return world * (2.0 ** (1 + s - precision_bits(world, 2)) + 2.0**-24)


def ring_sum_fp32(grads: torch.Tensor) -> torch.Tensor:
    """gloo's ring allreduce order in float32: ``grads`` is (W, n); chunk ``c`` of W (torch.chunk's
    cut) is accumulated starting at rank ``c + 1`` and going around the ring."""
    world, n = grads.shape
    out = torch.empty(n, dtype=torch.float32)
    bounds = [0]
    for chunk in torch.arange(n).chunk(world):
        bounds.append(bounds[-1] + chunk.numel())
    start = torch.zeros(n, dtype=torch.int64)
    for c in range(len(bounds) - 1):
        start[bounds[c]:bounds[c + 1]] = (c + 1) % world
    cols = torch.arange(n)
    acc = grads[start, cols].clone()
    for k in range(1, world):
        acc += grads[(start + k) % world, cols]
    out.copy_(acc)
    return out


def _gradients(world: int, batch: int, seed: int) -> torch.Tensor:
    from ._models_zoo import spec

    model_spec = spec("vgg19", quick=True)
    torch.manual_seed(seed)
    model = model_spec.build(False)
    rows = []
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(world):
        model.zero_grad(set_to_none=True)
        model_spec.loss(model, model_spec.batch(gen, batch)).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]))
    return torch.stack(rows)


def _homagg_sum(grads: torch.Tensor, precision: str = "single",
                prior: torch.Tensor | None = None) -> tuple[torch.Tensor, WorkerStats]:
    """(result, rank 0's stats) of a dense call; ``prior``: every worker's history holds these
    exponents (a steady call guessing from them)."""
    world, n = grads.shape
    cfg = CodecConfig(precision=precision)
    stats = [WorkerStats() for _ in range(world)]
    histories: list[History | None] = [None] * world
    if prior is not None:
        histories = [History() for _ in range(world)]
        for h in histories:  # the slot the protocol looks up (key None)
            h.put((None, n, grads.dtype, world, cfg.block_size), Agreed(prior, n))
    gens = [protocol(grads[r].clone(), world, "dense", cfg, stats[r], history=histories[r]) for r in range(world)]
    replies: list[Any] = [None] * world
    results: list[Any] = [None] * world
    while True:
        rounds = []
        for r, gen in enumerate(gens):
            try:
                rounds.append(gen.send(replies[r]))
            except StopIteration as stop:
                results[r] = stop.value
        if not rounds:
            return results[0], stats[0]
        combined = [combine_words(s.op, [rd[i].materialize() for rd in rounds]) for i, s in enumerate(rounds[0])]
        replies = [[c.clone() for c in combined] for _ in range(world)]


def _top_of_window(bmax: torch.Tensor, world: int) -> torch.Tensor:
    """Previous exponents that make every worker guess ``E + slack`` in each block (``E``: the
    block's agreed exponent): the guess is ``previous + slack // 2``, and it stands up to ``E +
    slack``."""
    slack = guess_slack(world, 2)
    e = torch.frexp(bmax.double()).exponent.to(torch.int32)
    return torch.where(bmax == 0, torch.full_like(e, EMPTY_EXPONENT), e + (slack - slack // 2))


def _errors(prefix: str, ours: torch.Tensor, ring_err: torch.Tensor, exact: torch.Tensor, m: torch.Tensor,
            bound: float) -> dict[str, Any]:
    err = (ours.double() - exact).abs()
    big, live = exact.abs() > 1e-3 * m, m > 0
    rel = (err / exact.abs())[big]
    return {f"{prefix}_max_err_over_M": float((err[live] / m[live]).max()),
            f"{prefix}_rel_err_median": float(rel.median()), f"{prefix}_rel_err_p99": float(rel.quantile(0.99)),
            f"{prefix}_worse_fraction": float((err > ring_err).double().mean()),
            f"{prefix}_within_bound": bool((err <= bound * m).all())}


def measure(worlds: list[int], batch: int = 4, seed: int = 0) -> list[dict[str, Any]]:
    records = []
    block = CodecConfig().block_size
    for world in worlds:
        t0 = time.perf_counter()
        grads = _gradients(world, batch, seed)
        exact = grads.double().sum(0)
        n = exact.numel()
        pad = (-n) % block
        bmax = torch.nn.functional.pad(grads.abs().amax(0), (0, pad)).reshape(-1, block).amax(1)
        m = bmax.repeat_interleave(block)[:n].double()
        ring = ring_sum_fp32(grads).double()
        e_ring = (ring - exact).abs()
        big = exact.abs() > 1e-3 * m
        rel_ring = (e_ring / exact.abs())[big]
        live = m > 0
        rec: dict[str, Any] = {
            "world": world, "numel": n, "model": "vgg19 / 8", "batch": batch,
            "precision_bits": precision_bits(world), "bound_over_M": bound_factor(world),
            "wide_precision_bits": precision_bits(world, 2), "wide_slack": guess_slack(world, 2),
            "wide_bound_over_M": wide_bound_factor(world),
            "ring_max_err_over_M": float((e_ring[live] / m[live]).max()),
            "ring_rel_err_median": float(rel_ring.median()), "ring_rel_err_p99": float(rel_ring.quantile(0.99)),
        }
        single, single_stats = _homagg_sum(grads)
        wide, wide_stats = _homagg_sum(grads, "wide")
        steady, steady_stats = _homagg_sum(grads, "wide", _top_of_window(bmax, world))
        if steady_stats.redos or steady_stats.rounds != 1:  # every block must stand at the window's top
            raise RuntimeError(f"the steady wide call redid {steady_stats.redone} elements")
        rec.update(_errors("homagg", single, e_ring, exact, m, bound_factor(world)))
        rec.update(_errors("homagg_wide", wide, e_ring, exact, m, wide_bound_factor(world, steady=False)))
        rec.update(_errors("homagg_wide_steady", steady, e_ring, exact, m, wide_bound_factor(world)))
        rec["within_bound"] = rec.pop("homagg_within_bound")
        rec["homagg_bytes_per_value"] = single_stats.bytes_per_stream["values"] / n
        rec["homagg_wide_bytes_per_value"] = wide_stats.bytes_per_stream["values"] / n
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        records.append(rec)
    return records


def run(args: argparse.Namespace) -> int:
    worlds = [int(w) for w in str(args.worlds).split(",") if w.strip()]
    for w in worlds:
        opt.count("--worlds", w, 1, 1024, why="homagg's two-level trees")
    opt.count("--batch", args.batch)
    records = []
    for world in worlds:  # each world's record as soon as it is measured
        records += measure([world], args.batch, args.seed)
        print(json.dumps(records[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    bounded = ("within_bound", "homagg_wide_within_bound", "homagg_wide_steady_within_bound")
    return 0 if all(r[k] for r in records for k in bounded) else 1
