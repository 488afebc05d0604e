"""Sparse COO tensors through the codec: the result is the coalesced sum, like gloo's sparse allreduce.

Oracle: the float64 (or exact integer) sum of the dense forms, computed by torch.
"""

from __future__ import annotations

import pytest
import torch

import homagg
from homagg.testing import check_within_bound, exact_sum, local_allreduce, run_local

SCHEMES = homagg.SCHEMES


def coo(rows: int, width: tuple[int, ...], nnz: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uncoalesced hybrid COO tensor (duplicate row indices, one explicit zero row)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, rows, (1, nnz), generator=g)
    vals = torch.randn((nnz, *width), generator=g)
    if not dtype.is_floating_point:
        vals = (vals * 1000).round()
    vals[0] = 0
    return torch.sparse_coo_tensor(idx, vals.to(dtype), (rows, *width), check_invariants=True)


@pytest.mark.parametrize("width", [(), (8,), (3, 4)])
def test_hybrid_coo_sum_equals_dense_sum(width: tuple[int, ...]) -> None:
    xs = [coo(300, width, 40, seed=r) for r in range(3)]
    dense = [x.to_dense() for x in xs]
    results = {s: local_allreduce(xs, s) for s in SCHEMES}
    ref = results["auto"][0]
    for scheme, outs in results.items():
        for out in outs:
            assert out.is_sparse and out.is_coalesced() and out.shape == xs[0].shape
            assert out.sparse_dim() == xs[0].sparse_dim() and out.dtype == xs[0].dtype
            assert torch.equal(out.to_dense(), ref.to_dense()), scheme  # bit-identical everywhere
    check_within_bound(ref.to_dense(), dense)
    # the stored rows are exactly those with a nonzero sum
    want_rows = torch.nonzero(exact_sum(dense).reshape(300, -1).abs().sum(1)).squeeze(1)
    assert torch.equal(ref.indices()[0], want_rows)


def test_multi_dim_sparse_indices() -> None:
    g = torch.Generator().manual_seed(7)
    xs = []
    for _ in range(2):
        idx = torch.stack([torch.randint(0, 20, (30,), generator=g), torch.randint(0, 9, (30,), generator=g)])
        xs.append(torch.sparse_coo_tensor(idx, torch.randn(30, 5, generator=g), (20, 9, 5), check_invariants=True))
    out = local_allreduce(xs, "compact")[0]
    assert out.sparse_dim() == 2
    check_within_bound(out.to_dense(), [x.to_dense() for x in xs])


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_coo_is_exact(dtype: torch.dtype) -> None:
    xs = [coo(500, (4,), 60, seed=10 + r, dtype=dtype) for r in range(4)]
    want = sum((x.to_dense() for x in xs), torch.zeros(500, 4, dtype=dtype))
    for scheme in SCHEMES:
        assert torch.equal(local_allreduce(xs, scheme)[0].to_dense(), want)


def test_sparse_sends_no_dense_values() -> None:
    """compact: a bitmap of numel bits and the union's values, never numel words."""
    xs = [coo(100_000, (16,), 50, seed=r) for r in range(2)]
    stats = run_local(xs, "compact").stats[0]
    union = int((torch.stack([x.to_dense() for x in xs]) != 0).any(0).sum())
    assert stats.bytes_per_stream["values"] == 4 * union
    assert stats.bytes_per_stream["bitmap"] == 100_000 * 16 // 8


def test_empty_and_all_zero_coo() -> None:
    empty = [torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros(0, 3), (10, 3), check_invariants=True)] * 2
    out = local_allreduce(empty, "auto")[0]
    assert out.is_sparse and out._nnz() == 0 and out.shape == (10, 3)


def test_inplace_copies_into_the_sparse_input() -> None:
    xs = [coo(50, (2,), 10, seed=r) for r in range(2)]
    want = local_allreduce(xs, "sketch")[0]
    switch = homagg.InProcessSwitch(2)
    import threading

    targets = [x.clone() for x in xs]
    outs: list[torch.Tensor] = [torch.empty(0)] * 2

    def work(r: int) -> None:
        outs[r] = homagg.allreduce(targets[r], switch.port(r), scheme="sketch", inplace=True)

    ts = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for r in range(2):
        assert outs[r] is targets[r] and torch.equal(targets[r].to_dense(), want.to_dense())


def test_non_finite_sparse_value_is_refused() -> None:
    bad = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.tensor([float("nan")]), (4,), check_invariants=True)
    with pytest.raises(homagg.NonFiniteError):
        local_allreduce([bad, bad], "compact")
