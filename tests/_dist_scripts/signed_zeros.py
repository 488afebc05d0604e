"""Rank script: in-place ``dist.all_reduce`` of floats whose zeros have a different sign on each rank.

One homagg group per scheme (``auto`` twice, steered to each sparse continuation); every rank
returns its input and its result per group and dtype, bit for bit; the test
(``tests/test_torch_signed_zeros.py``) judges them.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

import homagg  # noqa: F401 - registers the backend
from _launch import run_checks, tensor_to_json, write_result

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
NUMEL = 5000  # several blocks: the general path, not the small one
GROUPS = {"dense": {"scheme": "dense"}, "sketch": {"scheme": "sketch"}, "compact": {"scheme": "compact"},
          "auto-sketch": {"scheme": "auto", "codec": {"peel_ns": 0.0}},
          "auto-compact": {"scheme": "auto", "codec": {"rtt_us": 0.0, "compact_ns": 0.0, "peel_ns": 1e6}}}
DTYPES = ("float16", "bfloat16", "float32", "float64")

dist.init_process_group("homagg", timeout=timedelta(seconds=60))


def signed_input(dtype: str) -> torch.Tensor:
    """Zeros of this rank's random signs, nonzeros at 2% of the elements (some shared)."""
    g = torch.Generator().manual_seed(RANK)
    shared = torch.Generator().manual_seed(1000)
    x = torch.where(torch.rand(NUMEL, generator=g) < 0.5, -1.0, 1.0).to(torch.float64) * 0.0
    hit = (torch.rand(NUMEL, generator=g) < 0.01) | (torch.rand(NUMEL, generator=shared) < 0.01)
    x[hit] = torch.randn(int(hit.sum()), generator=g, dtype=torch.float64)
    return x.to(getattr(torch, dtype))


def check_group(options: dict) -> dict:
    group = dist.new_group(backend="homagg", pg_options=options)
    out = {}
    for dtype in DTYPES:
        x = signed_input(dtype)
        y = x.clone()
        dist.all_reduce(y, group=group)
        out[dtype] = {"input": tensor_to_json(x), "result": tensor_to_json(y)}
    out["schemes"] = dict(group.stats.schemes)  # the continuations the codec ran
    return out


write_result(run_checks([(name, lambda o=o: check_group(o)) for name, o in GROUPS.items()]))
dist.destroy_process_group()
