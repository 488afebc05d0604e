"""Rank script: DDP training on the homagg group and the same training on a gloo group.

Model, data, scenarios and loop come from ``_ddp_model`` (the test replays them in one process
as the oracle).  For each scenario (picked by argv) two replicas start from the same seed, one
wrapped in DDP over the default ``homagg`` group (or, for ``homagg_comm_hook``, over gloo with
homagg's comm hook), one over a gloo group; the rank returns both final parameter vectors and the
test judges them.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 - before init: its defaults would capture (and keep) WORLD
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as default_hooks
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as powersgd
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg.torch.hooks as hh
from _ddp_model import SCENARIOS, Net, batch, run_steps
from _launch import run_checks, tensor_to_json, write_result

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
(torch.randn(8, 8, requires_grad=True) @ torch.randn(8, 8)).sum().backward()  # warm torch's pools
TASKS_BEFORE = len(os.listdir("/proc/self/task"))
dist.init_process_group("homagg")
GLOO = dist.new_group(backend="gloo")


def powersgd_hook(ddp: DDP, group: dist.ProcessGroup | None) -> None:
    state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                   min_compression_rate=0.5, use_error_feedback=True, random_seed=0)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)


def fp16_hook(ddp: DDP, group: dist.ProcessGroup | None) -> None:
    ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)


def homagg_hook(ddp: DDP, group: dist.ProcessGroup | None) -> None:
    ddp.register_comm_hook(hh.State(process_group=GLOO, scheme="auto"), hh.allreduce_hook)


HOOKS: dict[str, tuple[Callable | None, Callable | None]] = {  # name -> (hook on the homagg side, on gloo's)
    "powersgd": (powersgd_hook, powersgd_hook), "fp16": (fp16_hook, fp16_hook), "homagg": (homagg_hook, None),
}


def train(group: dist.ProcessGroup | None, hook: Callable | None, sc: dict) -> dict:
    """Final parameters and buffers (flat, as JSON) of one replica trained with DDP over ``group``."""
    torch.manual_seed(7)
    ddp = DDP(Net(**sc.get("model_kw", {})), process_group=group, **sc.get("ddp_kw", {}))
    if hook is not None:
        hook(ddp, group)

    def loss_at(step: int) -> torch.Tensor:
        x, y = batch(step, RANK)
        return nn.functional.mse_loss(ddp(x), y)

    params = run_steps(ddp, loss_at, ddp.no_sync if sc.get("no_sync") else None)
    buffers = torch.cat([torch.zeros(0), *(b.detach().flatten().float() for b in ddp.module.buffers())])
    return {"params": tensor_to_json(params), "buffers": tensor_to_json(buffers)}


def scenario(name: str) -> Callable[[], dict]:
    sc = SCENARIOS[name]
    hook_h, hook_g = HOOKS.get(sc.get("hook", ""), (None, None))

    def run() -> dict:
        mine = train(None if sc.get("homagg_group", True) else GLOO, hook_h, sc)
        theirs = train(GLOO, hook_g, sc)
        return {"homagg": mine, "gloo": theirs}
    return run


names = sys.argv[1:] or list(SCENARIOS)
results = run_checks([(n, scenario(n)) for n in names])
dist.destroy_process_group()
del GLOO
gc.collect()
results["threads_after_destroy"] = sorted(t.name for t in threading.enumerate())
results["os_threads"] = [TASKS_BEFORE, len(os.listdir("/proc/self/task"))]
results["os_thread_names"] = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
results["live_groups"] = sum(isinstance(o, dist.ProcessGroup) for o in gc.get_objects())
write_result(results)
