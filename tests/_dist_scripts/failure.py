"""Rank script: a switch failure during DDP training surfaces from ``loss.backward()`` as a typed error.

Two good steps, then rank 0 makes the embedded emulator drop (almost) every packet (its fault injection,
through the control port); the next ``loss.backward()`` must raise :class:`homagg.SwitchTimeoutError`
on every rank within ``HOMAGG_TIMEOUT`` (+ margin), and the process must still shut down cleanly.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg
from homagg.transport import ControlClient
from _launch import write_result

RANK = int(os.environ["RANK"])
dist.init_process_group("homagg")
gloo = dist.new_group(backend="gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Embedding(500, 8), nn.Flatten(), nn.Linear(32, 4)))
result: dict = {}
for step in range(4):
    if step == 2:
        if RANK == 0:
            with ControlClient(dist.group.WORLD.switch.control) as ctl:
                ctl.set_faults(drop=0.99999)
        dist.barrier(group=gloo)
    x = torch.randint(0, 500, (8, 4))
    t0 = time.monotonic()
    try:
        model(x).square().mean().backward()
    except Exception as exc:  # noqa: BLE001 - the test inspects the type
        result = {"step": step, "type": type(exc).__name__, "is_homagg": isinstance(exc, homagg.HomAggError),
                  "seconds": time.monotonic() - t0, "message": str(exc)[:300]}
        break
try:  # (DDP itself cannot go on after a failed backward; the group reports the same error)
    dist.all_reduce(torch.ones(4))
except homagg.HomAggError as exc:
    result["after"] = type(exc).__name__
t0 = time.monotonic()
dist.destroy_process_group()
result["destroy_seconds"] = time.monotonic() - t0
write_result(result)
