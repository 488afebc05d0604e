"""Rank script: every collective of the homagg group against a gloo group's result.

Float SUM/AVG must be within the codec's bound ``world * 2**-22 * max|x|`` (plus the output dtype's
rounding) of gloo's sum; integer SUM and every delegated op must be bit-exact.  Also covers async
work and futures, functional collectives, a second homagg group (own switch job) used concurrently,
the ``gloo`` switch fallback, typed errors from ``wait()``, and thread clean-up after
``destroy_process_group``.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 - before init: its defaults would capture (and keep) WORLD
import torch.distributed._functional_collectives as fcol

import homagg
from _launch import run_checks, write_result

warnings.filterwarnings("ignore", category=FutureWarning)
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
TASKS_BEFORE = len(os.listdir("/proc/self/task"))
dist.init_process_group("homagg", timeout=__import__("datetime").timedelta(seconds=60))
GLOO = dist.new_group(backend="gloo")
G = torch.Generator().manual_seed(1234 + RANK)


def sparse_like(n: int, dtype: torch.dtype = torch.float32, density: float = 0.05) -> torch.Tensor:
    x = torch.randn(n, generator=G, dtype=torch.float64) * 3
    x[torch.rand(n, generator=G) > density] = 0
    return x.to(dtype)


def gloo_sum(t: torch.Tensor) -> torch.Tensor:
    ref = t.to(torch.float64).clone()
    dist.all_reduce(ref, group=GLOO)
    return ref


def global_absmax(t: torch.Tensor) -> float:
    m = t.abs().max().to(torch.float64).reshape(1)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=GLOO)
    return float(m)


def check_float(dtype: torch.dtype, op: dist.ReduceOp, n: int = 5000, group: dist.ProcessGroup | None = None) -> dict:
    x = sparse_like(n, dtype)
    ref = gloo_sum(x)
    if op == dist.ReduceOp.AVG:
        ref /= WORLD
    y = x.clone()
    dist.all_reduce(y, op=op, group=group)
    assert y.dtype == dtype and y.shape == x.shape
    bound = WORLD * 2.0**-22 * global_absmax(x) + torch.finfo(dtype).eps * ref.abs()
    err = (y.to(torch.float64) - ref).abs()
    assert bool((err <= bound).all()), f"max err {float(err.max())} over bound"
    return {"max_err": float(err.max())}


def check_int(dtype: torch.dtype) -> None:
    hi = 2**20 if dtype == torch.int32 else 2**40
    x = torch.randint(-hi, hi, (3000,), generator=G, dtype=dtype)
    x[::3] = 0
    ref, y = x.clone(), x.clone()
    dist.all_reduce(ref, group=GLOO)
    dist.all_reduce(y)
    assert torch.equal(ref, y)


def same_as_gloo(fn, *tensors: torch.Tensor) -> None:
    """Run ``fn(group, *copies)`` on homagg and on gloo; every tensor must end bit-identical."""
    mine = [t.clone() for t in tensors]
    theirs = [t.clone() for t in tensors]
    fn(None, *mine)
    fn(GLOO, *theirs)
    for a, b in zip(mine, theirs):
        assert torch.equal(a, b), f"{a} != {b}"


def check_delegated() -> None:
    x = torch.randn(64, generator=G)
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        same_as_gloo(lambda g, t: dist.all_reduce(t, op=op, group=g), x)
    same_as_gloo(lambda g, t: dist.all_reduce(t, op=dist.ReduceOp.BAND, group=g), torch.randint(0, 255, (16,), generator=G))
    same_as_gloo(lambda g, t: dist.all_reduce(t, group=g), torch.randint(0, 9, (16,), generator=G, dtype=torch.uint8))
    same_as_gloo(lambda g, t: dist.broadcast(t, src=WORLD - 1, group=g), x)
    same_as_gloo(lambda g, t: dist.reduce(t, dst=0, group=g), x)
    same_as_gloo(lambda g, *outs: dist.all_gather(list(outs), x, group=g), *[torch.zeros(64) for _ in range(WORLD)])
    same_as_gloo(lambda g, out: dist.all_gather_into_tensor(out, x, group=g), torch.zeros(64 * WORLD))
    same_as_gloo(lambda g, *outs: dist.gather(x, list(outs) if RANK == 0 else None, dst=0, group=g),
                 *([torch.zeros(64) for _ in range(WORLD)] if RANK == 0 else []))
    chunks = [torch.full((4,), float(10 * RANK + i)) for i in range(WORLD)]
    same_as_gloo(lambda g, out: dist.scatter(out, chunks if RANK == 0 else None, src=0, group=g), torch.zeros(4))
    same_as_gloo(lambda g, *outs: dist.all_to_all(list(outs), chunks, group=g), *[torch.zeros(4) for _ in range(WORLD)])
    same_as_gloo(lambda g, out: dist.all_to_all_single(out, torch.cat(chunks), group=g), torch.zeros(4 * WORLD))
    objs: list = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK})
    assert objs == [{"rank": r} for r in range(WORLD)]
    dist.barrier()


def check_send_recv() -> None:
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    out = torch.full((8,), float(RANK))
    got = torch.zeros(8)
    reqs = [dist.isend(out, nxt), dist.irecv(got, prv)]
    for r in reqs:
        r.wait()
    assert torch.equal(got, torch.full((8,), float(prv)))


def check_sparse_tensor() -> None:
    idx = torch.tensor([[RANK, 7]])
    s = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0]), (16,))
    mine, theirs = s.clone(), s.clone()
    dist.all_reduce(mine)
    dist.all_reduce(theirs, group=GLOO)
    assert torch.equal(mine.to_dense(), theirs.to_dense())


def check_async_and_futures() -> None:
    xs = [sparse_like(2000) for _ in range(4)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    futs = [w.get_future() for w in works]
    chained = futs[0].then(lambda f: f.value()[0] * 2)
    for w in works:
        w.wait()
    vals = torch.futures.wait_all(futs)
    assert all(torch.equal(v[0], x) for v, x in zip(vals, xs))
    assert torch.equal(chained.wait(), xs[0] * 2)
    assert all(w.is_completed() and w.is_success() for w in works)


def check_identity() -> dict:
    pg = dist.group.WORLD
    assert dist.get_backend() == "homagg", dist.get_backend()
    assert pg.group_name, "group name not set"
    y = fcol.all_reduce(torch.ones(4), "sum", pg)
    assert torch.equal(fcol.wait_tensor(y) if hasattr(fcol, "wait_tensor") else y, torch.full((4,), float(WORLD)))
    return {"name": pg.group_name, "switch": pg.switch.kind, "job": pg.switch.job_id}


def check_two_groups() -> dict:
    other = dist.new_group(backend="homagg")
    assert (other.switch.address, other.switch.job_id) != (dist.group.WORLD.switch.address, dist.group.WORLD.switch.job_id)
    a, b = sparse_like(4000), sparse_like(4000)
    ra, rb = gloo_sum(a), gloo_sum(b)
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, group=other, async_op=True)
    wb.wait()
    wa.wait()
    bound = WORLD * 2.0**-22 * max(global_absmax(ra), 1.0) * 2
    assert float((a.double() - ra).abs().max()) <= bound and float((b.double() - rb).abs().max()) <= bound
    jobs = [dist.group.WORLD.switch.job_id, other.switch.job_id]
    dist.destroy_process_group(other)
    return {"jobs": jobs}


def check_gloo_switch() -> dict:
    g = dist.new_group(backend="homagg", pg_options={"switch": "gloo", "scheme": "dense"})
    out = check_float(torch.float32, dist.ReduceOp.SUM, group=g)
    x = torch.arange(10, dtype=torch.int64) * (RANK + 1)
    dist.all_reduce(x, group=g)
    assert torch.equal(x, torch.arange(10) * sum(range(1, WORLD + 1)))
    dist.destroy_process_group(g)
    return out


def check_typed_errors() -> dict:
    g = dist.new_group(backend="homagg", pg_options={"timeout": 2.0})
    bad = torch.ones(100)
    if RANK == 0:
        bad[3] = float("nan")
    try:
        dist.all_reduce(bad, group=g)
    except homagg.HomAggError as exc:
        first = type(exc).__name__
    else:
        raise AssertionError("no error")
    try:  # the group is unusable now: same typed error at once
        dist.all_reduce(torch.ones(3), group=g)
    except homagg.HomAggError as exc:
        again = type(exc).__name__
    dist.destroy_process_group(g)
    g = dist.new_group(backend="homagg")
    big = torch.full((4,), 2**62, dtype=torch.int64)
    try:
        dist.all_reduce(big, group=g)
    except homagg.IntegerOverflowError:
        overflow = "IntegerOverflowError"
    else:
        raise AssertionError("no overflow")
    dist.destroy_process_group(g)
    return {"nan": first, "after": again, "overflow": overflow}


checks = [
    ("identity", check_identity),
    ("sum_float32", lambda: check_float(torch.float32, dist.ReduceOp.SUM)),
    ("avg_float32", lambda: check_float(torch.float32, dist.ReduceOp.AVG)),
    ("sum_float64", lambda: check_float(torch.float64, dist.ReduceOp.SUM)),
    ("sum_float16", lambda: check_float(torch.float16, dist.ReduceOp.SUM, n=2000)),
    ("sum_bfloat16", lambda: check_float(torch.bfloat16, dist.ReduceOp.SUM, n=2000)),
    ("sum_large", lambda: check_float(torch.float32, dist.ReduceOp.SUM, n=300_000)),
    ("sum_int32", lambda: check_int(torch.int32)),
    ("sum_int64", lambda: check_int(torch.int64)),
    ("delegated", check_delegated),
    ("send_recv", check_send_recv),
    ("sparse_tensor", check_sparse_tensor),
    ("async_futures", check_async_and_futures),
    ("two_groups", check_two_groups),
    ("gloo_switch", check_gloo_switch),
    ("typed_errors", check_typed_errors),
]
results = run_checks(checks)
dist.destroy_process_group()
del GLOO
gc.collect()
results["threads_after_destroy"] = sorted(t.name for t in threading.enumerate())
results["os_threads"] = [TASKS_BEFORE, len(os.listdir("/proc/self/task"))]
results["live_groups"] = sum(isinstance(o, dist.ProcessGroup) for o in gc.get_objects())
results["os_thread_names"] = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
write_result(results)
sys.exit(0)
