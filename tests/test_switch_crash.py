"""Switch crash with ``HOMAGG_FALLBACK=error``: the embedded emulator (its own process) is SIGKILLed
in the middle of an all_reduce.  (With the default, ``host``, the group continues on the host path:
tests/test_switch_fallback.py.)

Two rank processes of a ``homagg`` process group; rank 0 owns the embedded emulator.  Oracle: the
process table and the exact sum.  Every rank must get a :class:`homagg.HomAggError` (typed, no
hang) within ``HOMAGG_TIMEOUT`` plus a margin, a *new* process group must then aggregate exactly
(through a new emulator), and when the ranks exit neither emulator process is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._dist_scripts._launch import free_port, process_alive

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 8.0

RANK = r"""
import json, os, signal, sys, threading, time
import torch, torch.distributed as dist
import homagg

rank = int(os.environ["RANK"])
dist.init_process_group("homagg")
gloo = dist.new_group(backend="gloo")
pg = dist.distributed_c10d._get_default_group()
out = {"rank": rank}
x = torch.ones(1000)
dist.all_reduce(x)  # the switch works
assert x[0].item() == 2.0
pid = [pg.switch.emulator.process.pid if rank == 0 else 0]
dist.broadcast_object_list(pid, src=0, group=gloo)
out["emulator_pid"] = pid[0]
big = torch.randn(6_000_000)
dist.barrier(group=gloo)
if rank == 0:  # kill mid-all_reduce: once 200 of its datagrams are out (not after a fixed delay)
    port = pg.switch.port
    sent0 = port.stats["packets"]
    def kill_when_sending():
        deadline = time.monotonic() + 60
        while port.stats["packets"] < sent0 + 200 and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(pid[0], signal.SIGKILL)
    threading.Thread(target=kill_when_sending, daemon=True).start()
t0 = time.monotonic()
try:
    dist.all_reduce(big)
    out["error"] = None
except Exception as exc:
    out.update(error=type(exc).__name__, is_homagg=isinstance(exc, homagg.HomAggError), message=str(exc)[:300])
out["seconds"] = time.monotonic() - t0
dist.barrier(group=gloo)
g2 = dist.new_group(backend="homagg")  # a new process group: a new embedded emulator
y = torch.full((50_000,), float(rank + 1))
dist.all_reduce(y, group=g2)
out["after_exact"] = bool((y == 3.0).all())
if rank == 0:
    out["new_emulator_pid"] = g2.switch.emulator.process.pid
    out["new_emulator"] = out["new_emulator_pid"] != out["emulator_pid"]
dist.destroy_process_group()
print("@result@" + json.dumps(out), flush=True)
"""



@pytest.mark.slow
def test_emulator_killed_mid_all_reduce_typed_error_then_new_group_works() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2", "HOMAGG_TIMEOUT": str(TIMEOUT_S), "PYTHONUNBUFFERED": "1",
           "HOMAGG_FALLBACK": "error"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=180)
            outs.append(text)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    results = []
    for r, text in enumerate(outs):
        lines = [ln for ln in text.splitlines() if ln.startswith("@result@")]
        assert lines, f"rank {r} reported nothing (exit {procs[r].returncode}):\n{text[-3000:]}"
        results.append(json.loads(lines[0][len("@result@"):]))
    for res in results:
        assert res["error"] is not None, "the all_reduce finished before the kill: make it bigger"
        assert res["is_homagg"], res  # typed: a HomAggError, e.g. SwitchTimeoutError
        assert res["seconds"] < TIMEOUT_S + 20, res  # no hang: within the timeout (+ CPU-noise margin)
        assert res["after_exact"], res  # a new process group aggregates exactly afterwards
    assert results[0]["new_emulator"]  # the dead emulator was not handed out again
    print(json.dumps([{k: r.get(k) for k in ("rank", "error", "seconds", "after_exact")} for r in results]))
    pids = [results[0]["emulator_pid"], results[0].get("new_emulator_pid") or 0]
    deadline = time.monotonic() + 10
    while any(p and process_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p and process_alive(p) for p in pids), f"emulator process left behind: {pids}"
