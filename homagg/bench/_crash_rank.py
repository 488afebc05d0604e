"""One rank of ``homagg bench faults``' ``crash`` part: DDP training while the switch crashes.

Run as ``python -m homagg.bench._crash_rank CONFIG_JSON`` by :mod:`._crash` (one process per rank,
``init_process_group`` from the environment).  The model is an MLP of ``width`` (float32, SGD);
each rank's batches are seeded by (step, rank).  With ``kill_at`` set, rank 0 SIGKILLs the group's
embedded emulator right before that step; the group continues on the host path and starts a new
emulator at a probe (``HOMAGG_PROBE_INTERVAL``).  ``step_s`` seconds of sleep per step stand for
the compute a real step has.

Prints one :data:`~homagg.bench._ranks.RECORD_MARK` line: per step its wall time and path, the
loss, a digest of the final parameters, and the group's path statistics.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ._ranks import RECORD_MARK, die_with_launcher

__all__ = ["main", "mlp", "batch", "train_step"]


def mlp(seed: int, width: int) -> tuple[DDP, torch.optim.Optimizer]:
    """The DDP-wrapped MLP (3 layers of ``width``, 16 outputs; seeded) and its SGD optimizer."""
    torch.manual_seed(seed)
    model = DDP(nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                              nn.Linear(width, 16)))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def batch(seed: int, step: int, rank: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s (input, target) of ``step``: the same in every run with the same seed."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1000 + rank)
    return torch.randn(32, width, generator=g), torch.randn(32, 16, generator=g)


def train_step(model: DDP, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One SGD step on the squared error (DDP allreduces the gradients in backward); the loss."""
    opt.zero_grad()
    loss = (model(x) - y).square().mean()
    loss.backward()
    opt.step()
    return loss


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    die_with_launcher()
    rank = int(os.environ["RANK"])
    dist.init_process_group("homagg")
    pg = dist.distributed_c10d._get_default_group()
    width = cfg["width"]
    model, opt = mlp(cfg["seed"], width)
    steps, paths, losses = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the transitions are in the record
        for step in range(cfg["steps"]):
            if rank == 0 and step == cfg.get("kill_at"):
                os.kill(pg.switch.emulator.process.pid, signal.SIGKILL)
            x, y = batch(cfg["seed"], step, rank, width)
            t0 = time.perf_counter()
            loss = train_step(model, opt, x, y)
            steps.append(time.perf_counter() - t0)
            paths.append(pg.path)
            losses.append(loss.item())
            time.sleep(cfg["step_s"])
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]
    print(RECORD_MARK + json.dumps({
        "rank": rank, "step_s": steps, "paths": paths, "losses": losses, "param_digest": digest,
        "params": int(flat.numel()), "stats_paths": dict(pg.stats.paths), "transitions": pg.stats.transitions,
    }), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
