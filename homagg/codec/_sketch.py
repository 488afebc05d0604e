"""Count sketch with k = 3 partitioned signed hashes, decoded exactly by parallel peeling in Z/2**32.

Layout: ``cells`` is a multiple of 3; hash j of element i picks a cell in the j-th third, so the
three cells of an element are always distinct.  Element i adds ``sign_j(i) * v_i`` (mod 2**32) to
each of its cells; a cell holds L words (L limbs per element).  Summing sketches cell-wise (ADD)
gives the sketch of the summed values: the sketch is homomorphic.

Decoding knows the union of nonzero positions (aggregated bitmap), hence each cell's count.  A
cell with count 1 reveals its element; its value is removed from its other cells; repeat.  Which
elements peel depends on the positions only, never on values, so every worker finds the same
unpeelable set (the hypergraph's 2-core); :func:`peel` returns it and the caller repairs those
elements exactly with an extra ADD round.  All cell arithmetic wraps modulo 2**32; only each
element's final sum needs to fit int32, so the decode is exact:
``peel(sum of sketches)[i] == sum of values[i]`` for every peeled i.
"""

from __future__ import annotations

import torch

from ._hashing import mix32
from ..transport import wrap_int32

__all__ = ["sketch_cells", "cell_indices", "encode", "peel"]

K = 3
_M32 = 0xFFFFFFFF


def sketch_cells(estimated_union: float, overhead: float) -> int:
    """Cells for an estimated number of distinct nonzeros: a multiple of 3, at least 3."""
    per_third = max(1, -(-int(estimated_union * overhead + 0.999999) // K))
    return per_third * K


def cell_indices(idx: torch.Tensor, cells: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 3) distinct cell indices and (n, 3) signs in {-1, +1} (int64) of positions ``idx``."""
    third = cells // K
    cols = []
    for j in range(K):
        cols.append(mix32(idx, seed + 7919 * (j + 1)) % third + j * third)
    sign_bits = mix32(idx, seed + 104729)
    signs = [1 - 2 * ((sign_bits >> j) & 1) for j in range(K)]
    return torch.stack(cols, dim=1), torch.stack(signs, dim=1)


def encode(idx: torch.Tensor, values: torch.Tensor, cells: int, seed: int) -> torch.Tensor:
    """Sketch words (cells * L, int32) of int32 ``values`` (n, L) at positions ``idx``."""
    limbs = values.shape[1]
    acc = torch.zeros((limbs, cells), dtype=torch.int64, device=values.device)  # one row per limb
    if idx.numel():
        where, signs = cell_indices(idx, cells, seed)
        flat = where.reshape(-1)
        for k in range(limbs):  # 1-D scatters: several times faster than a 2-D index_add on CPU
            contrib = values[:, k].to(torch.int64).unsqueeze(1) * signs  # (n, 3), |.| < 2**31
            acc[k].scatter_add_(0, flat, contrib.reshape(-1))
    return wrap_int32(acc.t()).reshape(-1)


def peel(union_idx: torch.Tensor, sketch_words: torch.Tensor, limbs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Peel the combined sketch.

    Returns ``(values, core)``: int32 (U, L) sums for the union positions (zero rows where not
    peeled) and the int64 indices into ``union_idx`` of the unpeelable 2-core, in ascending order.
    """
    device = sketch_words.device
    cells = sketch_words.numel() // limbs
    u = union_idx.numel()
    values = torch.zeros((limbs, u), dtype=torch.int64, device=device)
    if u == 0:
        return values.t().to(torch.int32), torch.zeros(0, dtype=torch.int64, device=device)
    where, signs = cell_indices(union_idx, cells, seed)
    counts = torch.bincount(where.reshape(-1), minlength=cells)
    table = sketch_words.reshape(cells, limbs).t().to(torch.int64)  # (L, cells): 1-D rows per limb
    remaining = torch.arange(u, device=device)
    w = where
    while remaining.numel():
        pure = counts.index_select(0, w.reshape(-1)).reshape(-1, K) == 1
        peelable = pure.any(dim=1)
        sel = torch.nonzero(peelable).squeeze(1)
        if sel.numel() == 0:
            break
        done = remaining.index_select(0, sel)
        done_where = w.index_select(0, sel)
        done_signs = signs.index_select(0, done)
        first = pure.index_select(0, sel).to(torch.int8).argmax(dim=1, keepdim=True)
        cell = done_where.gather(1, first).squeeze(1)
        sign = done_signs.gather(1, first).squeeze(1)
        flat_cells = done_where.reshape(-1)
        for k in range(limbs):
            v = (table[k].index_select(0, cell) * sign) & _M32  # the element's value mod 2**32
            values[k].index_copy_(0, done, v)
            table[k].scatter_add_(0, flat_cells, -(v.unsqueeze(1) * done_signs).reshape(-1))
        counts.scatter_add_(0, flat_cells, torch.full_like(flat_cells, -1))  # table stays far inside int64
        keep = torch.nonzero(~peelable).squeeze(1)
        remaining = remaining.index_select(0, keep)
        w = w.index_select(0, keep)
    return wrap_int32(values.t()), remaining
