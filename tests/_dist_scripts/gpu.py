"""Rank script (needs CUDA): allreduce of CUDA tensors and DDP of a CUDA model on the homagg group.

The rank returns what it got (result, device, whether the result landed in the caller's tensor,
the DDP-trained parameters); ``tests/test_torch_gpu.py`` judges it against oracles computed there.
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
SPEC = {"shape": [100_000], "density": 0.1, "seed": 9, "dtype": "float32"}


def allreduce_cuda() -> dict:
    y = make_input(RANK, SPEC).to(DEV)
    ptr = y.data_ptr()
    dist.all_reduce(y)
    return {"input": SPEC, "result": tensor_to_json(y), "device": str(y.device), "expected_device": str(DEV),
            "in_place": y.data_ptr() == ptr}


def ddp_cuda() -> dict:
    torch.manual_seed(7)
    model = Net().to(DEV)
    ddp = DDP(model, device_ids=[DEV])

    def loss_at(step: int) -> torch.Tensor:
        x, y = batch(step, RANK)
        return nn.functional.mse_loss(ddp(x.to(DEV)), y.to(DEV))

    return {"params": tensor_to_json(run_steps(ddp, loss_at))}


write_result(run_checks([("allreduce_cuda", allreduce_cuda), ("ddp_cuda", ddp_cuda)]))
dist.destroy_process_group()
