"""Rank script: small synchronous allreduces run in the caller's thread (issue 39), in call order.

Each check returns what it got; the test judges it against its own oracle (exact sums, gloo's
result, the worker path's behaviour).  Checks: a small synchronous call's work is complete when
``allreduce`` returns (fp32, fp64, int64, AVG) and its values; a large async call (worker) or an
async broadcast followed at once by small synchronous calls (FIFO across ranks, no deadlock); a
callback chained on a small call's future that issues collectives; a small call issued during
backward still goes to the worker; a failing small call (NaN input) reaches the caller typed, the
same way as the worker path's, and leaves the group unusable with that error.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import homagg
from _launch import make_input, run_checks, tensor_to_json, write_result

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("homagg", timeout=timedelta(seconds=60))
PG = dist.distributed_c10d._get_default_group()
GLOO = dist.new_group(backend="gloo")
J = tensor_to_json


def sync_opts(op: dist.ReduceOp = dist.ReduceOp.SUM) -> dist.AllreduceOptions:
    """What ``dist.all_reduce(t)`` (synchronous) hands the group."""
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    opts.asyncOp = False
    return opts


def spec(seed: int, n: int, dtype: str, **kw: object) -> dict:
    return {"shape": [n], "density": 1.0, "seed": seed, "dtype": dtype, "scale": 3.0, **kw}


def check_completed() -> dict:
    """Per case: completed at return, then the result, gloo's result on the same input."""
    out = {}
    cases = {"float32": ("float32", dist.ReduceOp.SUM), "float64": ("float64", dist.ReduceOp.SUM),
             "int64": ("int64", dist.ReduceOp.SUM), "avg_float32": ("float32", dist.ReduceOp.AVG)}
    for seed, (name, (dtype, op)) in enumerate(cases.items()):
        s = spec(seed, 1 if seed % 2 else 300, dtype, **({"high": 2**40} if dtype == "int64" else {}))
        x = make_input(RANK, s)
        theirs = x.clone()
        work = PG.allreduce([x], sync_opts(op))
        completed, future_done = work.is_completed(), work.get_future().done()
        work.wait()
        again = make_input(RANK, s)
        dist.all_reduce(again, op=op)  # through torch's API: the same result
        dist.all_reduce(theirs, op=op, group=GLOO)
        out[name] = {"input": s, "completed": completed, "future_done": future_done, "success": work.is_success(),
                     "result": J(x), "api": J(again), "gloo": J(theirs), "value": J(work.result()[0]),
                     "divisor": WORLD if op == dist.ReduceOp.AVG else 1}
    return out


def check_fifo() -> dict:
    """A large async allreduce (worker) or an async broadcast, then small synchronous ones at once."""
    out = []
    for it in range(6):
        if RANK == it % WORLD:
            time.sleep(0.05)  # a different rank is late each time
        big = torch.full((600_000,), float(RANK + it))  # 2.4 MB: on the worker
        work = dist.all_reduce(big, async_op=True)
        small = torch.tensor([float(RANK + 1)])
        dist.all_reduce(small)
        b = torch.full((8,), float(RANK))
        bwork = dist.broadcast(b, src=it % WORLD, async_op=True)
        small2 = torch.tensor([RANK * 10], dtype=torch.int64)
        dist.all_reduce(small2)
        work.wait()
        bwork.wait()
        out.append({"big": [big.min().item(), big.max().item()], "small": small.item(), "small2": small2.item(),
                    "b": [b.min().item(), b.max().item()]})
    return {"iterations": out}


def check_chained() -> dict:
    """Callbacks on a small call's future issue collectives: synchronous, async, and a second callback."""
    x = torch.tensor([float(RANK + 1)])
    seen: dict = {}

    def follow(fut: torch.futures.Future) -> float:
        y = fut.value()[0] * 2
        dist.all_reduce(y)  # a small synchronous one, from inside the callback
        z = torch.tensor([1.0])
        dist.all_reduce(z, async_op=True).wait()
        seen["y"], seen["z"] = y.item(), z.item()
        return y.item()

    work = PG.allreduce([x], sync_opts())
    chained = work.get_future().then(follow).then(lambda f: f.value() + 1)
    final = chained.wait()
    after = torch.tensor([3.0])
    dist.all_reduce(after)
    return {"x": x.item(), "final": final, **seen, "after": after.item()}


def check_backward() -> dict:
    """A small synchronous call issued during backward goes to the worker (not complete at return)."""
    states: list = []

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if RANK == 1:
            time.sleep(0.3)  # rank 0's call cannot complete before rank 1 issues it
        t = grad.detach().clone()
        work = PG.allreduce([t], sync_opts())
        states.append(work.is_completed())
        work.wait()
        return t

    w = torch.ones(3, requires_grad=True)
    w.register_hook(hook)
    (w * float(RANK + 1)).sum().backward()
    return {"completed_at_return": states, "grad": w.grad.tolist()}


def check_gloo_side() -> dict:
    """Synchronous gloo-side ops (barrier, broadcast, a MAX allreduce) on an idle worker: completed
    when they return, with their results; async ones still go to the worker."""
    bar = dist.BarrierOptions()
    bar.asyncOp = False
    barrier = PG.barrier(bar)
    b = torch.full((3,), float(RANK))
    bopts = dist.BroadcastOptions()
    bopts.rootRank, bopts.asyncOp = 1, False
    bwork = PG.broadcast([b], bopts)
    m = torch.tensor([float(RANK), -float(RANK)])
    mwork = PG.allreduce([m], sync_opts(dist.ReduceOp.MAX))
    out = {"barrier": barrier.is_completed(), "broadcast": bwork.is_completed(), "max": mwork.is_completed()}
    for w in (barrier, bwork, mwork):
        w.wait()
    aopts = dist.BroadcastOptions()
    aopts.rootRank, aopts.asyncOp = 0, True
    late = torch.full((2,), float(RANK))
    if RANK == 0:
        time.sleep(0.2)  # the others' async broadcast cannot be done at return
    awork = PG.broadcast([late], aopts)
    out["async_completed_at_return"] = awork.is_completed()
    awork.wait()
    out.update(b=b.tolist(), m=m.tolist(), late=late.tolist())
    return out


class _CountingGloo:
    """The group's private gloo group, counting the barriers asked of it (all else forwarded)."""

    def __init__(self, inner: object) -> None:
        self.inner, self.barriers = inner, 0

    def barrier(self, *args: object, **kwargs: object) -> object:
        self.barriers += 1
        return self.inner.barrier(*args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def _timed_barrier() -> dict:
    """A ``dist.barrier()`` entered after a stagger (rank r waits 0.15 s * r): when this rank
    entered and left it (wall clock, comparable across the ranks of one host)."""
    time.sleep(0.15 * RANK)
    entered = time.time()
    dist.barrier()
    return {"entered": entered, "left": time.time()}


def check_barrier_round() -> dict:
    """A barrier is one switch round, after switch rounds or not, with no gloo barrier asked for;
    either holds every rank until the last arrives."""
    counting = _CountingGloo(PG._private)
    PG._private = counting
    port = PG.switch.port
    try:
        x = torch.ones(1)
        dist.all_reduce(x)
        out = {}
        for which in ("after_switch", "again"):
            rounds = port.stats["rounds"]
            out[which] = _timed_barrier()
            out[which]["switch_rounds"] = port.stats["rounds"] - rounds
        return {**out, "gloo_barriers": counting.barriers, "sum": x.tolist(), "path": PG.path}
    finally:
        PG._private = counting.inner


def check_allgather_without_options() -> dict:
    """The group's allgathers called directly with no options (torch always passes some)."""
    outs = [torch.zeros(2) for _ in range(WORLD)]
    PG.allgather([outs], [torch.full((2,), float(RANK))]).wait()
    single = torch.zeros(2 * WORLD)
    PG._allgather_base(single, torch.full((2,), float(RANK))).wait()
    return {"outs": [o.tolist() for o in outs], "single": single.tolist()}


def _outcome(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test compares the types
        return type(exc).__name__ + (" (non-finite)" if "non-finite" in str(exc) else "")
    return "no error"


def failure(async_op: bool) -> dict:
    """A NaN input on every rank, on a new group: how the error reaches the caller, and after."""
    group = dist.new_group(backend="homagg")
    opts = sync_opts()
    opts.asyncOp = async_op
    x = torch.tensor([float("nan")])
    work = group.allreduce([x], opts)
    completed = work.is_completed()
    then = work.get_future().then(lambda f: f.value())
    out = {
        "completed_at_return": completed,
        "wait": _outcome(work.wait),
        "is_success": work.is_success(),
        "exception": type(work.exception()).__name__,
        "future_wait": _outcome(work.get_future().wait),
        "chained_wait": _outcome(then.wait),
        "later_allreduce": _outcome(lambda: dist.all_reduce(torch.ones(1), group=group)),
        "later_large": _outcome(lambda: dist.all_reduce(torch.ones(600_000), group=group, async_op=True)),
        "later_broadcast": _outcome(lambda: dist.broadcast(torch.ones(2), src=0, group=group)),
    }
    fresh = torch.tensor([float("nan")])
    out["api"] = _outcome(lambda: dist.all_reduce(fresh, group=dist.new_group(backend="homagg")))
    return out


def check_failure() -> dict:
    return {"inline": failure(async_op=False), "worker": failure(async_op=True),
            "nonfinite": homagg.NonFiniteError.__name__}


write_result(run_checks([("completed", check_completed), ("fifo", check_fifo), ("chained", check_chained),
                         ("backward", check_backward), ("gloo_side", check_gloo_side),
                         ("barrier_round", check_barrier_round), ("allgather", check_allgather_without_options),
                         ("failure", check_failure)]))
dist.destroy_process_group()
