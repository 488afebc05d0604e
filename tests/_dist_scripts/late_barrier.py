"""Rank script: a barrier that one rank enters long after the others (rank 0 writing a checkpoint,
say) waits for it past the switch's progress timeout (``HOMAGG_TIMEOUT``, set low by the test): no
fallback, no warning, the group stays on the switch, and the port's RTO is what it was before the
barrier.  (A barrier as a switch round failed this: the early rank's round timed out at the
switch's timeout.)  Each rank reports when it entered and left, its path and transitions, the
warnings, the RTO before and after, and an all_reduce after the barrier."""

from __future__ import annotations

import os
import time
import warnings

import torch
import torch.distributed as dist

import homagg
from _launch import write_result

RANK = int(os.environ["RANK"])
LATE_S = float(os.environ["LATE_S"])
dist.init_process_group("homagg")
pg = dist.distributed_c10d._get_default_group()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(20):  # the RTO learns this host's round trips
        dist.all_reduce(torch.ones(1))
    rto = pg.switch.port.rtt.rto
    if RANK == 1:
        time.sleep(LATE_S)
    entered = time.time()
    dist.barrier()
    left = time.time()
    rto_after = pg.switch.port.rtt.rto
    after = torch.full((3,), float(RANK + 1))
    dist.all_reduce(after)
write_result({"entered": entered, "left": left, "path": pg.path, "transitions": pg.stats.transitions,
              "warnings": [str(w.message) for w in caught if issubclass(w.category, homagg.PathWarning)],
              "rto": rto, "rto_after": rto_after, "after": after.tolist()})
dist.destroy_process_group()
