"""``torchrun --nproc-per-node 2 launch_torchrun.py OUT``: a new user's first script under torchrun.

Nothing homagg-specific but the backend name (the ``torch.backends`` entry point registers it
during ``import torch``).  Each rank all_reduces inputs the test regenerates (float32 vectors and
a 1-element metric seeded by rank, an int64 vector) and writes its results to ``OUT/rank<r>.json``.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("homagg")
rank, world = dist.get_rank(), dist.get_world_size()
g = torch.Generator().manual_seed(1000 + rank)
vector, metric = torch.randn(3000, generator=g), torch.randn(1, generator=g)
counts = torch.arange(10, dtype=torch.int64) * (rank + 1)
for t in (vector, metric, counts):
    dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump({"backend": dist.get_backend(), "world": world, "vector": vector.tolist(), "metric": metric.tolist(),
               "counts": counts.tolist()}, f)
dist.destroy_process_group()
