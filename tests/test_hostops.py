"""The CPU fast paths (:mod:`homagg.codec._hostops`) against the torch ops they replace, and the per-block
scaling of :mod:`homagg.codec._fixedpoint` against element-by-element scaling."""

from __future__ import annotations

import os
import shutil

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from homagg.codec import _fixedpoint, _hostops, _native
from homagg.codec._bitmap import pack_positions

needs_native = pytest.mark.skipif(not _native.AVAILABLE, reason="the native kernels were not built (no C compiler "
                                  "at install time, or HOMAGG_NATIVE=0)")

_FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64]


def _sparse_tensor(seed: int, n: int, density: float, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, dtype=torch.float64)
    mask = torch.rand(n, generator=g) < density
    x[mask] = torch.randn(int(mask.sum()), generator=g, dtype=torch.float64) * 100
    if dtype.is_floating_point:
        x = x.to(dtype)
        x[torch.rand(n, generator=g) < 0.01] = -0.0  # a negative zero is a zero
        return x
    return x.round().clamp(torch.iinfo(dtype).min, torch.iinfo(dtype).max).to(dtype)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 5000), density=st.sampled_from([0.0, 0.001, 0.05, 0.5, 1.0]),
       dtype=st.sampled_from(_FLOATS + _INTS), chunk=st.sampled_from([7, 64, 1 << 20]), native=st.booleans())
def test_nonzero_positions_equal_torch_nonzero(seed, n, density, dtype, chunk, native) -> None:
    x = _sparse_tensor(seed, n, density, dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_hostops, "_CHUNK", chunk)  # several chunks, a ragged last one
        mp.setattr(_native, "AVAILABLE", native and _native.AVAILABLE)  # False: numpy's chunked scan
        got = _hostops.nonzero_positions(x)
        pos, values, words = _hostops.nonzeros_and_bitmap(x)
    want = torch.nonzero(x).squeeze(1)
    assert got.dtype == torch.int64
    assert torch.equal(got, want)
    assert torch.equal(pos, want)
    assert values.dtype == x.dtype and torch.equal(values, x[want])  # the values gathered in the scan
    # the bitmap packed chunk by chunk (chunk 7: packed from the positions) equals packing them
    assert words.dtype == torch.int32 and torch.equal(words, pack_positions(want, n))


@needs_native
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 5000), density=st.sampled_from([0.0, 0.001, 0.05, 0.5, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.int32]), room=st.sampled_from([0, 1, 63, 200, 10_000]))
def test_native_scan_lists_in_its_pass_or_after_it_alike(seed, n, density, dtype, room) -> None:
    """homagg_scan32 lists positions and values in the packing pass while they fit the room and
    from the words once they do not: either way torch's nonzero, the values and the packed bits."""
    x = _sparse_tensor(seed, n, density, dtype)
    pos, values, words = _hostops.nonzeros_and_bitmap(x, capacity=room)
    want = torch.nonzero(x).squeeze(1)
    assert torch.equal(pos, want) and pos.dtype == torch.int64
    assert values.dtype == x.dtype and torch.equal(values, x[want])
    assert torch.equal(words, pack_positions(want, n))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_nonzero_positions_count_nan_and_inf_but_not_negative_zero(dtype) -> None:
    x = torch.tensor([0.0, -0.0, float("nan"), 1.0, float("-inf"), -0.0, 2.0**-20], dtype=dtype)
    assert _hostops.nonzero_positions(x).tolist() == [2, 3, 4, 6] == torch.nonzero(x).squeeze(1).tolist()
    pos, values, _ = _hostops.nonzeros_and_bitmap(x)
    assert pos.tolist() == [2, 3, 4, 6]
    want = x[pos]
    assert torch.equal(values.isnan(), want.isnan())
    assert torch.equal(values.nan_to_num(), want.nan_to_num())


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 127, 128, 129, 1000, 4099])
def test_native_scan_edges_equal_numpy(dtype, n) -> None:
    """The native scan at word edges (the AVX2 loop packs 64 elements, a scalar tail the rest):
    every element nonzero, none, and special values (-0.0, NaN, denormals, the sign bit alone)."""
    special = torch.tensor([-0.0, float("nan"), 1e-45, -1e-45, float("inf"), 0.0, -2.0])
    cases = [torch.ones(n), torch.zeros(n), special.repeat(n // 7 + 1)[:n]]
    if dtype == torch.int32:
        cases = [c.nan_to_num(0, 7, -7).to(torch.int32) for c in cases[:2]] + [
            torch.tensor([0, -2**31, 1, -1, 2**31 - 1, 0, 0], dtype=torch.int32).repeat(n // 7 + 1)[:n]]
    for x in cases:
        pos, values, words = _hostops.nonzeros_and_bitmap(x)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_native, "AVAILABLE", False)
            want_pos, want_values, want_words = _hostops.nonzeros_and_bitmap(x)
        assert torch.equal(pos, want_pos) and torch.equal(pos, torch.nonzero(x).squeeze(1))
        assert torch.equal(values.view(torch.int32), want_values.view(torch.int32))  # bit for bit (NaN too)
        assert torch.equal(words, want_words)


@needs_native
def test_native_set_bits_of_full_and_sparse_words() -> None:
    """Words with 0 to 32 set bits around the decoder's step of four, odd word counts, and groups of
    256 bits (8 words) that the decoder skips when empty."""
    for n_words in (1, 2, 3, 7, 8, 9, 17):
        for bits in (0, 1, 4, 5, 8, 9, 31, 32):
            words = torch.zeros(n_words, dtype=torch.int32)
            for w in range(n_words):
                words[w] = torch.tensor((1 << bits) - 1 if bits < 32 else -1, dtype=torch.int64).to(torch.int32)
            want = _hostops._set_bit_positions_torch(words)
            assert torch.equal(_hostops.set_bit_positions(words), want)


def test_nonzero_positions_of_a_view_and_of_a_strided_tensor() -> None:
    x = _sparse_tensor(3, 10_000, 0.1, torch.float32)
    view = x[1234:8765]
    assert torch.equal(_hostops.nonzero_positions(view), torch.nonzero(view).squeeze(1))
    strided = x[::3]  # not contiguous: the torch fallback
    assert torch.equal(_hostops.nonzero_positions(strided), torch.nonzero(strided).squeeze(1))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 20_000), density=st.sampled_from([0.0, 0.002, 0.1, 0.7, 1.0]),
       native=st.booleans())
def test_set_bit_positions_roundtrip_and_equal_torch(seed, n, density, native) -> None:
    g = torch.Generator().manual_seed(seed)
    pos = torch.nonzero(torch.rand(n, generator=g) < density).squeeze(1)
    words = pack_positions(pos, n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "AVAILABLE", native and _native.AVAILABLE)
        got = _hostops.set_bit_positions(words)
    assert got.dtype == torch.int64
    assert torch.equal(got, pos)
    assert torch.equal(got, _hostops._set_bit_positions_torch(words))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 5000), k=st.integers(0, 500))
def test_sorted_slots_gather_scatter_equal_torch(seed, n, k) -> None:
    g = torch.Generator().manual_seed(seed)
    hay = torch.unique(torch.randint(0, 4 * n, (n,), generator=g))
    needles = torch.sort(torch.randint(0, 4 * n + 2, (k,), generator=g)).values
    assert torch.equal(_hostops.sorted_slots(hay, needles), torch.searchsorted(hay, needles))
    src = torch.randn(hay.numel(), generator=g)
    index = torch.randint(0, hay.numel(), (k,), generator=g)
    assert torch.equal(_hostops.gather(src, index), src[index])
    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.float64):
        out, ref = torch.zeros(4 * n, dtype=dtype), torch.zeros(4 * n, dtype=dtype)
        values = torch.randn(hay.numel(), generator=g).to(dtype)
        _hostops.scatter_(out, hay, values)
        ref[hay] = values
        assert torch.equal(out, ref)


def _scale_elementwise(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """The reference: x * 2**shift per element, in two exact power-of-two steps."""
    first = shift.clamp(-1000, 1000)
    return x * _fixedpoint._pow2(first) * _fixedpoint._pow2((shift - first).clamp(-1000, 1000))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), world=st.integers(1, 300), block=st.sampled_from([1, 3, 64, 1024]),
       spread=st.sampled_from([0, 30, 600, 1100]))
def test_block_scaling_equals_elementwise_scaling(seed, world, block, spread) -> None:
    """quantize/dequantize gather per-block factors; the words and results are those of scaling
    each element (spread 1100: exponents far enough apart that the second factor is needed)."""
    g = torch.Generator().manual_seed(seed)
    n = 3 * block + 5
    blocks = -(-n // block)
    exps = torch.randint(-spread - 1, spread + 2, (blocks,), generator=g, dtype=torch.int32)
    exps[torch.rand(blocks, generator=g) < 0.2] = _fixedpoint.EMPTY_EXPONENT
    idx = torch.arange(n)
    held = exps[idx // block] != _fixedpoint.EMPTY_EXPONENT
    idx = idx[held]
    e = exps[idx // block].to(torch.int64)
    values = torch.ldexp(torch.rand(idx.numel(), generator=g, dtype=torch.float64) - 0.5, e.to(torch.float64))
    p = _fixedpoint.precision_bits(world)
    want_q = torch.round(_scale_elementwise(values, p - e)).clamp_(-(2.0**p - 1), 2.0**p - 1).to(torch.int32)
    got_q = _fixedpoint.quantize(idx, values, exps, block, world)
    assert torch.equal(got_q, want_q)
    sums = got_q * min(world, 3)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        want = _scale_elementwise(sums.to(torch.float64), e - p).to(dtype)
        assert torch.equal(_fixedpoint.dequantize(idx, sums, exps, block, world, dtype), want)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 20_000), density=st.sampled_from([0.001, 0.1, 0.7, 1.0]),
       mine=st.sampled_from([0.0, 0.3, 1.0]), path=st.sampled_from(["native", "numpy", "torch"]),
       shuffled=st.booleans())
def test_bit_ranks_equal_searchsorted_in_the_union(seed, n, density, mine, path, shuffled) -> None:
    """A worker's slot in the union: from popcounts of the OR-ed bitmap == searchsorted(union),
    on every path, for positions in any order."""
    g = torch.Generator().manual_seed(seed)
    union = torch.nonzero(torch.rand(n, generator=g) < density).squeeze(1)
    own = union[torch.rand(union.numel(), generator=g) < mine]
    if shuffled:
        own = own[torch.randperm(own.numel(), generator=g)]
    words = pack_positions(union, n)
    want = torch.searchsorted(union, own)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "AVAILABLE", path == "native" and _native.AVAILABLE)
        if path == "torch":  # the torch path (other devices, numpy < 2)
            mp.setattr(_hostops, "_host", lambda t: False)
        got = _hostops.bit_ranks(words, own)
    assert got.dtype == torch.int64
    assert torch.equal(got, want)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 20_000), density=st.sampled_from([0.0, 0.01, 0.5, 1.0]),
       numpy_path=st.booleans())
def test_bitmap_of_sets_exactly_the_bits_of_the_positions(seed, n, density, numpy_path) -> None:
    g = torch.Generator().manual_seed(seed)
    pos = torch.nonzero(torch.rand(n, generator=g) < density).squeeze(1)
    pos = pos[torch.randperm(pos.numel(), generator=g)]  # order does not matter
    with pytest.MonkeyPatch.context() as mp:
        if not numpy_path:
            mp.setattr(_hostops, "_host", lambda t: False)
        words = _hostops.bitmap_of(pos, n)
    assert words.dtype == torch.int32 and words.numel() == -(-n // 32)
    bits = (words.to(torch.int64).unsqueeze(1) >> torch.arange(32)) & 1  # bit i % 32 of word i // 32
    assert torch.equal(torch.nonzero(bits.reshape(-1)).squeeze(1), torch.sort(pos).values)


@pytest.mark.parametrize("shift", [-127, -126, -60, 0, 50, 96, 97])
def test_float32_dequantize_equals_rounding_the_exact_float64_product(shift) -> None:
    """float32 results take a float32 path when every product stays normal (shifts -126..96):
    sums that need rounding (more than 24 significant bits, ties included) and shifts at and just
    past the edges give the float32 of the exact product either way."""
    world, block = 4, 8
    p = _fixedpoint.precision_bits(world)
    sums = torch.tensor([0, 1, -1, 2**24 + 1, 2**24 + 3, -(2**25 + 2), 2**31 - 1, -(2**31 - 1), 123456789,
                         2**26 + 2**2, 2**26 + 6, -7], dtype=torch.int32)
    exps = torch.tensor([shift + p, _fixedpoint.EMPTY_EXPONENT], dtype=torch.int32)
    idx = torch.arange(sums.numel())  # all in block 0 (block size 8 -> positions 8.. in block 1)
    idx[idx >= block] = idx[idx >= block] - block  # keep them in block 0
    got = _fixedpoint.dequantize(idx, sums, exps, block, world, torch.float32)
    want = _scale_elementwise(sums.to(torch.float64), torch.full((sums.numel(),), shift, dtype=torch.int64))
    assert torch.equal(got, want.to(torch.float32))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 3000), density=st.sampled_from([0.0, 0.01, 0.3, 1.0]))
def test_nonzero_word_bitmap_equals_packing_the_nonzero_positions(seed, n, density) -> None:
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    words[torch.rand(n, generator=g) >= density] = 0
    got = _hostops.nonzero_word_bitmap(words)
    assert got.dtype == torch.int32
    assert torch.equal(got, pack_positions(torch.nonzero(words).squeeze(1), n))


@pytest.mark.skipif(os.environ.get("HOMAGG_NATIVE") == "0", reason="HOMAGG_NATIVE=0 turns the native kernels off")
@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_the_native_kernels_are_built_where_a_compiler_is() -> None:
    """An install with a C compiler builds them (setup.py); a silent fallback would hide a broken build."""
    assert _native.AVAILABLE, "homagg/codec/_native_kernels*.so is missing: reinstall (pip install -e .) with a C compiler"


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 5000), world=st.integers(1, 64),
       block=st.sampled_from([1, 3, 64, 256]), native=st.booleans())
def test_decode_into_equals_dequantize_then_scatter(seed, n, world, block, native) -> None:
    """The fused float32 decode writes what dequantize + scatter_ write, bit for bit (a block size
    that is no power of two takes the torch path)."""
    g = torch.Generator().manual_seed(seed)
    blocks = -(-n // block)
    exps = torch.randint(-90, 100, (blocks,), generator=g, dtype=torch.int32)  # shifts e - (31 - ...) in float32's range
    exps[torch.rand(blocks, generator=g) < 0.2] = _fixedpoint.EMPTY_EXPONENT
    pos = torch.nonzero(torch.rand(n, generator=g) < 0.3).squeeze(1)
    pos = pos[exps[pos // block] != _fixedpoint.EMPTY_EXPONENT]
    sums = torch.randint(-(2**31) + 1, 2**31, (pos.numel(),), generator=g, dtype=torch.int64).to(torch.int32)
    factor = _fixedpoint.float32_factors(exps, world)
    assert factor is not None  # every scale is a normal float32
    want = torch.full((n,), -7.0)
    _hostops.scatter_(want, pos, _fixedpoint.dequantize(pos, sums, exps, block, world, torch.float32))
    got = torch.full((n,), -7.0)  # untouched outside pos
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "AVAILABLE", native and _native.AVAILABLE)
        _hostops.decode_into_(got, pos, sums, factor, block)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@needs_native
def test_native_decode_into_refuses_positions_outside_and_writes_nothing() -> None:
    out = torch.zeros(100)
    factor = torch.ones(1)  # one block of 128 covers positions 0..127
    with pytest.raises(IndexError):
        _native.decode_into32(out.numpy(), torch.tensor([5, 100]).numpy(), torch.tensor([1, 2], dtype=torch.int32).numpy(),
                              factor.numpy(), 7)
    with pytest.raises(IndexError):  # position 130's block (1) has no factor
        _native.decode_into32(torch.zeros(200).numpy(), torch.tensor([5, 130]).numpy(),
                              torch.tensor([1, 2], dtype=torch.int32).numpy(), factor.numpy(), 7)
    assert not out.any()


@needs_native
def test_native_bit_ranks_refuse_a_position_outside_the_bitmap() -> None:
    words = pack_positions(torch.tensor([3, 40]), 64)
    with pytest.raises(IndexError):
        _native.bit_ranks32(words.numpy(), torch.tensor([3, 64]).numpy())


@needs_native
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 3000), density=st.sampled_from([0.0, 0.01, 0.5, 1.0]),
       dtype=st.sampled_from([torch.float32, torch.int32]), negatives=st.sampled_from([0, 1, 3]))
def test_native_scan_tells_the_bits_of_what_it_found_zero(seed, n, density, dtype, negatives) -> None:
    """``homagg_scan32z`` (the scan that also ORs the raw bits of every element it found zero, so a
    float's -0.0 shows) against numpy, with -0.0 anywhere (the 64-element groups and the tail), and
    the same positions, values and words as the plain scan."""
    x = _sparse_tensor(seed, n, density, dtype)
    if dtype == torch.float32 and n:
        g = torch.Generator().manual_seed(seed + 1)
        zeros = torch.nonzero(x == 0).squeeze(1)
        if zeros.numel():
            x[zeros[torch.randint(zeros.numel(), (negatives,), generator=g)]] = -0.0
    a = x.view(torch.int32).numpy().view("uint32")
    mask = _hostops._NATIVE_MASKS[dtype]
    odd: list[int] = []
    pos, values, words = _hostops.nonzeros_and_bitmap(x, 7, odd)
    want = int(np.bitwise_or.reduce(a[(a & mask) == 0], initial=0))
    assert odd == ([] if n == 0 else [odd[0]]) and (not odd or (odd[0] != 0) == (want != 0)), (odd, want)
    plain = _hostops.nonzeros_and_bitmap(x, 7)
    assert torch.equal(pos, plain[0]) and torch.equal(values, plain[1]) and torch.equal(words, plain[2])


@needs_native
def test_a_worker_skips_the_fill_only_where_its_scan_saw_no_negative_zero() -> None:
    """``Decoding.plain_zeros``: set by the scan of a float32 input; an input with one -0.0 (at the
    start, in a group, in the tail) leaves it False, so the in-place result is filled."""
    from homagg.codec import CodecConfig
    from homagg.codec._worker import Worker

    for where in (None, 0, 64 * 5 + 3, 1000):
        x = torch.zeros(1003)
        x[::10] = 1.5
        if where is not None:
            x[where + 1 if where % 10 == 0 else where] = -0.0
        w = Worker(x, 2, CodecConfig(), inplace=True)
        w.idx  # noqa: B018 - the scan
        assert w.plain_zeros is (where is None), where
