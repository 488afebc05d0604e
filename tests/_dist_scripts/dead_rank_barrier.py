"""Rank script: a rank whose process is gone is named by the others' barrier within seconds.

Both ranks run an all_reduce and a barrier through the switch; then rank 1 reports and leaves
without shutting anything down (``os._exit``), as a crashed process does.  Rank 0 waits a second,
enters a barrier (a patient switch round, which would wait for a late rank up to the group's
timeout) and reports what it raised and how long it took: its probes of rank 1's presence socket
draw ICMP port unreachable from rank 1's host.
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
pg = dist.distributed_c10d._get_default_group()
x = torch.ones(4)
dist.all_reduce(x)
dist.barrier()
if RANK == 1:
    write_result({"sum": x.tolist()})
    os._exit(0)
time.sleep(1.0)  # rank 1 is gone
t0 = time.monotonic()
try:
    dist.barrier()
    error = None
except Exception as exc:  # noqa: BLE001 - the test inspects it
    error = {"type": type(exc).__name__, "is_homagg": isinstance(exc, homagg.HomAggError),
             "ranks": list(getattr(exc, "ranks", ())), "message": str(exc)[:600]}
write_result({"sum": x.tolist(), "error": error, "seconds": time.monotonic() - t0, "path": pg.path,
              "probes": pg.switch.port.peers.sent if pg.switch.port.peers is not None else None})
os._exit(0)  # the group is out of step: no orderly shutdown
