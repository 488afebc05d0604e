"""Rank script: ``ProcessGroupHomagg.monitored_barrier`` with every rank on time, and with late ranks.

Scenarios (each on its own barrier, ranks realigned by a gloo barrier in between):
``all``: every rank arrives (``wait_all_ranks`` False and True); ``one_late``: the last rank
arrives only after the others' timeout; ``two_late_first`` / ``two_late_all``: ranks 1 and the
last arrive late, with ``wait_all_ranks`` False (the first late rank is named) and True (both are).
A rank returns, per scenario, ``"ok"`` or the error's type, its ``ranks`` and message; the test
judges.  Also records what torch's own ``dist.monitored_barrier`` says for a homagg group.
"""

from __future__ import annotations

import datetime
import os
import time
import warnings

import torch.distributed as dist

import homagg
from _launch import write_result

warnings.filterwarnings("ignore")
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
TIMEOUT = datetime.timedelta(seconds=2.5)
LATE_S = 4.0

dist.init_process_group("homagg", timeout=datetime.timedelta(seconds=60))
gloo = dist.new_group(backend="gloo")
pg = dist.group.WORLD


def attempt(late: set[int], wait_all: bool) -> dict:
    if RANK in late:
        time.sleep(LATE_S)
    t0 = time.monotonic()
    try:
        pg.monitored_barrier(timeout=TIMEOUT, wait_all_ranks=wait_all)
        out: dict = {"outcome": "ok"}
    except homagg.HomAggError as exc:
        out = {"outcome": type(exc).__name__, "ranks": list(getattr(exc, "ranks", ())), "message": str(exc),
               "is_timeout": isinstance(exc, TimeoutError)}
    out["seconds"] = time.monotonic() - t0
    dist.barrier(group=gloo)  # realign: the late ranks are done too
    return out


result: dict = {
    "all": attempt(set(), False),
    "all_wait_all": attempt(set(), True),
    "one_late": attempt({WORLD - 1}, False),
    "two_late_first": attempt({1, WORLD - 1}, False),
    "two_late_all": attempt({1, WORLD - 1}, True),
    "after": attempt(set(), True),
}
try:
    dist.monitored_barrier(timeout=TIMEOUT)
    result["torch_api"] = "accepted"
except Exception as exc:  # noqa: BLE001 - the test reads torch's refusal
    result["torch_api"] = f"{type(exc).__name__}: {exc}"
dist.destroy_process_group()
write_result(result)
