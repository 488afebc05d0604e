"""Rank script: ``init_process_group("homagg", pg_options={"compress": SPEC})`` with DDP.

argv[1]: the spec ("none" for exact); argv[2]: the scheme.  Trains a small regression model for a few steps; reports a
digest of the final parameters, the group's bytes sent, the loss trajectory, and the result of a
plain (not backward) ``dist.all_reduce``, which must stay exact under compression.
"""

from __future__ import annotations

import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import homagg.torch  # noqa: F401 - registers the backend
from _launch import write_result

RANK = int(os.environ["RANK"])
spec = sys.argv[1]
dist.init_process_group("homagg", pg_options={"compress": spec, "scheme": sys.argv[2]})
pg = dist.distributed_c10d._get_default_group()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(100 + RANK)
teacher = torch.randn(64, 1, generator=torch.Generator().manual_seed(7))
losses = []
before = pg.stats.bytes_sent
for _ in range(30):
    x = torch.randn(32, 64, generator=gen)
    loss = nn.functional.mse_loss(model(x), x @ teacher)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(float(loss))
sent = pg.stats.bytes_sent - before
plain = torch.full((1000,), float(RANK + 1))
dist.all_reduce(plain)
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
write_result({"losses": losses, "bytes": sent, "digest": digest, "compressor": repr(pg.compressor),
              "plain_ok": bool(torch.equal(plain, torch.full((1000,), float(sum(range(1, dist.get_world_size() + 1))))))})
dist.destroy_process_group()
