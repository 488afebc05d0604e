"""Rank script: all_reduce on a homagg group of more ranks than one switch takes (a tree of switches).

The group is the default ``homagg`` one (embedded: rank 0 starts the tree of emulators, or the tree
job file ``HOMAGG_SWITCH`` names).  Every reduction returns its input spec (``make_input``) and its
result; SUM of integers and MAX also return gloo's result of the same inputs.  The test judges them
(exact sums, README's bound for floats, gloo).  Rank 0 also reports the tree it started (its
emulators' count, each one's exit status after ``destroy_process_group``), every rank its leaf's
job (world size, parent) and the port's world size (the whole job's: the codec's headroom).

``KILL`` = ``leaf`` or ``root`` (embedded only): rank 0 SIGKILLs that emulator of the tree after
``KILL_AFTER`` calls; every call after it must still be right (the host path, then a new tree).
"""

from __future__ import annotations

import datetime
import os
import signal
import time
import warnings

import torch
import torch.distributed as dist

import homagg
from _launch import make_input, run_checks, tensor_to_json, write_result

warnings.filterwarnings("ignore", category=FutureWarning)
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
KILL = os.environ.get("KILL", "none")
KILL_AFTER = int(os.environ.get("KILL_AFTER", "2"))
CALLS = int(os.environ.get("CALLS", "0"))
torch.set_num_threads(1)
t0 = time.monotonic()
dist.init_process_group("homagg", timeout=datetime.timedelta(seconds=float(os.environ.get("GROUP_TIMEOUT", "240"))))
CREATE_S = time.monotonic() - t0
GLOO = dist.new_group(backend="gloo")
pg = dist.distributed_c10d._get_default_group()
J = tensor_to_json
N = int(os.environ.get("N", "3000"))


def spec(seed: int, dtype: str, density: float = 0.2, **kw: object) -> dict:
    return {"shape": [N], "density": density, "seed": seed, "dtype": dtype, "scale": 3.0, **kw}


def reduce(seed: int, dtype: str, op: dist.ReduceOp = dist.ReduceOp.SUM, **kw: object) -> dict:
    s = spec(seed, dtype, **kw)
    x = make_input(RANK, s)
    y, g = x.clone(), x.clone()
    dist.all_reduce(y, op=op)
    out = {"input": s, "result": J(y), "divisor": WORLD if op == dist.ReduceOp.AVG else 1}
    if not x.dtype.is_floating_point or op == dist.ReduceOp.MAX:
        dist.all_reduce(g, op=op, group=GLOO)
        out["gloo"] = J(g)
    return out


def tree_info() -> dict:
    link = pg.switch
    port = link.port
    return {"kind": link.kind, "leaf_world": port.job.world_size, "parent": port.job.parent is not None,
            "port_world": port.world_size, "worker_id": port.rank, "emulators": len(link.emulators),
            "token": port.job.token, "job_id": port.job.job_id, "n_slots": port.job.n_slots,
            "words_per_packet": port.job.words_per_packet,
            "create_s": round(CREATE_S, 2)}


CHECKS = [
    ("tree", tree_info),
    ("sum_float32", lambda: reduce(1, "float32")),
    ("avg_float32", lambda: reduce(2, "float32", dist.ReduceOp.AVG)),
    ("sum_float64", lambda: reduce(3, "float64")),
    ("sum_float16", lambda: reduce(4, "float16")),
    ("sum_bfloat16", lambda: reduce(5, "bfloat16")),
    ("sum_int32", lambda: reduce(6, "int32", density=0.67, high=2**20)),
    ("sum_int64", lambda: reduce(7, "int64", density=0.67, high=2**40)),
    ("max_float32", lambda: reduce(8, "float32", dist.ReduceOp.MAX)),
]


def run_calls() -> list[dict]:
    """``CALLS`` float32 SUMs, rank 0 killing a tree switch after ``KILL_AFTER`` of them."""
    out = []
    for call in range(CALLS):
        if KILL != "none" and RANK == 0 and call == KILL_AFTER:
            victim = pg.switch.emulators[0 if KILL == "root" else -1]
            os.kill(victim.process.pid, signal.SIGKILL)
        started = time.monotonic()
        out.append({**reduce(100 + call, "float32"), "path": pg.path, "s": round(time.monotonic() - started, 3)})
    return out


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = run_checks(CHECKS + [("calls", run_calls)] if CALLS else CHECKS)
result["transitions"] = pg.stats.transitions
result["path_warnings"] = [str(w.message) for w in caught if issubclass(w.category, homagg.PathWarning)]
emulators = list(pg.switch.emulators) if pg.path == "switch" else []
dist.destroy_process_group()
result["emulators_exited"] = [e.process.poll() is not None for e in emulators]
write_result(result)
