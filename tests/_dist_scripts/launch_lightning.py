"""``python launch_lightning.py BACKEND OUT``: Lightning's Trainer on 2 CPU processes with
``DDPStrategy(process_group_backend=BACKEND)`` (Lightning's own launcher starts the second process
by running this script again), ``self.log(..., sync_dist=True)`` every step (a 1-element
all_reduce); rank 0 writes the backend, steps, last loss and the trained parameters to OUT."""

import json
import sys

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch import nn


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch, _):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    backend, out = sys.argv[1], sys.argv[2]
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=16)
    model = Model()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=backend),
                        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, data)
    if trainer.global_rank == 0:
        with open(out, "w") as f:
            json.dump({"backend": dist.get_backend(), "steps": trainer.global_step,
                       "loss": float(trainer.callback_metrics["train_loss"]),
                       "params": [p.detach().double().flatten().tolist() for p in model.parameters()]}, f)
    # every rank, before the interpreter exits: the group's threads joined here rather than torn
    # down with the interpreter (gloo's reference run aborted there once in ten fresh-clone runs:
    # "terminate called without an active exception", exit status -6, after writing its result)
    if dist.is_initialized():
        dist.destroy_process_group()
