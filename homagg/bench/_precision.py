"""``homagg bench precision``: homagg's error on real gradients at large W, beside an fp32 ring.

Every rank's gradient is one backward pass of the same conv net (VGG19, channels / 8, 32x32
inputs) on its own random batch.  For each world size W the figures compare, per element, against
the exact sum (float64, exact for these inputs):

* **homagg**: the codec's result (dense; every scheme is bit-identical on a first call) with the
  W workers' protocols run in lockstep in one thread and the switch's combine (``combine_words``),
  which a tree of switches reproduces bit for bit (docs/trees.md);
* **fp32 ring**: what gloo's ring allreduce computes: the tensor cut into W chunks, chunk ``c``
  summed in float32 along the ring starting at rank ``c + 1``.

Reported: the documented bound's factor (``bound / M``, docs/trees.md), the largest error in units
of the element's block max ``M`` (the bound's scale), the median and 99th percentile of the error
relative to ``|exact|`` over elements with ``|exact| > 1e-3 M``, and the fraction of elements where
homagg's error exceeds the ring's.
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
from ..codec._fixedpoint import precision_bits
from ..codec._schemes import protocol
from ..codec._stats import WorkerStats
from ..transport import combine_words

__all__ = ["configure_parser", "run", "measure", "bound_factor", "ring_sum_fp32"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--worlds", default="64,256,1024", help="world sizes (default 64,256,1024)")
    p.add_argument("--batch", type=int, default=4, help="samples per rank's batch (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the records to this file")


def bound_factor(world: int) -> float:
    """The documented per-element bound over ``M`` for float32 results: ``W * (2**(1-P) + 2**-24)``,
    ``P = 31 - ceil(log2 W)`` (the quantisation term of every worker plus the final rounding)."""
    return world * (2.0 ** (1 - precision_bits(world)) + 2.0**-24)


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


def _homagg_sum(grads: torch.Tensor) -> torch.Tensor:
    world = grads.shape[0]
    cfg = CodecConfig()
    gens = [protocol(grads[r].clone(), world, "dense", cfg, WorkerStats()) for r in range(world)]
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
            return results[0]
        combined = [combine_words(s.op, [rd[i].materialize() for rd in rounds]) for i, s in enumerate(rounds[0])]
        replies = [[c.clone() for c in combined] for _ in range(world)]


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
        ours = _homagg_sum(grads).double()
        ring = ring_sum_fp32(grads).double()
        e_ours, e_ring = (ours - exact).abs(), (ring - exact).abs()
        big = exact.abs() > 1e-3 * m
        rel_ours, rel_ring = (e_ours / exact.abs())[big], (e_ring / exact.abs())[big]
        live = m > 0
        rec = {
            "world": world, "numel": n, "model": "vgg19 / 8", "batch": batch,
            "precision_bits": precision_bits(world), "bound_over_M": bound_factor(world),
            "homagg_max_err_over_M": float((e_ours[live] / m[live]).max()),
            "ring_max_err_over_M": float((e_ring[live] / m[live]).max()),
            "homagg_rel_err_median": float(rel_ours.median()), "ring_rel_err_median": float(rel_ring.median()),
            "homagg_rel_err_p99": float(rel_ours.quantile(0.99)), "ring_rel_err_p99": float(rel_ring.quantile(0.99)),
            "homagg_worse_fraction": float((e_ours > e_ring).double().mean()),
            "within_bound": bool((e_ours <= bound_factor(world) * m).all()),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        records.append(rec)
    return records


def run(args: argparse.Namespace) -> int:
    worlds = [int(w) for w in str(args.worlds).split(",") if w.strip()]
    for w in worlds:
        opt.count("--worlds", w, 1, 1024, why="homagg's two-level trees")
    opt.count("--batch", args.batch)
    records = measure(worlds, args.batch, args.seed)
    for r in records:
        print(json.dumps(r))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    return 0 if all(r["within_bound"] for r in records) else 1
