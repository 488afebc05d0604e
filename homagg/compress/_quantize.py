"""Quantisers whose codes a switch can sum: 1-bit, 2-bit, TernGrad and QSGD on a *shared* scale.

A quantiser sees one worker's values in blocks of ``block`` elements (``x``: ``(blocks, block)``
float64, the last block zero-padded).  Per block it reports a local scale ``sigma`` (mean ``|x|``,
max ``|x|`` or the L2 norm), and, given the *agreed* scale ``s`` (the same on every worker; see
:mod:`homagg.compress._homomorphic` for how it is agreed with MAX), integer codes
``u in [0, umax]`` whose value is ``s * (a*u - c) / d``.  The sum over W workers is then
``s * (a * sum(u) - W*c) / d``: the switch ADDs the codes, every worker decodes once.

=========  ==============  =====================================  ==========================
name       local scale     code of x (q = a*u - c, value s*q/d)    property
=========  ==============  =====================================  ==========================
onebit     mean |x|        q = +1 if x >= 0 else -1               biased; use error feedback
                                                                  (EF-SignSGD, Karimireddy 2019)
twobit     mean |x|        q = clamp(round(x / s), -1, 1)          biased; error feedback
terngrad   max |x|         q = sign(x) * Bernoulli(|x| / s)        unbiased (Wen et al. 2017)
qsgd       ||x||_2 or max  q = sign(x) * (floor(L|x|/s) + Bern.)   unbiased (Alistarh 2017), L levels
=========  ==============  =====================================  ==========================

**Shared scale vs each worker's own (the price of homomorphism).**  The agreed ``s`` is at least the
largest worker's local scale (rounded *up* to a grid of ``steps`` points per octave, so
``s < 2**(1/steps) * max_w sigma_w``).  Consequences, per element:

* TernGrad / QSGD stay **unbiased** (``E[value] = x``) because ``|x| <= sigma_w <= s`` keeps every
  Bernoulli probability in [0, 1).  Their **variance grows with s**: TernGrad
  ``Var = |x|*s - x**2``; QSGD ``Var = (s/L)**2 * p(1-p)`` with ``p = frac(L|x|/s)``, at most
  ``s**2 / (4 L**2)``.  A worker whose own scale is smaller than the largest one pays more variance
  than with its own scale (up to ``s / sigma_w`` times for TernGrad's ``|x|*s`` term); workers with
  similar gradient magnitudes (data parallel, i.i.d. shards) pay little, plus the grid's <= 2**(1/steps).
* 1-bit / 2-bit are **biased** either way; with the shared scale the magnitude sent is ``s``, not the
  worker's own mean, so a worker with smaller gradients overshoots and its error-feedback residual
  carries the difference to the next step.  The compression is contractive for a worker (EF
  converges) while ``s < 2 * mean|x_w|``; the grid and the max over workers can violate that for
  outlier workers, which is why their specs default to error feedback on.
* Sums are exact integers: no rounding between workers, and every worker decodes the same value.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from .._errors import ConfigError
from ._base import KeyedState

__all__ = ["Quantizer", "OneBit", "TwoBit", "TernGrad", "QSGD", "QUANTIZER_TYPES"]


class Quantizer(KeyedState):
    """Base: code alphabet ``[0, umax]``, value ``s * (a*u - c) / d``; per-key step counters."""

    name = "quantizer"
    umax = 1
    a, c, d = 1, 0, 1
    stochastic = False
    #: codes independent of the scale (sign only): no redo round is ever needed
    scale_free_codes = False

    def __init__(self, block: int = 1024, steps: int = 4, seed: int = 0) -> None:
        super().__init__()
        if not 1 <= block <= 1 << 24 or not 1 <= steps <= 64:
            raise ConfigError(f"{self.name}: need block in [1, 2**24] and steps in [1, 64], got {block}, {steps}")
        self.block, self.steps, self.seed = int(block), int(steps), int(seed)

    def local_scale(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """(blocks,) float64 local scale of the padded blocks ``x`` (``counts`` real elements each)."""
        raise NotImplementedError

    def codes(self, x: torch.Tensor, s: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:  # pragma: no cover
        """(blocks, block) int64 codes in ``[0, umax]`` of ``x`` under per-block scales ``s`` (blocks, 1)."""
        raise NotImplementedError

    def next_step(self, key: Hashable) -> int:
        slot = self.slot(key)
        step = int(slot.get("step", 0))
        slot["step"] = step + 1
        return step

    def values(self, u: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """float64 value of one worker's codes ``u`` (blocks, block) under scales ``s`` (blocks, 1)."""
        return s * (self.a * u - self.c).to(torch.float64) / self.d

    def sum_values(self, total: torch.Tensor, s: torch.Tensor, world: int) -> torch.Tensor:
        """float64 value of the summed codes ``total`` (blocks, block) of ``world`` workers."""
        return s * (self.a * total - world * self.c).to(torch.float64) / self.d


def _safe(s: torch.Tensor) -> torch.Tensor:
    return torch.where(s > 0, s, torch.ones_like(s))


class OneBit(Quantizer):
    """Scaled sign: ``s * sign(x)`` (0 counts as +), ``s`` >= every worker's mean |x| (rounded up)."""

    name, umax, a, c, d = "onebit", 1, 2, 1, 1
    scale_free_codes = True

    def local_scale(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return x.abs().sum(dim=1) / counts

    def codes(self, x: torch.Tensor, s: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        return (x >= 0).to(torch.int64)


class TwoBit(Quantizer):
    """Ternary with a deterministic threshold ``s/2``: ``s * clamp(round(x/s), -1, 1)``."""

    name, umax, a, c, d = "twobit", 2, 1, 1, 1

    def local_scale(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return x.abs().sum(dim=1) / counts

    def codes(self, x: torch.Tensor, s: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        return torch.round(x / _safe(s)).clamp_(-1, 1).to(torch.int64) + 1


class TernGrad(Quantizer):
    """``s * sign(x) * Bernoulli(|x|/s)`` with ``s`` >= every worker's max |x|: unbiased."""

    name, umax, a, c, d = "terngrad", 2, 1, 1, 1
    stochastic = True

    def local_scale(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return x.abs().amax(dim=1)

    def codes(self, x: torch.Tensor, s: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        assert noise is not None
        hit = (noise < x.abs() / _safe(s)).to(torch.int64)
        return torch.sign(x).to(torch.int64) * hit + 1


class QSGD(Quantizer):
    """``s * sign(x) * xi / L``, ``xi = floor(L|x|/s) + Bernoulli(frac(L|x|/s))``: unbiased."""

    name = "qsgd"
    stochastic = True

    def __init__(self, levels: int = 16, norm: str = "l2", block: int = 1024, steps: int = 4, seed: int = 0) -> None:
        super().__init__(block, steps, seed)
        if not 1 <= levels <= 2**20 or norm not in ("l2", "max"):
            raise ConfigError(f"qsgd: need levels in [1, 2**20] and norm 'l2' or 'max', got {levels}, {norm!r}")
        self.levels, self.norm = int(levels), norm
        self.umax, self.a, self.c, self.d = 2 * self.levels, 1, self.levels, self.levels

    def local_scale(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, dim=1) if self.norm == "l2" else x.abs().amax(dim=1)

    def codes(self, x: torch.Tensor, s: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        assert noise is not None
        r = x.abs() / _safe(s) * self.levels
        low = torch.floor(r)
        xi = low + (noise < r - low).to(torch.float64)
        return (torch.sign(x) * xi).to(torch.int64) + self.levels


QUANTIZER_TYPES: dict[str, type[Quantizer]] = {q.name: q for q in (OneBit, TwoBit, TernGrad, QSGD)}
