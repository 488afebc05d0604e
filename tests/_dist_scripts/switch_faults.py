"""Rank script: the embedded switch fails in ways the group must get through quickly.

``SCENARIO``:

* ``restart_fails``: after a first call, rank 0 SIGKILLs the embedded emulator and, from then on,
  every start of a new one fails for real: rank 0's environment names a log level the emulator's
  command line refuses (``HOMAGG_EMULATOR_LOG_LEVEL``), so each child exits at once and the group's
  returns fail on rank 0 only;
* ``drop_all``: after a first call, rank 0 sets the embedded emulator to drop every datagram
  (fault injection: ``HOMAGG_EMULATOR_FAULTS=1``); the switch still answers its control port and
  holds the job.

Then every rank runs ``CALLS`` more all_reduces of integer-valued floats (exact sums in float32),
timing each.  Each rank reports every call's result and seconds, the path after it, the group's
path statistics, transitions and PathWarnings, or, for the first call that raised, its type,
message and seconds (then it stops: the group is unusable).
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
WORLD = int(os.environ["WORLD_SIZE"])
SCENARIO = os.environ["SCENARIO"]
CALLS = int(os.environ.get("CALLS", "8"))
N = int(os.environ.get("N", "50000"))
PAUSE_S = float(os.environ.get("PAUSE_S", "0.3"))

dist.init_process_group("homagg")
gloo = dist.new_group(backend="gloo")  # the test's own channel, not the group under test
pg = dist.distributed_c10d._get_default_group()


def data(rank: int, call: int) -> torch.Tensor:
    return (torch.arange(N, dtype=torch.float32) % 1000) * (rank + 1) + call


first = data(RANK, 0)
dist.all_reduce(first)
if RANK == 0:
    emulator = pg.switch.emulator
    if SCENARIO == "restart_fails":
        os.environ["HOMAGG_EMULATOR_LOG_LEVEL"] = "not-a-level"  # every later start of the emulator fails
        os.kill(emulator.process.pid, signal.SIGKILL)
        emulator.process.wait(10)
    elif SCENARIO == "drop_all":
        with ControlClient(pg.switch.control, secret=emulator.secret) as ctl:
            ctl.set_faults(drop=1.0)
    else:
        raise SystemExit(f"unknown SCENARIO {SCENARIO!r}")
dist.barrier(group=gloo)
calls: list[dict] = []
error = None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for call in range(1, CALLS + 1):
        x = data(RANK, call)
        t0 = time.monotonic()
        try:
            dist.all_reduce(x)
        except homagg.HomAggError as exc:
            error = {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - t0,
                     "call": call}
            break
        calls.append({"result": tensor_to_json(x), "seconds": time.monotonic() - t0, "path": pg.path,
                      "link": pg.switch.kind})
        time.sleep(PAUSE_S)
write_result({
    "first": tensor_to_json(first),
    "calls": calls,
    "error": error,
    "paths": dict(pg.stats.paths),
    "transitions": pg.stats.transitions,
    "warnings": [str(w.message) for w in caught if issubclass(w.category, homagg.PathWarning)],
})
if error is not None:
    os._exit(0)  # the group is unusable (ranks may be out of step): no collective teardown
dist.destroy_process_group()
