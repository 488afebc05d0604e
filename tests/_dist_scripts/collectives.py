"""Rank script: every collective of the homagg group; it returns values, the test judges them.

Each check returns what it got (tensors via ``tensor_to_json``) and, for reductions, the spec of
its input (``make_input``): the pytest process rebuilds every rank's input and checks the results
against its own oracle (exact sums and README's error bound for float SUM/AVG, exact integer sums,
and for delegated ops the value the op must produce; gloo's result is returned beside).  Also covers
async work and futures, functional collectives, a second homagg group (own switch job) used
concurrently, the ``gloo`` switch fallback, typed errors from ``wait()``, and thread clean-up after
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
from _launch import make_input, run_checks, tensor_to_json, write_result

warnings.filterwarnings("ignore", category=FutureWarning)
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
TASKS_BEFORE = len(os.listdir("/proc/self/task"))
dist.init_process_group("homagg", timeout=__import__("datetime").timedelta(seconds=60))
GLOO = dist.new_group(backend="gloo")
J = tensor_to_json


def spec(seed: int, n: int, dtype: str = "float32", density: float = 0.05, **kw: object) -> dict:
    return {"shape": [n], "density": density, "seed": seed, "dtype": dtype, "scale": 3.0, **kw}


def reduce_float(seed: int, dtype: str, op: dist.ReduceOp, n: int = 5000, group: dist.ProcessGroup | None = None) -> dict:
    s = spec(seed, n, dtype)
    y = make_input(RANK, s)
    dist.all_reduce(y, op=op, group=group)
    return {"input": s, "result": J(y), "divisor": WORLD if op == dist.ReduceOp.AVG else 1}


def reduce_int(seed: int, dtype: str) -> dict:
    s = spec(seed, 3000, dtype, density=0.67, high=2**20 if dtype == "int32" else 2**40)
    y = make_input(RANK, s)
    dist.all_reduce(y)
    return {"input": s, "result": J(y), "divisor": 1}


def both(fn, *tensors: torch.Tensor) -> dict:
    """Run ``fn(group, *copies)`` on homagg and on gloo; return both sets of tensors afterwards."""
    mine = [t.clone() for t in tensors]
    theirs = [t.clone() for t in tensors]
    fn(None, *mine)
    fn(GLOO, *theirs)
    return {"homagg": [J(t) for t in mine], "gloo": [J(t) for t in theirs]}


def check_delegated() -> dict:
    x = make_input(RANK, spec(50, 64, density=1.0))
    bits = make_input(RANK, spec(51, 16, "int64", density=1.0, high=255)).abs()
    small = (bits % 9).to(torch.uint8)
    out = {"x": spec(50, 64, density=1.0), "bits": spec(51, 16, "int64", density=1.0, high=255)}
    for name, op in (("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN), ("product", dist.ReduceOp.PRODUCT)):
        out[name] = both(lambda g, t: dist.all_reduce(t, op=op, group=g), x)
    out["band"] = both(lambda g, t: dist.all_reduce(t, op=dist.ReduceOp.BAND, group=g), bits)
    out["uint8_sum"] = both(lambda g, t: dist.all_reduce(t, group=g), small)
    out["broadcast"] = both(lambda g, t: dist.broadcast(t, src=WORLD - 1, group=g), x)
    out["reduce"] = both(lambda g, t: dist.reduce(t, dst=0, group=g), x)
    out["all_gather"] = both(lambda g, *outs: dist.all_gather(list(outs), x, group=g), *[torch.zeros(64) for _ in range(WORLD)])
    out["all_gather_into_tensor"] = both(lambda g, o: dist.all_gather_into_tensor(o, x, group=g), torch.zeros(64 * WORLD))
    out["gather"] = both(lambda g, *outs: dist.gather(x, list(outs) if RANK == 0 else None, dst=0, group=g),
                         *([torch.zeros(64) for _ in range(WORLD)] if RANK == 0 else []))
    chunks = [torch.full((4,), float(10 * RANK + i)) for i in range(WORLD)]
    out["scatter"] = both(lambda g, o: dist.scatter(o, chunks if RANK == 0 else None, src=0, group=g), torch.zeros(4))
    out["all_to_all"] = both(lambda g, *outs: dist.all_to_all(list(outs), chunks, group=g), *[torch.zeros(4) for _ in range(WORLD)])
    out["all_to_all_single"] = both(lambda g, o: dist.all_to_all_single(o, torch.cat(chunks), group=g), torch.zeros(4 * WORLD))
    objs: list = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK})
    out["objects"] = objs
    dist.barrier()
    return out


def check_send_recv() -> dict:
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.zeros(8)
    reqs = [dist.isend(torch.full((8,), float(RANK)), nxt), dist.irecv(got, prv)]
    for r in reqs:
        r.wait()
    return {"got": J(got)}


def check_sparse_tensor() -> dict:
    s = torch.sparse_coo_tensor(torch.tensor([[RANK, 7]]), torch.tensor([1.0, 2.0]), (16,))
    mine, theirs = s.clone(), s.clone()
    dist.all_reduce(mine)
    dist.all_reduce(theirs, group=GLOO)
    return {"homagg": J(mine.to_dense()), "gloo": J(theirs.to_dense()), "is_sparse": mine.is_sparse}


def check_async_and_futures() -> dict:
    specs = [spec(60 + i, 2000) for i in range(4)]
    xs = [make_input(RANK, s) for s in specs]
    ptrs = [x.data_ptr() for x in xs]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    futs = [w.get_future() for w in works]
    chained = futs[0].then(lambda f: f.value()[0] * 2)
    for w in works:
        w.wait()
    vals = torch.futures.wait_all(futs)
    return {"inputs": specs, "values": [J(v[0]) for v in vals], "chained": J(chained.wait()),
            "in_place": [v[0].data_ptr() == p for v, p in zip(vals, ptrs)],
            "done": [w.is_completed() and w.is_success() for w in works]}


def check_identity() -> dict:
    pg = dist.group.WORLD
    y = fcol.all_reduce(torch.ones(4), "sum", pg)
    y = fcol.wait_tensor(y) if hasattr(fcol, "wait_tensor") else y
    return {"backend": dist.get_backend(), "name": pg.group_name, "switch": pg.switch.kind, "job": pg.switch.job_id,
            "functional": J(y)}


def check_two_groups() -> dict:
    other = dist.new_group(backend="homagg")
    sa, sb = spec(70, 4000), spec(71, 4000)
    a, b = make_input(RANK, sa), make_input(RANK, sb)
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, group=other, async_op=True)
    wb.wait()
    wa.wait()
    jobs = [[str(dist.group.WORLD.switch.address), dist.group.WORLD.switch.job_id],
            [str(other.switch.address), other.switch.job_id]]
    dist.destroy_process_group(other)
    return {"jobs": jobs, "a": {"input": sa, "result": J(a), "divisor": 1}, "b": {"input": sb, "result": J(b), "divisor": 1}}


def check_gloo_switch() -> dict:
    g = dist.new_group(backend="homagg", pg_options={"switch": "gloo", "scheme": "dense"})
    out = reduce_float(80, "float32", dist.ReduceOp.SUM, group=g)
    x = make_input(RANK, spec(81, 10, "int64", density=1.0, high=1000))
    dist.all_reduce(x, group=g)
    out["ints"] = {"input": spec(81, 10, "int64", density=1.0, high=1000), "result": J(x), "divisor": 1}
    dist.destroy_process_group(g)
    return out


def error_of(fn) -> str:
    """The name of the homagg error ``fn()`` raises, or ``"no error"`` (other exceptions propagate)."""
    try:
        fn()
    except homagg.HomAggError as exc:
        return type(exc).__name__
    return "no error"


def check_typed_errors() -> dict:
    g = dist.new_group(backend="homagg", pg_options={"timeout": 2.0})
    bad = torch.ones(100)
    if RANK == 0:
        bad[3] = float("nan")
    first = error_of(lambda: dist.all_reduce(bad, group=g))
    again = error_of(lambda: dist.all_reduce(torch.ones(3), group=g))  # the group is unusable now
    dist.destroy_process_group(g)
    g = dist.new_group(backend="homagg")
    overflow = error_of(lambda: dist.all_reduce(torch.full((4,), 2**62, dtype=torch.int64), group=g))
    dist.destroy_process_group(g)
    return {"nan": first, "after": again, "overflow": overflow}


checks = [
    ("identity", check_identity),
    ("sum_float32", lambda: reduce_float(1, "float32", dist.ReduceOp.SUM)),
    ("avg_float32", lambda: reduce_float(2, "float32", dist.ReduceOp.AVG)),
    ("sum_float64", lambda: reduce_float(3, "float64", dist.ReduceOp.SUM)),
    ("sum_float16", lambda: reduce_float(4, "float16", dist.ReduceOp.SUM, n=2000)),
    ("sum_bfloat16", lambda: reduce_float(5, "bfloat16", dist.ReduceOp.SUM, n=2000)),
    ("sum_large", lambda: reduce_float(6, "float32", dist.ReduceOp.SUM, n=300_000)),
    ("sum_int32", lambda: reduce_int(7, "int32")),
    ("sum_int64", lambda: reduce_int(8, "int64")),
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
