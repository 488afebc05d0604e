"""Sparsifying stages: top-k, random-k and threshold (absolute, or adapted to a target density).

Each returns ``v`` with every unselected element set to zero (a dense-layout tensor, which the
exact codec then aggregates as sparse: ``auto`` picks compact or sketch from the union size).
Selection is vectorised (``torch.topk``, ``randperm``, comparisons): no Python loop per element.

Invariants: the output equals ``v`` on the selected positions and is zero elsewhere, so
``out + (v - out) == v`` bit for bit (the error-feedback residual loses nothing); top-k and
random-k select exactly ``k = min(n, max(1, ceil(fraction * n)))`` positions (top-k: those of the k
largest ``|v|``, ties broken by ``torch.topk``); an absolute threshold keeps exactly ``|v| >= T``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import torch

from .._errors import ConfigError
from ._base import Context, Stage, generator

__all__ = ["TopK", "RandomK", "Threshold", "keep_count", "topk_mask_values"]


def keep_count(n: int, fraction: float) -> int:
    """Elements kept of ``n`` at ``fraction``: ``min(n, max(1, ceil(fraction * n)))`` (0 if n == 0)."""
    if n == 0:
        return 0
    return min(n, max(1, math.ceil(fraction * n - 1e-9)))


def _check_fraction(name: str, fraction: float) -> float:
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"{name}: fraction must be in (0, 1], got {fraction!r}")
    return float(fraction)


def topk_mask_values(v: torch.Tensor, k: int) -> torch.Tensor:
    """``v`` with all but the ``k`` largest-magnitude elements zeroed (a new tensor)."""
    out = torch.zeros_like(v)
    if k >= v.numel():
        return out.copy_(v)
    idx = torch.topk(v.abs(), k, sorted=False).indices
    out[idx] = v[idx]
    return out


class TopK(Stage):
    """Keep the ``k = ceil(fraction * n)`` largest-magnitude elements (Aji & Heafield 2017)."""

    def __init__(self, fraction: float) -> None:
        super().__init__()
        self.fraction = _check_fraction("topk", fraction)

    def apply(self, v: torch.Tensor, key: Hashable, ctx: Context) -> torch.Tensor:
        return topk_mask_values(v, keep_count(v.numel(), self.fraction))


class RandomK(Stage):
    """Keep ``k`` uniformly random positions.

    ``shared=True`` (default): every worker draws the same positions (seeded by key and step, not
    rank), so the union of the workers' supports is ``k`` elements, the cheapest case for the
    switch.  Otherwise each worker draws its own.  Biased towards zero without rescaling; use it with
    error feedback (the default of its spec).
    """

    def __init__(self, fraction: float, shared: bool = True, seed: int = 0) -> None:
        super().__init__()
        self.fraction = _check_fraction("randk", fraction)
        self.shared = shared
        self.seed = seed

    def apply(self, v: torch.Tensor, key: Hashable, ctx: Context) -> torch.Tensor:
        step = self.step_of(key)
        n = v.numel()
        k = keep_count(n, self.fraction)
        gen = generator(torch.device("cpu"), "randk", self.seed, str(key), step, None if self.shared else ctx.rank)
        idx = torch.randperm(n, generator=gen)[:k].to(v.device)
        out = torch.zeros_like(v)
        out[idx] = v[idx]
        return out


class Threshold(Stage):
    """Keep ``|v| >= T``: a fixed ``value``, or ``T`` chosen per call for a target ``density``.

    With ``density``, ``T`` is the ``(1 - density)`` quantile of ``|v|`` over a random sample of
    ``sample`` positions (all of ``v`` when it is smaller; exact then, up to ties), the sampling
    estimate DGC uses instead of a full top-k; the kept count is then ``density * n`` in expectation.
    """

    def __init__(self, value: float | None = None, density: float | None = None, sample: int = 10000,
                 seed: int = 0) -> None:
        super().__init__()
        if (value is None) == (density is None):
            raise ConfigError("threshold: give exactly one of value=T or density=D")
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"threshold: value must be finite and >= 0, got {value!r}")
        if density is not None:
            _check_fraction("threshold", density)
        self.value, self.density, self.sample, self.seed = value, density, int(sample), seed

    def threshold(self, v: torch.Tensor, key: Hashable) -> torch.Tensor:
        """The threshold of this call (a 0-dim tensor on ``v``'s device)."""
        if self.value is not None:
            return torch.tensor(self.value, dtype=v.dtype, device=v.device)
        assert self.density is not None
        step = self.step_of(key)
        mag = v.abs()
        if v.numel() > self.sample:
            gen = generator(torch.device("cpu"), "threshold", self.seed, str(key), step)
            pick = torch.randint(0, v.numel(), (self.sample,), generator=gen).to(v.device)
            mag = mag[pick]
        m = mag.numel()
        k = keep_count(m, self.density)  # keep the k largest of the sample
        return torch.kthvalue(mag, m - k + 1).values if m else torch.zeros((), dtype=v.dtype, device=v.device)

    def apply(self, v: torch.Tensor, key: Hashable, ctx: Context) -> torch.Tensor:
        if v.numel() == 0:
            return v.clone()
        t = self.threshold(v, key)
        return torch.where(v.abs() >= t, v, torch.zeros((), dtype=v.dtype, device=v.device))
