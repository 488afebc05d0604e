"""The DDP tests' model, data, scenarios and training loop, shared by the rank script ``ddp.py`` and
the test process, which replays the same training in one process as the oracle (:func:`reference`).

Invariant: DDP averages gradients over ranks, so ``STEPS`` steps of DDP on ``world`` ranks give
the parameters of the same steps on one model whose loss is the mean of the ranks' losses (each
rank's batch through its own forward call, so BatchNorm uses per-rank batch statistics).  Only
the parameters follow this (buffers such as BatchNorm's running statistics are per rank).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, ContextManager

import torch
from torch import nn

__all__ = ["STEPS", "SCENARIOS", "Net", "batch", "run_steps", "reference"]

STEPS = 5

#: scenario -> model_kw, ddp_kw, hook (name), tol (vs gloo), no_sync, homagg_group, exact
#: (``exact``: the in-process replay is an oracle; lossy comm hooks are compared with gloo only)
SCENARIOS: dict[str, dict[str, Any]] = {
    "basic": {},
    "sparse_embedding": {"model_kw": {"sparse": True}},
    "find_unused": {"model_kw": {"unused": True}, "ddp_kw": {"find_unused_parameters": True}},
    "no_sync": {"no_sync": True},
    "static_graph": {"ddp_kw": {"static_graph": True}},
    "batchnorm": {"model_kw": {"bn": True}},
    "powersgd_hook": {"hook": "powersgd", "tol": 1e-4, "exact": False},
    "fp16_hook": {"hook": "fp16", "tol": 2e-3, "exact": False},
    "homagg_comm_hook": {"hook": "homagg", "homagg_group": False},
}


class Net(nn.Module):
    """Embedding (sparse gradients: few rows touched per step) + MLP; optional BatchNorm, unused layer."""

    def __init__(self, sparse: bool = False, bn: bool = False, unused: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(2000, 16, sparse=sparse)
        self.mlp = nn.Sequential(nn.Linear(64, 64), nn.BatchNorm1d(64) if bn else nn.Identity(), nn.ReLU(),
                                 nn.Linear(64, 4))
        self.unused = nn.Linear(4, 4) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(x).flatten(1))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch of step ``step`` (deterministic)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, 2000, (16, 4), generator=g), torch.randn(16, 4, generator=g)


def run_steps(model: nn.Module, loss_at: Callable[[int], torch.Tensor],
              no_sync: Callable[[], ContextManager[Any]] | None = None) -> torch.Tensor:
    """``STEPS`` SGD steps; with ``no_sync`` even steps only accumulate gradients (inside ``no_sync()``).

    Returns the parameters, flat.
    """
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        loss = loss_at(step)
        if no_sync is not None and step % 2 == 0:
            with no_sync():
                loss.backward()
            continue
        loss.backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def reference(world: int, scenario: str) -> torch.Tensor:
    """The parameters DDP must reach in ``scenario`` on ``world`` ranks, computed in one process."""
    sc = SCENARIOS[scenario]
    with torch.random.fork_rng():
        torch.manual_seed(7)
        model = Net(**sc.get("model_kw", {}))

    def loss_at(step: int) -> torch.Tensor:
        losses = [nn.functional.mse_loss(model(x), y) for x, y in (batch(step, r) for r in range(world))]
        return torch.stack(losses).mean()

    return run_steps(model, loss_at, contextlib.nullcontext if sc.get("no_sync") else None)
