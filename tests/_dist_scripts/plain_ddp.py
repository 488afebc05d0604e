"""A plain DDP training script; the only homagg-specific thing is the backend name.

It does not import homagg: under torchrun the ``torch.backends`` entry point registers the
backend during ``import torch``, and rank 0 starts the embedded switch emulator.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("homagg")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Embedding(1000, 16), nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    g = torch.Generator().manual_seed(step * 100 + rank)
    x, y = torch.randint(0, 1000, (32, 4), generator=g), torch.randn(32, 1, generator=g)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
dist.all_gather(everyone, flat)
assert all(torch.equal(everyone[0], e) for e in everyone), "replicas diverged"
print(f"plain_ddp ok backend={dist.get_backend()} loss={loss.item():.4f}", flush=True)
dist.destroy_process_group()
