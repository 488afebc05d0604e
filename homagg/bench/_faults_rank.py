"""One rank of ``homagg bench faults`` (a worker process of :mod:`homagg.bench._faults`):
all_reduces of int32 tensors through a UDP port until told to stop (soak) or a given number of
them (fuzz, loss), every result compared with the exact integer sum of every rank's input.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

__all__ = ["SIZES", "SCHEMES", "worker"]

SIZES = (1_000, 40_000, 3_000, 150_000)
SCHEMES = ("dense", "sketch", "compact", "auto")


def _data(rank: int, i: int, n: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng((seed, rank, i))
    x = rng.integers(-1000, 1001, n, dtype=np.int32)
    if i % 2:  # every other tensor sparse: the sparse schemes get their kind of input
        x[rng.random(n) > 0.02] = 0
    return torch.from_numpy(x)


def worker(rank: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """One worker: all_reduces until told to stop (soak) or ``iters`` of them; checks each result."""
    from .. import allreduce
    from ..jobs import JobSpec
    from ..transport import UdpSwitchPort

    torch.set_num_threads(1)
    world = cfg["world"]
    port = UdpSwitchPort(tuple(cfg["data"]), job=JobSpec.from_dict(cfg["job"]), rank=rank,
                         control=tuple(cfg["control"]), timeout=cfg["timeout"], secret=cfg["secret"])
    times: list[float] = []
    retx: list[int] = []
    inexact: list[str] = []
    schemes: dict[str, int] = {}
    deadline = time.time() + cfg.get("duration", 0.0)
    i = 0
    try:
        while True:
            if "duration" in cfg:
                stop = allreduce(torch.tensor([int(time.time() > deadline)], dtype=torch.int32), port, scheme="dense")
                if int(stop[0]):
                    break
            elif i >= cfg["iters"]:
                break
            n = cfg.get("numel") or SIZES[i % len(SIZES)]
            scheme = cfg.get("scheme") or SCHEMES[(i // len(SIZES)) % len(SCHEMES)]
            x = _data(rank, i, n, cfg["seed"])
            r0 = port.stats["retransmits"]
            t0 = time.perf_counter()
            y = allreduce(x, port, scheme=scheme)
            times.append(time.perf_counter() - t0)
            retx.append(port.stats["retransmits"] - r0)
            want = sum(_data(r, i, n, cfg["seed"]) for r in range(world))
            if not torch.equal(y, want):
                inexact.append(f"iteration {i} ({scheme}, {n} words)")
            schemes[scheme] = schemes.get(scheme, 0) + 1
            i += 1
        return {"iterations": i, "times": times, "retransmits": retx, "inexact": inexact, "schemes": schemes,
                "port_stats": dict(port.stats)}
    finally:
        port.close()
