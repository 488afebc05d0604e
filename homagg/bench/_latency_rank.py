"""What one rank of ``homagg bench latency`` does (started by :mod:`homagg.bench._latency`).

A rank joins the default group of one backend (``gloo``, or ``homagg`` with one scheme through
``pg_options``) and, for every size it is given, makes ``warmup`` calls and then ``calls`` timed
calls of ``dist.all_reduce`` (SUM, or ``--op``'s MAX/MIN) on a dense fp32 tensor
(:func:`~homagg.bench._allreduce_rank.make_tensor`, density 1), and prints one JSON line per size
and reduction.

Input (``--input``): ``fresh`` -- every call gets a new tensor (a clone of the rank's input, made
before the clock starts); ``same`` -- one tensor for every call, its input values copied back into
it before the clock starts.  Pace (``--pace``): ``loop`` -- calls back to back, as a training loop
issues them; ``barrier`` -- a ``dist.barrier()`` before every call (the ranks start each call
together; the barrier is not timed).  With ``--barrier`` a rank also times ``dist.barrier()``
itself, back to back at either pace, reported as a size of 0 elements.

Per timed call every rank records its wall time (``perf_counter`` around ``dist.all_reduce``) and
its own CPU time, user and system apart (``getrusage(RUSAGE_SELF)``: every thread of the process,
the group's worker and gloo's threads included; Linux accounts the total to the nanosecond, so one
call's total is not rounded to a tick, but splits it into user and system by sampling ticks: the
split means something only summed over many calls).  Rank 0 also reads the embedded emulator's CPU over all timed
calls (``/proc``, 10 ms ticks: the mean per call; at ``--pace barrier`` it includes homagg's
barrier, itself a switch round).  homagg ranks report the group's rounds of the size's first call
(no history yet) and per timed call (the call's own: not the paced barrier's round).

Checks (outside the timed region): every rank digests every result (the launcher compares them:
every rank got rank 0's result, bit for bit, on every call) and rank 0 checks each distinct result
against the float64 sum within the documented bound (``W * 2**-22 * M`` per element), a MAX or
MIN result against the elementwise extremum of every rank's input, exactly.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ._allreduce_rank import check_result, make_tensor, oracle, switch_pid
from ._cpu import process_cpu
from ._ranks import RECORD_MARK, die_with_launcher

__all__ = ["rank_main", "one_size", "one_barrier"]


def _rounds(pg: Any) -> int | None:
    stats = getattr(pg, "stats", None)
    return None if stats is None else int(stats.rounds)


def _port_rounds(pg: Any) -> int | None:
    """The rounds a homagg group's switch port ran (its barriers' too, which ``pg.stats`` leaves out)."""
    stats = getattr(getattr(getattr(pg, "switch", None), "port", None), "stats", None) if hasattr(pg, "stats") else None
    return int(stats["rounds"]) if isinstance(stats, dict) else None


def _time_calls(pg: Any, calls: int, warmup: int, call: Callable[[int], None],
                before: Callable[[int], None] | None = None, after: Callable[[int], None] | None = None,
                label: str = "", count: Callable[[Any], int | None] = _rounds) -> dict[str, Any]:
    """``warmup + calls`` calls of ``call(i)``, each between ``before(i)`` and ``after(i)`` (untimed);
    the timed calls' wall and CPU times, the first call's and the timed calls' own rounds (homagg:
    ``count``),
    the emulator's CPU per timed call (rank 0) and the load before: the report's common part."""
    import torch.distributed as dist

    load = os.getloadavg()
    switch = switch_pid(pg) if dist.get_rank() == 0 else None
    times: list[float] = []
    cpu_user: list[float] = []
    cpu_sys: list[float] = []
    first_rounds, timed_rounds, switch0 = None, 0, None  # rounds: the call's own (not a paced barrier's)
    for i in range(warmup + calls):
        if i == warmup:
            switch0 = process_cpu(switch) if switch is not None else None
        if before is not None:
            before(i)
        rounds0 = count(pg)
        use0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        call(i)
        elapsed = time.perf_counter() - t0
        use1 = resource.getrusage(resource.RUSAGE_SELF)
        rounds = None if rounds0 is None else count(pg) - rounds0  # type: ignore[operator]
        if i == 0:
            first_rounds = rounds
        if i >= warmup:
            times.append(elapsed)
            cpu_user.append(use1.ru_utime - use0.ru_utime)
            cpu_sys.append(use1.ru_stime - use0.ru_stime)
            timed_rounds = None if rounds is None or timed_rounds is None else timed_rounds + rounds
        if after is not None:
            after(i)
        if i % 50 == 49:  # progress: every stdout line resets the launcher's stall timer
            print(f"call {i + 1} of {warmup + calls} done{label}", flush=True)
    switch1 = process_cpu(switch) if switch is not None else None
    return {"times": times, "cpu_user": cpu_user, "cpu_sys": cpu_sys, "load_avg": list(load),
            "first_call_rounds": first_rounds,
            "rounds_per_call": None if timed_rounds is None else timed_rounds / calls,
            "switch_cpu_s_per_call": (None if switch0 is None or switch1 is None
                                      else (sum(switch1) - sum(switch0)) / calls)}


def one_size(pg: Any, numel: int, calls: int, warmup: int, fresh: bool, pace: Any, seed: int,
             block: int, op: str = "sum") -> dict[str, Any]:
    """Time ``warmup + calls`` all_reduces (``op``: sum, max or min) of ``numel`` fp32 elements
    (``pace``: None, or the untimed barrier before each); the rank's report."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    x = make_tensor(numel, 1.0, rank, seed)
    reduce_op = getattr(dist.ReduceOp, op.upper())
    if op == "sum":
        exact, bound = oracle(numel, 1.0, world, seed, block) if rank == 0 else (None, None)
    else:  # MAX/MIN: one rank's value, exactly (the bound 0)
        stack = torch.stack([make_tensor(numel, 1.0, r, seed) for r in range(world)]) if rank == 0 else None
        exact = None if stack is None else (stack.amax(0) if op == "max" else stack.amin(0)).double()
        bound = None if exact is None else torch.zeros(-(-numel // block), dtype=torch.float64)
    digests: list[str] = []
    checked: set[str] = set()
    state = {"ok": True, "max_err": 0.0, "buf": x.clone()}
    same = state["buf"]

    def before(i: int) -> None:
        if fresh:
            state["buf"] = x.clone()
        else:
            same.copy_(x)
        if pace is not None:
            pace()

    def after(i: int) -> None:
        buf = state["buf"]
        digest = hashlib.blake2b(buf.numpy()).hexdigest()
        if i >= warmup:
            digests.append(digest)
        if exact is not None and bound is not None and digest not in checked:
            checked.add(digest)
            call_ok, call_err = check_result(buf, exact, bound, block)
            state["ok"], state["max_err"] = state["ok"] and call_ok, max(state["max_err"], call_err)

    timed = _time_calls(pg, calls, warmup, lambda i: dist.all_reduce(state["buf"], op=reduce_op), before, after,
                        f" ({numel} elements)")
    out: dict[str, Any] = {"numel": numel, "op": "allreduce" if op == "sum" else op, **timed, "digests": digests}
    if rank == 0:
        out.update(within_bound=state["ok"], max_abs_err=state["max_err"], distinct_results=len(checked))
    return out


def one_barrier(pg: Any, calls: int, warmup: int) -> dict[str, Any]:
    """Time ``warmup + calls`` calls of ``dist.barrier()``, back to back whatever the pace (a barrier
    before a barrier would only double it); the rank's report, as :func:`one_size`'s with 0 elements
    (homagg: the barrier is one switch round)."""
    import torch.distributed as dist

    timed = _time_calls(pg, calls, warmup, lambda i: dist.barrier(), label=" (barrier)", count=_port_rounds)
    return {"numel": 0, "op": "barrier", **timed, "digests": [],
            "within_bound": True, "max_abs_err": 0.0, "distinct_results": 0}


def rank_main(args: argparse.Namespace) -> int:
    """Entry point of a rank (hidden ``--_worker``): one JSON line per size on stdout."""
    die_with_launcher()
    import torch.distributed as dist

    import homagg
    import homagg.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    backend = args._backend
    options = {"scheme": args.scheme} if backend == "homagg" else None
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout), pg_options=options)
    try:
        pg = dist.distributed_c10d._get_default_group()
        pace = dist.barrier if args.pace == "barrier" else None
        block = homagg.CodecConfig().block_size
        if args.barrier:
            print(f"\n{RECORD_MARK}{json.dumps(one_barrier(pg, args.calls, args.warmup))}", flush=True)
        for op in args.op:
            for numel in args.numel:
                line = one_size(pg, numel, args.calls, args.warmup, args.input == "fresh", pace, args.seed, block, op)
                print(f"\n{RECORD_MARK}{json.dumps(line)}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0
