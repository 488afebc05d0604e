"""Rank script: DDP training on the homagg group vs the same training on a gloo group.

Model: ``nn.Embedding`` + MLP (sparse gradients: few embedding rows are touched per step).  For
each scenario two replicas start from the same seed, one wrapped in DDP over the default
``homagg`` group, one over a gloo group; after several steps the homagg parameters must be
bit-identical across ranks and within ``tol`` of gloo's.  Scenarios are picked by argv.
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
from _launch import run_checks, write_result

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
STEPS = 5
torch.set_num_threads(1)
(torch.randn(8, 8, requires_grad=True) @ torch.randn(8, 8)).sum().backward()  # warm torch's pools
TASKS_BEFORE = len(os.listdir("/proc/self/task"))
dist.init_process_group("homagg")
GLOO = dist.new_group(backend="gloo")


class Net(nn.Module):
    def __init__(self, sparse: bool = False, bn: bool = False, unused: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(2000, 16, sparse=sparse)
        self.mlp = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64) if bn else nn.Identity(), nn.ReLU(), nn.Linear(64, 4))
        self.unused = nn.Linear(4, 4) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(x).flatten(1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randint(0, 2000, (16, 4), generator=g), torch.randn(16, 4, generator=g)


def train(group: dist.ProcessGroup | None, *, model_kw: dict, ddp_kw: dict, hook: Callable | None = None,
          no_sync: bool = False) -> tuple[torch.Tensor, int]:
    torch.manual_seed(7)
    model = Net(**model_kw)
    ddp = DDP(model, process_group=group, **ddp_kw)
    if hook is not None:
        hook(ddp, group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = batch(step)
        loss = nn.functional.mse_loss(ddp(x), y)
        if no_sync and step % 2 == 0:
            with ddp.no_sync():
                loss.backward()
            continue
        loss.backward()
        opt.step()
        opt.zero_grad()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    buffers = [b.detach().flatten().float() for b in model.buffers()]
    return torch.cat([params, *buffers]), params.numel()


def compare(mine: tuple[torch.Tensor, int], theirs: tuple[torch.Tensor, int], tol: float) -> dict:
    """Parameters bit-identical across ranks (buffers such as BatchNorm statistics are per rank)."""
    (mine, n_params), (theirs, _) = mine, theirs
    params = mine[:n_params].contiguous()
    everyone = [torch.empty_like(params) for _ in range(WORLD)]
    dist.all_gather(everyone, params, group=GLOO)
    assert all(torch.equal(everyone[0], e) for e in everyone), "parameters differ across ranks"
    err = float((mine - theirs).abs().max())
    assert err <= tol, f"max |homagg - gloo| = {err} > {tol}"
    return {"max_err": err}


def scenario(model_kw: dict | None = None, ddp_kw: dict | None = None, hook_h: Callable | None = None,
             hook_g: Callable | None = None, tol: float = 1e-5, no_sync: bool = False, homagg_group: bool = True):
    def run() -> dict:
        kw = dict(model_kw=model_kw or {}, ddp_kw=ddp_kw or {}, no_sync=no_sync)
        mine = train(None if homagg_group else GLOO, hook=hook_h, **kw)
        theirs = train(GLOO, hook=hook_g, **kw)
        return compare(mine, theirs, tol)
    return run


def powersgd_hook(ddp: DDP, group: dist.ProcessGroup | None) -> None:
    state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                   min_compression_rate=0.5, use_error_feedback=True, random_seed=0)
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)


def fp16_hook(ddp: DDP, group: dist.ProcessGroup | None) -> None:
    ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)


def homagg_hook(ddp: DDP, group: dist.ProcessGroup | None) -> None:
    ddp.register_comm_hook(hh.State(process_group=GLOO, scheme="auto"), hh.allreduce_hook)


SCENARIOS = {
    "basic": scenario(),
    "sparse_embedding": scenario(model_kw={"sparse": True}),
    "find_unused": scenario(model_kw={"unused": True}, ddp_kw={"find_unused_parameters": True}),
    "no_sync": scenario(no_sync=True),
    "static_graph": scenario(ddp_kw={"static_graph": True}),
    "batchnorm": scenario(model_kw={"bn": True}),
    "powersgd_hook": scenario(hook_h=powersgd_hook, hook_g=powersgd_hook, tol=1e-4),
    "fp16_hook": scenario(hook_h=fp16_hook, hook_g=fp16_hook, tol=2e-3),
    "homagg_comm_hook": scenario(hook_h=homagg_hook, homagg_group=False),
}
names = sys.argv[1:] or list(SCENARIOS)
results = run_checks([(n, SCENARIOS[n]) for n in names])
dist.destroy_process_group()
del GLOO
gc.collect()
results["threads_after_destroy"] = sorted(t.name for t in threading.enumerate())
results["os_threads"] = [TASKS_BEFORE, len(os.listdir("/proc/self/task"))]
results["os_thread_names"] = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
results["live_groups"] = sum(isinstance(o, dist.ProcessGroup) for o in gc.get_objects())
write_result(results)
