"""The drivers of :mod:`homagg.bench._stages`: rank processes of a real ``homagg`` group on loopback
(``pg``), or the in-process harness (``local``)."""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from typing import Any

import torch

from ._stage_timers import Timers, install, per_call, stage_table

__all__ = ["run_rank", "run_pg_mode", "run_local_mode"]

_MARK = "@homagg-stages@"


def _settle(timers: Timers) -> None:
    """Wait (bounded) until no wrapped function runs on another thread: the worker finished the
    call's bookkeeping after the caller woke."""
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline and "completed" in timers.marks:
        time.sleep(0)


def run_rank(numels: list[int], calls: int, warmup: int, barrier: bool = False) -> int:
    """One rank: plain calls first, then instrumented ones; one JSON line per size.  ``barrier``:
    every call starts after a ``dist.barrier()`` (as in ``bench allreduce``), outside its timing."""
    from ._ranks import die_with_launcher

    die_with_launcher()
    import torch.distributed as dist

    import homagg.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group("homagg")
    try:
        x = {n: torch.randn(n, generator=torch.Generator().manual_seed(dist.get_rank() * 7919 + n)) for n in numels}
        plain: dict[int, float] = {}
        for n in numels:  # uninstrumented: the reference figure
            times = []
            for call in range(warmup + calls):
                buf = x[n].clone()
                if barrier:
                    dist.barrier()
                t0 = time.perf_counter_ns()
                dist.all_reduce(buf)
                if call >= warmup:
                    times.append(time.perf_counter_ns() - t0)
            plain[n] = statistics.median(times) / 1e3
        timers = Timers()
        missing = install(timers)
        pg = dist.distributed_c10d._get_default_group()
        pg._allreduce_fn = sys.modules["homagg.codec._protocol"].allreduce  # the wrapped one
        for n in numels:
            rows, totals = [], []
            for call in range(warmup + calls):
                buf = x[n].clone()
                if barrier:
                    dist.barrier()
                _settle(timers)
                before = timers.snapshot()
                timers.marks["issued"] = t0 = time.perf_counter_ns()
                dist.all_reduce(buf)
                t1 = time.perf_counter_ns()
                _settle(timers)
                if call >= warmup:
                    rows.append(per_call(before, timers.snapshot()))
                    totals.append(t1 - t0)
            table = stage_table(rows, totals)
            rusage = resource.getrusage(resource.RUSAGE_SELF)
            print(f"\n{_MARK}" + json.dumps({"numel": n, "plain_us": plain[n], "table": table, "missing": missing,
                                           "rounds": int(pg.stats.rounds), "cpu_s": rusage.ru_utime + rusage.ru_stime}),
                  flush=True)
    finally:
        dist.destroy_process_group()
    return 0


def _median_tables(tables: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {stage: {k: float(statistics.median(t[stage][k] for t in tables)) for k in tables[0][stage]}
            for stage in tables[0]}


def run_pg_mode(world: int, numels: list[int], calls: int, warmup: int, barrier: bool = False) -> dict[str, Any]:
    """``world`` ranks on loopback; per size the median over ranks of each stage (``barrier``: a
    ``dist.barrier()`` before every call, untimed)."""
    from ._ranks import launch_ranks

    cmd = [sys.executable, "-m", "homagg.bench._stages", "--_rank", "--numel", ",".join(map(str, numels)),
           "--calls", str(calls), "--warmup", str(warmup)] + (["--barrier"] if barrier else [])
    outs = launch_ranks(cmd, world, label=f"stages (world {world})", stall_timeout=300)
    lines = [[json.loads(ln.partition(_MARK)[2]) for ln in out if _MARK in ln] for out in outs]
    result: dict[str, Any] = {"mode": "pg", "world": world, "barrier": barrier, "calls": calls, "load_avg": list(os.getloadavg()),
                              "tables": {}, "plain_us": {}, "per_rank": lines, "missing": lines[0][0]["missing"]}
    for i, n in enumerate(numels):
        result["tables"][n] = _median_tables([rank[i]["table"] for rank in lines])
        result["plain_us"][n] = float(statistics.median(rank[i]["plain_us"] for rank in lines))
    return result


def run_local_mode(world: int, numels: list[int], calls: int, warmup: int) -> dict[str, Any]:
    """:func:`homagg.testing.run_local` (threads, in-process switch); per worker: the stages summed
    over the workers' threads, divided by ``world``."""
    from ..codec import History
    from ..testing import run_local

    torch.set_num_threads(1)
    result: dict[str, Any] = {"mode": "local", "world": world, "calls": calls, "load_avg": list(os.getloadavg()),
                              "tables": {}, "plain_us": {}}
    xs = {n: [torch.randn(n, generator=torch.Generator().manual_seed(r * 7919 + n)) for r in range(world)]
          for n in numels}
    # one History for all workers (they agree on what it records; each reads it at its call's start and
    # writes it at its end, and run_local joins every worker between calls): steady state, as a group has
    history = History()

    def one(n: int) -> int:
        t0 = time.perf_counter_ns()
        run_local([x.clone() for x in xs[n]], "auto", history=history)
        return time.perf_counter_ns() - t0

    plain = {n: statistics.median([one(n) for _ in range(warmup + calls)][warmup:]) / 1e3 for n in numels}
    timers = Timers()
    result["missing"] = install(timers)
    for n in numels:
        rows, totals = [], []
        for call in range(warmup + calls):
            before = timers.snapshot()
            total = one(n)
            if call >= warmup:
                after = per_call(before, timers.snapshot())
                rows.append({k: (v[0] // world, v[1] // world) for k, v in after.items()})
                totals.append(total)
        result["tables"][n] = stage_table(rows, totals)
        result["plain_us"][n] = plain[n]
    return result
