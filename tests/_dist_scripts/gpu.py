"""Rank script (needs CUDA): allreduce of CUDA tensors and DDP of a CUDA model on the homagg group."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from _launch import run_checks, write_result

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
DEV = torch.device("cuda", RANK % torch.cuda.device_count())
torch.cuda.set_device(DEV)
dist.init_process_group("homagg")
GLOO = dist.new_group(backend="gloo")


def allreduce_cuda() -> dict:
    g = torch.Generator().manual_seed(RANK)
    x = torch.randn(100_000, generator=g)
    x[torch.rand(100_000, generator=g) > 0.1] = 0
    ref = x.double().clone()
    dist.all_reduce(ref, group=GLOO)
    y = x.to(DEV)
    ptr = y.data_ptr()
    dist.all_reduce(y)
    assert y.device == DEV and y.data_ptr() == ptr, "result must land in the caller's CUDA tensor"
    m = torch.tensor([x.abs().max().item()], dtype=torch.float64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=GLOO)
    err = float((y.cpu().double() - ref).abs().max())
    assert err <= WORLD * 2.0**-22 * float(m) + 1e-7, err
    return {"max_err": err}


def ddp_cuda() -> None:
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Embedding(1000, 8), nn.Flatten(), nn.Linear(32, 4)).to(DEV), device_ids=[DEV])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.randint(0, 1000, (16, 4), device=DEV)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    everyone = [torch.empty_like(flat) for _ in range(WORLD)]
    dist.all_gather(everyone, flat, group=GLOO)
    assert all(torch.equal(everyone[0], e) for e in everyone)


write_result(run_checks([("allreduce_cuda", allreduce_cuda), ("ddp_cuda", ddp_cuda)]))
dist.destroy_process_group()
