"""Rank script: MAX and MIN ``dist.all_reduce`` through the ``homagg`` group beside gloo's of the same inputs.

Every dtype, a few sizes, synchronous and ``async_op=True``, inputs with a NaN or a negative zero on
one rank (the calls the switch leaves to gloo), float64 (gloo's throughout); int16, which gloo
refuses ("Invalid scalar type"), against the extremum of the inputs gathered over gloo.  Each rank returns,
per case, whether homagg's result equals gloo's bit for bit, plus the group's switch rounds and
calls per path before and after; the test (``tests/test_torch_extremum.py``) judges them.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

import homagg  # noqa: F401 - registers the backend
from _launch import run_checks, write_result

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "bool", "float16", "bfloat16", "float32", "float64")

dist.init_process_group("homagg", timeout=timedelta(seconds=60))
GLOO = dist.new_group(backend="gloo")
PG = dist.distributed_c10d._get_default_group()


def make(dtype: str, n: int, case: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 100 + RANK)
    dt = getattr(torch, dtype)
    if dt == torch.bool:
        return torch.rand(n, generator=gen) < 0.5
    if dt.is_floating_point:
        x = (torch.randn(n, generator=gen, dtype=torch.float64) * 1e3).to(dt)
        if case == "nan" and RANK == WORLD - 1:
            x[n // 2] = float("nan")
        if case == "negative zero":
            x[n // 2] = -0.0 if RANK == 0 else 0.0
        return x
    info = torch.iinfo(dt)
    if case == "apart" and dt == torch.int64:  # high words differ between ranks: two rounds
        return torch.randint(-2**62, 2**62, (n,), generator=gen, dtype=torch.int64)
    low = 0 if dt == torch.int64 else max(info.min, -1000)  # int64: one sign, high words alike (one round)
    return torch.randint(low, min(info.max, 1000), (n,), generator=gen, dtype=torch.int64).to(dt)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a, b) if a.dtype == torch.bool else torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def check() -> dict:
    out = {}
    seed = 0
    for dtype in DTYPES:
        for n in (1, 6, 1000):
            for case in ("plain", "nan", "negative zero", "apart") + (("async",) if dtype != "int16" else ()):
                for name, op in (("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)):
                    seed += 1
                    x = make(dtype, n, case, seed)
                    a, b = x.clone(), x.clone()
                    before = (PG.stats.rounds, dict(PG.stats.paths))
                    if case == "async":
                        dist.all_reduce(a, op=op, async_op=True).wait()
                    else:
                        dist.all_reduce(a, op=op)
                    after = (PG.stats.rounds, dict(PG.stats.paths))
                    if dtype == "int16":  # gloo has no int16: the oracle is the gathered inputs' extremum
                        parts = [torch.empty(n, dtype=torch.int32) for _ in range(WORLD)]
                        dist.all_gather(parts, b.to(torch.int32), group=GLOO)
                        stack = torch.stack(parts)
                        b = (stack.amax(0) if name == "max" else stack.amin(0)).to(torch.int16)
                    else:
                        dist.all_reduce(b, op=op, group=GLOO)
                    out[f"{dtype} {n} {case} {name}"] = {
                        "same": same(a, b), "rounds": after[0] - before[0],
                        "switch_calls": after[1].get("switch", 0) - before[1].get("switch", 0)}
    return out


def check_host_path() -> dict:
    """A group whose rounds gloo combines (``switch="gloo"``, the host path a fallback takes): the
    same keys MAXed by gloo, the same results."""
    group = dist.new_group(backend="homagg", pg_options={"switch": "gloo"})
    out = {}
    for dtype, case in (("float32", "plain"), ("float32", "nan"), ("int64", "apart"), ("int8", "plain")):
        for name, op in (("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)):
            x = make(dtype, 6, case, 7)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=op, group=group)
            dist.all_reduce(b, op=op, group=GLOO)
            out[f"{dtype} {case} {name}"] = same(a, b)
    out["rounds"] = group.stats.rounds
    return out


write_result(run_checks([("extremum", check), ("host path", check_host_path)]))
dist.destroy_process_group()
