"""Rank script: DDP on a ``homagg`` group beyond one switch (the embedded tree) and the same over gloo.

The DDP tests' model, data and loop (:mod:`_ddp_model`, scenario ``basic``: ``STEPS`` SGD steps of
an embedding + MLP); two replicas from the same seed, one in DDP over the default ``homagg`` group,
one over a gloo group.  Each rank returns both final parameter vectors, the initial ones, the
paths the homagg group's calls took and its leaf's world size; the test judges them (against
gloo's training and the one-process replay).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from _ddp_model import Net, batch, run_steps
from _launch import tensor_to_json, write_result

RANK = int(os.environ["RANK"])
torch.set_num_threads(1)
dist.init_process_group("homagg", timeout=datetime.timedelta(seconds=240))
GLOO = dist.new_group(backend="gloo")
pg = dist.distributed_c10d._get_default_group()


def train(group: dist.ProcessGroup | None) -> torch.Tensor:
    torch.manual_seed(7)
    ddp = DDP(Net(), process_group=group)

    def loss_at(step: int) -> torch.Tensor:
        x, y = batch(step, RANK)
        return nn.functional.mse_loss(ddp(x), y)

    return run_steps(ddp, loss_at)


torch.manual_seed(7)
start = torch.cat([p.detach().flatten() for p in Net().parameters()])
mine = train(None)
theirs = train(GLOO)
result = {"homagg": tensor_to_json(mine), "gloo": tensor_to_json(theirs), "start": tensor_to_json(start),
          "paths": dict(pg.stats.paths), "calls": sum(pg.stats.paths.values()), "kind": pg.switch.kind,
          "leaf_world": pg.switch.port.job.world_size}
dist.destroy_process_group()
write_result(result)
