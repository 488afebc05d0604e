"""Test inputs (part of :mod:`homagg.testing`): sparse tensors with a shared part, gradient sets.

Invariants: every maker is a pure function of its arguments (seeded ``torch.Generator``s, never
the global RNG), so worker ``rank`` can build its own input in its own process and a checker can
rebuild every worker's input later.  In :func:`sparse_tensor` the ``shared`` part of the nonzero
slices sits at the same positions on every worker (drawn from ``seed`` alone); the rest is drawn
per worker (from ``seed`` and ``rank``) and may collide with other workers' or the shared part.
"""

from __future__ import annotations

import torch

from .._errors import InputError

__all__ = ["sparse_tensor", "sparse_tensors", "gradients"]


def _generator(seed: int, rank: int | None) -> torch.Generator:
    # rank None: the generator every worker shares; otherwise one per (seed, rank)
    return torch.Generator().manual_seed(seed * 1_000_003 + (0 if rank is None else rank + 1))


def sparse_tensor(rank: int, shape: int | tuple[int, ...], density: float, *, shared: float = 0.5, seed: int = 0,
                  dtype: torch.dtype = torch.float32, scale: float = 1.0, spread: float = 0.0,
                  grid: bool = False, high: int = 1000) -> torch.Tensor:
    """Worker ``rank``'s tensor: ``round(shape[0] * density)`` nonzero slices along dim 0.

    A 1-D shape gives element sparsity, a 2-D one row sparsity (embedding gradients).  A fraction
    ``shared`` of the nonzero slices is common to every worker.  Values: ``scale * N(0, 1) *
    exp(spread * N(0, 1))`` (``spread`` widens the dynamic range), or with ``grid=True`` or an
    integer ``dtype`` integers in ``[-high, high]`` (exactly representable: sums must be exact).
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not shape or not 0.0 <= density <= 1.0 or not 0.0 <= shared <= 1.0:
        raise InputError(f"need a non-empty shape and 0 <= density, shared <= 1; got {shape}, {density}, {shared}")
    n = shape[0]
    k = min(n, max(1, round(n * density))) if density > 0 else 0
    n_shared = round(k * shared)
    g = _generator(seed, rank)
    common = torch.randperm(n, generator=_generator(seed, None))[:n_shared]
    own = torch.randperm(n, generator=g)[: k - n_shared]
    pos = torch.cat([common, own]).unique()
    vshape = (pos.numel(), *shape[1:])
    if grid or not dtype.is_floating_point:
        vals = torch.randint(-high, high + 1, vshape, generator=g, dtype=torch.int64)
    else:
        vals = torch.randn(vshape, generator=g, dtype=torch.float64) * scale
        if spread:
            vals *= torch.exp(torch.randn(vshape, generator=g, dtype=torch.float64) * spread)
    out = torch.zeros(shape, dtype=vals.dtype)
    out[pos] = vals
    return out.to(dtype)


def sparse_tensors(world: int, shape: int | tuple[int, ...], density: float, **kwargs: object) -> list[torch.Tensor]:
    """``[sparse_tensor(r, shape, density, **kwargs) for r in range(world)]``: one input per worker."""
    return [sparse_tensor(r, shape, density, **kwargs) for r in range(world)]  # type: ignore[arg-type]


def gradients(rank: int, numel: int, density: float, seed: int = 0) -> list[torch.Tensor]:
    """Worker ``rank``'s gradient set, about ``numel`` elements in all (the demo's and the UDP tests' input).

    In order: a row-sparse embedding gradient (``density`` of its rows, half of them hot on every
    worker), an element-sparse layer (``5 * density``), a dense layer, a bias, an int64 counter.
    """
    dim = 64
    rows = max(1, int(numel * 0.6) // dim)
    emb = sparse_tensor(rank, (rows, dim), density, seed=2 * seed, scale=1e-2)
    n_sp = max(1, int(numel * 0.1))
    sparse = sparse_tensor(rank, n_sp, min(1.0, density * 5), seed=2 * seed + 1)
    g = _generator(seed, rank)
    dense = torch.randn(max(1, int(numel * 0.3)) // 16, 16, generator=g) * 0.1
    bias = torch.randn(16, generator=g)
    counts = torch.randint(0, 1000, (64,), generator=g, dtype=torch.int64)
    return [emb, sparse, dense, bias, counts]
