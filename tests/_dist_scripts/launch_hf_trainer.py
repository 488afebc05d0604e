"""``torchrun --nproc-per-node 2 launch_hf_trainer.py MODE OUT``: Hugging Face's Trainer on CPU.

MODE ``homagg``: ``init_process_group("homagg")`` before ``TrainingArguments`` (Accelerate then
takes the group that exists; ``TrainingArguments(ddp_backend="homagg")`` is refused by Accelerate,
which knows only its own list of backends); MODE ``gloo``: ``ddp_backend="gloo"``, the reference.
A small ``nn.Module`` that returns its loss (no download); rank 0 writes the backend, steps, loss
and the trained parameters to OUT."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

mode, out = sys.argv[1], sys.argv[2]
if mode == "homagg":
    dist.init_process_group("homagg")  # before TrainingArguments

from transformers import Trainer, TrainingArguments  # noqa: E402


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x, labels=None):
        y = self.net(x)
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y}


class Data(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(256, 8, generator=g)
        self.y = self.x.sum(1, keepdim=True).sin()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


torch.manual_seed(0)
model = Tiny()
args = TrainingArguments(output_dir=os.path.join(os.path.dirname(out), f"trainer-{mode}"), use_cpu=True,
                         per_device_train_batch_size=16, num_train_epochs=2, learning_rate=0.1, optim="sgd",
                         lr_scheduler_type="constant", report_to=[], save_strategy="no", seed=0, data_seed=0,
                         disable_tqdm=True, **({"ddp_backend": "gloo"} if mode == "gloo" else {}))
result = Trainer(model=model, args=args, train_dataset=Data()).train()
if args.process_index == 0:
    with open(out, "w") as f:
        json.dump({"backend": dist.get_backend(), "world": dist.get_world_size(), "steps": result.global_step,
                   "loss": result.training_loss,
                   "params": [p.detach().double().flatten().tolist() for p in model.parameters()]}, f)
dist.destroy_process_group()
