"""Deep Gradient Compression (Lin, Han, Mao, Wang, Dally; ICLR 2018), per bucket.

The four techniques of the paper, each on the gradient's device, vectorised:

1. **Momentum correction.**  Momentum is accumulated *locally* before sparsification:
   ``u <- m*u + g``; ``v <- v + u``; the selected part of ``v`` is sent.  The optimiser must then
   use plain SGD (momentum 0): the sum of what workers send already carries the momentum.
2. **Local gradient clipping.**  Before accumulating, ``g`` is scaled so that its norm is at most
   ``clip / sqrt(W)`` (W workers: the paper's ``N**-1/2`` scaling of the global threshold);
   ``clip = 0`` turns it off.
3. **Momentum factor masking.**  After selection, ``u`` and ``v`` are zeroed where values were sent,
   so stale momentum does not keep pushing a coordinate that was just applied.
4. **Warm-up.**  During the first ``warmup`` calls of a key, the density falls exponentially from
   25% to the target in ``stages`` equal steps (the paper: 75%, 93.75%, ... sparsity per epoch).

Selection is an exact top-k of ``|v|`` (the paper samples to estimate the threshold, a speed
optimisation; :class:`~homagg.compress.Threshold` offers that estimate).

Invariant (exact, per step): ``sent + v_new == v_before_masking`` elementwise, bit for bit, and
``u_new`` is zero wherever ``sent`` is nonzero.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import torch

from .._errors import ConfigError
from ._base import Context, Stage
from ._sparsify import keep_count

__all__ = ["DGC", "warmup_density"]

WARMUP_START = 0.25


def warmup_density(step: int, target: float, warmup: int, stages: int = 4) -> float:
    """Density at ``step``: ``target`` after ``warmup`` steps, else exponential from 25% in ``stages``."""
    if step >= warmup or target >= WARMUP_START:
        return target
    stage = min(stages - 1, step * stages // max(warmup, 1))
    return max(target, WARMUP_START * (target / WARMUP_START) ** (stage / stages))


class DGC(Stage):
    """DGC stage (keeps its own accumulation ``v``: no outer error feedback on top of it)."""

    accumulates = True

    def __init__(self, density: float, momentum: float = 0.9, clip: float = 0.0, warmup: int = 0,
                 stages: int = 4) -> None:
        super().__init__()
        if not 0.0 < density <= 1.0:
            raise ConfigError(f"dgc: density must be in (0, 1], got {density!r}")
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"dgc: momentum must be in [0, 1), got {momentum!r}")
        if not (clip >= 0 and math.isfinite(clip)) or warmup < 0 or stages < 1:
            raise ConfigError(f"dgc: need clip >= 0, warmup >= 0, stages >= 1; got {clip}, {warmup}, {stages}")
        self.density, self.momentum, self.clip, self.warmup, self.stages = density, momentum, clip, warmup, stages

    def apply(self, g: torch.Tensor, key: Hashable, ctx: Context) -> torch.Tensor:
        step = self.step_of(key)
        slot = self.slot(key)
        u, v = slot.get("u"), slot.get("v")
        if u is None or u.shape != g.shape or u.dtype != g.dtype:
            u, v = torch.zeros_like(g), torch.zeros_like(g)
        elif u.device != g.device:
            u, v = u.to(g.device), v.to(g.device)
        if self.clip > 0:  # local gradient clipping, threshold scaled by W**-1/2
            limit = self.clip / math.sqrt(ctx.world_size)
            norm = torch.linalg.vector_norm(g)
            g = g * torch.clamp(limit / (norm + 1e-12), max=1.0).to(g.dtype)
        u = u.mul_(self.momentum).add_(g)  # momentum correction
        v = v.add_(u)
        density = warmup_density(step, self.density, self.warmup, self.stages)
        k = keep_count(v.numel(), density)
        idx = torch.topk(v.abs(), k, sorted=False).indices if k < v.numel() else torch.arange(k, device=v.device)
        sent = torch.zeros_like(v)
        sent[idx] = v[idx]
        v[idx] = 0  # exact: v where not sent, 0 where sent
        u[idx] = 0  # momentum factor masking
        slot["u"], slot["v"] = u, v
        return sent
