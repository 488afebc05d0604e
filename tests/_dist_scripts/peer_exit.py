"""Rank script: once a peer process is gone, the group's barrier (a switch round) fails with
:class:`homagg.RankTimeoutError` naming it (its presence socket is closed), and the collectives the
group runs on its gloo side (broadcast) with a typed :class:`homagg.HomAggError`, not gloo's plain
RuntimeError, within the group timeout; the group still shuts down.

Rank 1 reports first and then leaves without shutting anything down (``os._exit``), as a crashed
process does; rank 0 reports what each call raised.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import homagg
from _launch import write_result

RANK = int(os.environ["RANK"])
dist.init_process_group("homagg")
x = torch.ones(4)
dist.all_reduce(x)  # the group works (through the switch)
dist.barrier()
if RANK == 1:
    write_result({"left": True, "sum": x.tolist()})
    os._exit(0)
time.sleep(1.0)  # rank 1 is gone
result: dict = {"sum": x.tolist()}
for name, call in (("barrier", dist.barrier), ("broadcast", lambda: dist.broadcast(torch.zeros(4), src=0))):
    t0 = time.monotonic()
    try:
        call()
        result[name] = None
    except Exception as exc:  # noqa: BLE001 - the test inspects the type
        result[name] = {"type": type(exc).__name__, "is_homagg": isinstance(exc, homagg.HomAggError),
                        "seconds": time.monotonic() - t0, "message": str(exc)[:400],
                        "ranks": list(getattr(exc, "ranks", ()))}
t0 = time.monotonic()
dist.destroy_process_group()
result["destroy_seconds"] = time.monotonic() - t0
write_result(result)
