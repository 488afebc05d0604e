"""The native dense fixed-point kernels (``homagg/codec/_dense_kernels.c``) against the torch code of
:mod:`homagg.codec._blocks` and the index path of :mod:`homagg.codec._fixedpoint`, bit for bit; the word pool
that spares them page faults hands out only arrays nobody references."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from homagg import NonFiniteError
from homagg.codec import _blocks, _fixedpoint, _native
from homagg._buffers import WordPool

needs_native = pytest.mark.skipif(not _native.AVAILABLE, reason="the native kernels were not built (no C compiler "
                                  "at install time, or HOMAGG_NATIVE=0)")


def _wide_float32(seed: int, n: int, block: int) -> torch.Tensor:
    """float32 values whose blocks span float32's whole range (subnormals, near-overflow), with
    zeros, negative zeros and whole zero blocks."""
    g = torch.Generator().manual_seed(seed)
    blocks = -(-n // block)
    scale = torch.randint(-150, 127, (blocks,), generator=g).repeat_interleave(block)[:n]
    x = (torch.randn(n, generator=g, dtype=torch.float64) * torch.pow(2.0, scale.double())).to(torch.float32)
    x[torch.rand(n, generator=g) < 0.1] = 0.0
    x[torch.rand(n, generator=g) < 0.05] = -0.0
    if blocks > 2:
        x[block: 2 * block] = 0.0  # an EMPTY block
    return x


def _torch_path(fn, *args):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "AVAILABLE", False)
        return fn(*args)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


@needs_native
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 4000), block=st.sampled_from([1, 7, 64, 256, 1024]),
       world=st.sampled_from([1, 2, 3, 4, 8, 64, 1000]), bump=st.sampled_from([0, 1, 40, -3, -200]))
def test_native_dense_kernels_equal_the_torch_path(seed, n, block, world, bump) -> None:
    """exponents, quantize (under agreed, larger or too small guessed exponents: the clamp) and
    dequantize_into give the torch path's bits."""
    x = _wide_float32(seed, n, block)
    exps = _blocks.exponents(x, block)
    assert torch.equal(exps, _torch_path(_blocks.exponents, x, block))
    g = torch.Generator().manual_seed(seed + 1)
    moved = exps.to(torch.int64) + torch.randint(0, 2, exps.shape, generator=g) * bump
    guess = torch.where(exps == _fixedpoint.EMPTY_EXPONENT, exps.to(torch.int64), moved.clamp(-300, 300)).to(torch.int32)
    for e in (exps, guess):
        words = _blocks.quantize(x, e, world, block)
        want = _torch_path(_blocks.quantize, x, e, world, block)
        assert torch.equal(words, want)
    # a combined sum of `world` workers' words decodes as the torch path decodes it
    sums = (_blocks.quantize(x, exps, world, block).to(torch.int64) * world).clamp(-(2**31) + 1, 2**31 - 1).to(torch.int32)
    got, ref = torch.full((n,), -7.0), torch.full((n,), -7.0)
    counted = _blocks.dequantize_into(got, sums, exps, world, block)
    assert _torch_path(_blocks.dequantize_into, ref, sums, exps, world, block) is None
    assert torch.equal(_bits(got), _bits(ref))
    assert counted is None or counted == int(torch.count_nonzero(sums))  # the native pass counts the union


@needs_native
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 3000), block=st.sampled_from([1, 5, 256]),
       world=st.sampled_from([2, 4, 16]))
def test_native_quantize_equals_the_index_path(seed, n, block, world) -> None:
    """The independent reference: the index path's float64 grid values at every position."""
    x = _wide_float32(seed, n, block)
    exps = _blocks.exponents(x, block)
    idx = torch.arange(n)
    want = _torch_path(_fixedpoint.quantize, idx, x.to(torch.float64), exps, block, world)
    assert torch.equal(_blocks.quantize(x, exps, world, block), want)
    assert torch.equal(_fixedpoint.quantize(idx, x.to(torch.float64), exps, block, world), want)


@needs_native
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 5000), block=st.sampled_from([1, 7, 1024]),
       world=st.sampled_from([2, 4, 1000]), density=st.sampled_from([0.01, 0.3, 1.0]), wide=st.booleans())
def test_native_quantize_at_positions_equals_the_torch_path(seed, n, block, world, density, wide) -> None:
    """Compact's and sketch's grid words (values at sorted positions, float64, under agreed or
    guessed exponents): the C pass gives the torch steps' int32 bits, the second factor included
    (float64 values below 2**-1000 need it)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.nonzero(torch.rand(n, generator=g) < density).squeeze(1)
    span = 2100 if wide else 60
    v = torch.randn(idx.numel(), generator=g, dtype=torch.float64) * torch.pow(
        2.0, torch.randint(-span // 2, span // 2, (idx.numel(),), generator=g).double().clamp(-1070, 1000))
    v[v == 0] = 1.0
    exps = _fixedpoint.block_exponents(idx, v, n, block)
    guess = (exps.to(torch.int64) - torch.randint(0, 3, exps.shape, generator=g)).clamp(-1100, 1100).to(torch.int32)
    for e in (exps, torch.where(exps == _fixedpoint.EMPTY_EXPONENT, exps, guess)):  # a too small guess: the clamp
        want = _torch_path(_fixedpoint.quantize, idx, v, e, block, world)
        assert torch.equal(_fixedpoint.quantize(idx, v, e, block, world), want)


@needs_native
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_native_exponents_refuse_non_finite_input(bad) -> None:
    x = torch.randn(5000)
    x[4321] = bad
    with pytest.raises(NonFiniteError, match="non-finite"):
        _blocks.exponents(x, 256)


@needs_native
def test_native_kernels_check_their_per_block_arrays() -> None:
    x = np.ones(10, dtype=np.float32)
    out = np.empty(10, dtype=np.int32)
    with pytest.raises(ValueError, match="per-block"):
        _native.quantize32(x, 4, np.ones(2, dtype=np.float32), None, 100.0, out)  # 3 blocks need 3 factors
    with pytest.raises(ValueError, match="per-block"):
        factors = np.ones(4, dtype=np.float32)  # 10 elements in blocks of 4: 3 factors, not 4
        _native.dequantize32_at(out.ctypes.data, np.empty(10, dtype=np.float32).ctypes.data, 10, 4,
                                factors.ctypes.data, factors.size)


def test_word_pool_reuses_only_unreferenced_arrays() -> None:
    pool = WordPool(keep=3)
    a = pool.take(1000)
    a_addr = a.ctypes.data  # an int: holds no reference
    held = torch.from_numpy(pool.take(1000))  # a tensor still made from the second array
    b_addr = held.data_ptr()
    del a
    c = pool.take(1000)  # the first array is free again: reused, the same memory
    assert c.size == 1000 and c.ctypes.data == a_addr
    d = pool.take(1000)  # the first is referenced by `c` now, the second by `held`: a new one
    assert d.ctypes.data not in (a_addr, b_addr)
    assert pool.take(7).size == 7  # another size never takes one of them
    pool.clear()


def test_spare_arrays_serve_slightly_smaller_rounds_as_views() -> None:
    """A round a few percent smaller than an earlier one reuses its array (the first ``n`` words:
    no page faults); a referenced array, or one over 25% larger, is never handed out.

    Arrays are told apart by the address of their memory, recorded as ints (no reference): an array
    still in ``spare`` is alive, so a fresh array never has its address, and a view of it does."""
    from homagg._buffers import spare_int32

    spare = [np.empty(n, dtype=np.int32) for n in (1100, 1000, 5000, 1251, 1250)]
    addr = {a.size: a.ctypes.data for a in spare}
    first = spare_int32(spare, 1000)  # the exact size wins over a larger fit
    assert first.size == 1000 and first.base is None and first.ctypes.data == addr[1000] and len(spare) == 4
    second = spare_int32(spare, 1000)  # then the smallest array that fits, as a view of its start
    assert second.size == 1000 and second.base is not None and second.base.size == 1100
    assert second.ctypes.data == addr[1100]
    third = spare_int32(spare, 1000)  # 1250 words: 25% larger, the largest that serves 1000
    assert third.size == 1000 and third.ctypes.data == addr[1250] and third.base.size == 1250
    fourth = spare_int32(spare, 1000)  # left: 5000 and 1251 words, both too large, so a new array
    assert fourth.size == 1000 and fourth.base is None
    assert fourth.ctypes.data not in (addr[5000], addr[1251])
    assert sorted(a.size for a in spare) == [1251, 5000]  # still spare, untouched
    assert {a.ctypes.data for a in spare} == {addr[5000], addr[1251]}
    first_addr = first.ctypes.data
    spare = [first]
    kept = torch.from_numpy(first)  # a tensor made from it: the only reference besides ``spare``
    del first, second, third
    assert spare_int32(spare, 900).ctypes.data != first_addr  # still referenced: a new array
    assert len(spare) == 1
    del kept
    again = spare_int32(spare, 900)  # nobody references it any more: its first 900 words
    assert again.ctypes.data == first_addr and again.size == 900 and spare == []
