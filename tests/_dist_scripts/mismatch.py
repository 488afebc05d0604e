"""Rank script: ranks call ``all_reduce`` on tensors of different sizes (then dtypes); every rank
must get :class:`homagg.RankMismatchError` naming the mismatch within one round trip.

argv[1]: ``numel`` (rank 0 1,000 elements, others 3,000) or ``dtype`` (rank 0 float64, others
float32).  Reports the error type, message and seconds, and whether a later collective on the
(now broken) group raises the same typed error at once.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import homagg
import homagg.torch  # noqa: F401 - registers the backend
from _launch import write_result

RANK = int(os.environ["RANK"])
case = sys.argv[1]
dist.init_process_group("homagg")
if case == "numel":
    x = torch.ones(1000 if RANK == 0 else 3000)
else:
    x = torch.ones(5000, dtype=torch.float64 if RANK == 0 else torch.float32)
result: dict = {}
t0 = time.monotonic()
try:
    dist.all_reduce(x)
    result["type"] = None
except Exception as exc:  # noqa: BLE001 - the test inspects the type
    result.update(type=type(exc).__name__, is_mismatch=isinstance(exc, homagg.RankMismatchError),
                  message=str(exc)[:400])
result["seconds"] = time.monotonic() - t0
t0 = time.monotonic()
try:
    dist.all_reduce(torch.ones(10))
except Exception as exc:  # noqa: BLE001
    result["after"] = type(exc).__name__
result["after_seconds"] = time.monotonic() - t0
dist.destroy_process_group()
write_result(result)
