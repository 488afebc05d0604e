"""Rank script: rank 1 is alive but never enters the barrier (a hung rank, or ranks out of step):
rank 0's barrier, a patient switch round, ends at the group's timeout (``GROUP_TIMEOUT_S``) with
:class:`homagg.RankTimeoutError` naming rank 1, once: no fallback to the host path, which would
wait for rank 1 a second time.  Rank 1 stays alive past that, then both leave without shutting
down (the group is out of step)."""

from __future__ import annotations

import os
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import homagg
from _launch import write_result

RANK = int(os.environ["RANK"])
GROUP_TIMEOUT_S = float(os.environ["GROUP_TIMEOUT_S"])
dist.init_process_group("homagg", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
pg = dist.distributed_c10d._get_default_group()
dist.all_reduce(torch.ones(1))
result: dict = {}
if RANK == 1:
    time.sleep(GROUP_TIMEOUT_S + 4.0)  # alive: its presence socket open, never in the barrier
else:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.monotonic()
        try:
            dist.barrier()
            result["error"] = None
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            result["error"] = {"type": type(exc).__name__, "is_runtime_error": isinstance(exc, RuntimeError),
                               "ranks": list(getattr(exc, "ranks", ())), "message": str(exc)[:500]}
        result["seconds"] = time.monotonic() - t0
    result["warnings"] = [str(w.message) for w in caught if issubclass(w.category, homagg.PathWarning)]
    result["transitions"] = pg.stats.transitions
write_result(result)
os._exit(0)
