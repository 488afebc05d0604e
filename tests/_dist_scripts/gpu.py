"""Rank script (needs CUDA): allreduce of CUDA tensors and DDP of a CUDA model on the homagg group
(its embedded emulator on loopback), and the same on a gloo group of the same ranks.

The rank returns what it got (result, device, whether the result landed in the caller's tensor,
the DDP-trained parameters, gloo's result and parameters); ``tests/test_torch_gpu.py`` judges it
against oracles computed there and against gloo.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from _ddp_model import Net, batch, run_steps
from _launch import make_input, run_checks, tensor_to_json, write_result

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
DEV = torch.device("cuda", RANK % torch.cuda.device_count())
torch.cuda.set_device(DEV)
dist.init_process_group("homagg")
GLOO = dist.new_group(backend="gloo")
SPEC = {"shape": [100_000], "density": 0.1, "seed": 9, "dtype": "float32"}


def allreduce_cuda() -> dict:
    y = make_input(RANK, SPEC).to(DEV)
    ptr = y.data_ptr()
    dist.all_reduce(y)
    z = make_input(RANK, SPEC).to(DEV)
    dist.all_reduce(z, group=GLOO)
    return {"input": SPEC, "result": tensor_to_json(y), "device": str(y.device), "expected_device": str(DEV),
            "in_place": y.data_ptr() == ptr, "gloo_result": tensor_to_json(z)}


def _trained(group: dist.ProcessGroup | None) -> torch.Tensor:
    torch.manual_seed(7)
    model = Net().to(DEV)
    ddp = DDP(model, device_ids=[DEV], process_group=group)

    def loss_at(step: int) -> torch.Tensor:
        x, y = batch(step, RANK)
        return nn.functional.mse_loss(ddp(x.to(DEV)), y.to(DEV))

    return run_steps(ddp, loss_at)


def ddp_cuda() -> dict:
    params = _trained(None)  # the default group: homagg
    return {"params": tensor_to_json(params), "device": str(params.device)}


def ddp_cuda_gloo() -> dict:
    return {"params": tensor_to_json(_trained(GLOO))}


write_result(run_checks([("allreduce_cuda", allreduce_cuda), ("ddp_cuda", ddp_cuda), ("ddp_cuda_gloo", ddp_cuda_gloo)]))
dist.destroy_process_group()
