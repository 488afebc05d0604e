"""Rank script: the switch dies after a call's results reached some ranks and not the others.

Three ranks on the embedded emulator (fault injection allowed).  Rank 0 mutes rank 2 at the
emulator (``mute``: the switch combines as usual, rank 2 gets no result), all ranks start an
all_reduce; ranks 0 and 1 get the result and return, rank 2 waits.  Rank 0 then SIGKILLs the
emulator (unless ``KILL=0``: then rank 2 finds the stalled switch at its progress timeout) and every
rank goes on with ``NEXT``: another all_reduce (the ranks that finished fail in it and join rank
2's agreement), a broadcast through the homagg group (their header meets rank 2's agreement), or
``none``: the group is destroyed at once (the agreement at close meets rank 2's).  Each rank
reports its result of the muted call, the next operation's result, and the group's path
statistics; the test compares them with the exact sums and across ranks.
"""

from __future__ import annotations

import os
import signal
import time
import warnings

import torch
import torch.distributed as dist

import homagg
from homagg.transport import ControlClient
from _launch import tensor_to_json, write_result

RANK = int(os.environ["RANK"])
NEXT = os.environ["NEXT"]
KILL = os.environ.get("KILL", "1") == "1"
N = int(os.environ.get("N", "100000"))

dist.init_process_group("homagg")
gloo = dist.new_group(backend="gloo")  # the test's own channel, not the group under test
pair = dist.new_group([0, 1], backend="gloo")  # ranks 0 and 1: both hold the muted call's result
pg = dist.distributed_c10d._get_default_group()


def data(rank: int, call: int) -> torch.Tensor:
    """Integer-valued floats: every sum is exact in float32."""
    return (torch.arange(N, dtype=torch.float32) % 1000) * (rank + 1) + call


warm = data(RANK, 0)
dist.all_reduce(warm)
if RANK == 0:
    emulator = pg.switch.emulator
    with ControlClient(pg.switch.control, secret=emulator.secret) as ctl:
        ctl.set_faults(mute=[2])
dist.barrier(group=gloo)
muted = data(RANK, 1)
t0 = time.monotonic()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    dist.all_reduce(muted)
    seconds = time.monotonic() - t0
    path_after_muted = pg.path
    if RANK in (0, 1) and KILL:  # the emulator sends each unmuted rank its copy in turn: rank 0
        dist.barrier(group=pair)  # must not kill it before rank 1's arrived
    if RANK == 0 and KILL:
        os.kill(emulator.process.pid, signal.SIGKILL)
    if NEXT == "none":
        following = torch.zeros(0)
    elif NEXT == "allreduce":
        following = data(RANK, 2)
        dist.all_reduce(following)
    else:
        following = data(RANK, 2) if RANK == 1 else torch.zeros(N)
        dist.broadcast(following, src=1)
write_result({
    "muted": tensor_to_json(muted),
    "following": tensor_to_json(following),
    "seconds": seconds,
    "path_after_muted": path_after_muted,
    "path": pg.path,
    "link": {"kind": pg.switch.kind, "job": pg.switch.job_id},
    "paths": dict(pg.stats.paths),
    "transitions": pg.stats.transitions,
    "warnings": [str(w.message) for w in caught if issubclass(w.category, homagg.PathWarning)],
})
t0 = time.monotonic()
dist.destroy_process_group()
print(f"rank {RANK}: destroy_process_group took {time.monotonic() - t0:.2f}s", flush=True)
