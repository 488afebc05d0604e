"""Sparse COO tensors in and out of the codec: flat nonzero positions, and back.

A (hybrid) COO tensor of shape ``S + D`` (``S`` sparse dims, ``D`` dense dims, as
``nn.Embedding(sparse=True)`` gradients: ``S = (rows,)``, ``D = (dim,)``) is, to the codec, the
flat tensor of ``prod(S + D)`` elements whose nonzeros are its stored values: a row ``r`` of the
sparse part covers flat positions ``r * prod(D) .. (r + 1) * prod(D) - 1``.  Duplicate indices are
summed first (coalesce), stored zeros are dropped.  The union of positions over the workers is
what the compact and sketch schemes compute anyway, so a sparse all_reduce costs one bitmap and
the union's values — never a dense tensor on the host.

Invariant: ``to_coo(positions, values, like).to_dense()`` is the flat result reshaped to ``like``'s
shape; the result is coalesced, with one row per sparse index holding a nonzero sum (rows whose
sums are all zero are omitted, as are zero elements in the flat form).
"""

from __future__ import annotations

import math

import torch

__all__ = ["flat_nonzeros", "to_coo"]


def _row_size(t: torch.Tensor) -> int:
    return math.prod(t.shape[t.sparse_dim():])


def flat_nonzeros(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted flat positions (int64) and values of the nonzero elements of sparse COO ``t``."""
    c = t.detach().coalesce()
    sparse_shape = c.shape[: c.sparse_dim()]
    rows = torch.zeros(c.indices().shape[1], dtype=torch.int64, device=c.device)
    for k, size in enumerate(sparse_shape):  # ravel the sparse indices (row-major)
        rows = rows * size + c.indices()[k]
    width = _row_size(c)
    pos = (rows.unsqueeze(1) * width + torch.arange(width, device=c.device)).reshape(-1)
    vals = c.values().reshape(-1)
    keep = torch.nonzero(vals).squeeze(1)
    return pos.index_select(0, keep), vals.index_select(0, keep)


def to_coo(positions: torch.Tensor, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Coalesced COO tensor shaped and laid out like ``like`` from sorted flat ``positions``."""
    sparse_dim = like.sparse_dim()
    sparse_shape, dense_shape = like.shape[:sparse_dim], like.shape[sparse_dim:]
    width = _row_size(like)
    rows = positions // width
    urows, slot = torch.unique_consecutive(rows, return_inverse=True)
    block = torch.zeros((urows.numel(), width), dtype=values.dtype, device=values.device)
    block[slot, positions - rows * width] = values
    index = torch.empty((sparse_dim, urows.numel()), dtype=torch.int64, device=values.device)
    rest = urows
    for k in range(sparse_dim - 1, -1, -1):  # unravel, last dim fastest
        index[k] = rest % sparse_shape[k]
        rest = rest // sparse_shape[k]
    return torch.sparse_coo_tensor(index, block.reshape(-1, *dense_shape), like.shape, is_coalesced=True,
                                   check_invariants=False)  # built sorted and unique above
