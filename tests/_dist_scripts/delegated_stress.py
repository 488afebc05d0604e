"""Rank script: every op homagg runs on gloo (delegate and private group), many times, values checked.

Issue 13: an op that torch's C++ trampoline called with the GIL held blocked in gloo's ``enqueue``
while a gloo thread, holding that queue lock, waited for the GIL to free the previous work's
tensors.  This script issues each op ``STRESS_ITERS`` times back to back with fresh tensors (gloo
drops the previous call's work while the next call starts: the window of the deadlock; a second
thread competing for the GIL made it rarer, so there is none).  Each result is compared with its closed-form value (inputs are small
integers, so float sums are exact); the script reports per-op counts and the first mismatches,
and the test judges them.  A hang is caught by the launcher's timeout.
"""

from __future__ import annotations

import datetime
import os
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist

import homagg  # noqa: F401 - registers the backend
from _launch import write_result

warnings.filterwarnings("ignore")
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ITERS = int(os.environ.get("STRESS_ITERS", "200"))
OPS = [o for o in os.environ.get("STRESS_OPS", "").split(",") if o]
TOTAL = WORLD * (WORLD + 1) // 2  # sum over ranks of (rank + 1)


def full(n: int, value: float) -> torch.Tensor:
    return torch.full((n,), float(value))


def v(rank: int, i: int) -> float:
    """Rank ``rank``'s input value in iteration ``i`` (small integers: exact float sums)."""
    return float((rank + 1) * (i % 7 + 1))


def allreduce_coalesced(i: int) -> list[torch.Tensor]:
    ts = [full(5, v(RANK, i)), full(3, 1.0), full(2, RANK)]
    dist.all_reduce_coalesced(ts)
    return [ts[0] - TOTAL * (i % 7 + 1), ts[1] - WORLD, ts[2] - WORLD * (WORLD - 1) / 2]


def allgather_coalesced(i: int) -> list[torch.Tensor]:
    outs = [[full(3, -1), full(2, -1)] for _ in range(WORLD)]  # outs[rank][k]: rank's k-th input
    dist.all_gather_coalesced(outs, [full(3, v(RANK, i)), full(2, RANK)])
    return [outs[r][0] - v(r, i) for r in range(WORLD)] + [outs[r][1] - r for r in range(WORLD)]


def reduce(i: int) -> list[torch.Tensor]:
    dst = i % WORLD
    t = full(7, v(RANK, i))
    dist.reduce(t, dst=dst)
    return [t - TOTAL * (i % 7 + 1)] if RANK == dst else []


def gather(i: int) -> list[torch.Tensor]:
    dst = i % WORLD
    outs = [full(4, -1) for _ in range(WORLD)] if RANK == dst else None
    dist.gather(full(4, v(RANK, i)), outs, dst=dst)
    return [outs[r] - v(r, i) for r in range(WORLD)] if outs is not None else []


def scatter(i: int) -> list[torch.Tensor]:
    src = i % WORLD
    out = full(4, -1)
    dist.scatter(out, [full(4, 10 * r + i % 5) for r in range(WORLD)] if RANK == src else None, src=src)
    return [out - (10 * RANK + i % 5)]


def all_to_all(i: int) -> list[torch.Tensor]:
    outs = [full(2, -1) for _ in range(WORLD)]
    dist.all_to_all(outs, [full(2, 100 * RANK + d + i % 3) for d in range(WORLD)])
    return [outs[s] - (100 * s + RANK + i % 3) for s in range(WORLD)]


def all_to_all_single(i: int) -> list[torch.Tensor]:
    out = full(2 * WORLD, -1)
    dist.all_to_all_single(out, torch.cat([full(2, 100 * RANK + d + i % 3) for d in range(WORLD)]))
    return [out[2 * s:2 * s + 2] - (100 * s + RANK + i % 3) for s in range(WORLD)]


def reduce_scatter(i: int) -> list[torch.Tensor]:
    out = full(3, -1)
    dist.reduce_scatter(out, [full(3, v(RANK, i) + d) for d in range(WORLD)])
    return [out - (TOTAL * (i % 7 + 1) + WORLD * RANK)]


def reduce_scatter_tensor(i: int) -> list[torch.Tensor]:
    out = full(3, -1)
    dist.reduce_scatter_tensor(out, torch.cat([full(3, v(RANK, i) + d) for d in range(WORLD)]))
    return [out - (TOTAL * (i % 7 + 1) + WORLD * RANK)]


def send_recv(i: int) -> list[torch.Tensor]:
    got = full(6, -1)
    reqs = [dist.isend(full(6, v(RANK, i)), (RANK + 1) % WORLD), dist.irecv(got, (RANK - 1) % WORLD)]
    for req in reqs:
        req.wait()
    return [got - v((RANK - 1) % WORLD, i)]


def private_max(i: int) -> list[torch.Tensor]:
    """MAX allreduce and broadcast: the worker thread's calls of the private gloo group."""
    t = full(5, v(RANK, i))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    b = full(3, v(RANK, i))
    dist.broadcast(b, src=i % WORLD)
    return [t - v(WORLD - 1, i), b - v(i % WORLD, i)]


ALL: dict[str, Callable[[int], list[torch.Tensor]]] = {f.__name__: f for f in (
    allreduce_coalesced, allgather_coalesced, reduce, gather, scatter, all_to_all, all_to_all_single,
    reduce_scatter, reduce_scatter_tensor, send_recv, private_max)}

dist.init_process_group("homagg", timeout=datetime.timedelta(seconds=60))
counts: dict[str, int] = {}
bad: list[str] = []
t0 = time.monotonic()
for name in OPS or ALL:  # one op back to back: the previous call's work is what gloo frees
    op = ALL[name]
    diffs = [op(i) for i in range(ITERS)]
    counts[name] = len(diffs)
    for i, parts in enumerate(diffs):
        for k, diff in enumerate(parts):
            if diff.abs().max().item() != 0:
                bad.append(f"{name} iteration {i} part {k}: off by {diff.tolist()}")
seconds = time.monotonic() - t0
dist.destroy_process_group()
write_result({"counts": counts, "mismatches": bad[:20], "n_mismatches": len(bad), "seconds": seconds})
