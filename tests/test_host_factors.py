"""The per-block factors computed on the host in numpy (:mod:`homagg.codec._host_factors`) against the
torch code they stand for (which every device tensor still takes), bit for bit, over every
exponent a call can carry (EMPTY, both ends of float32's and float64's ranges, out-of-range
guesses), and the decode / quantise / frexp results of the native path that uses them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from homagg.codec import _blocks, _fixedpoint, _host_factors, _native

EMPTY = _fixedpoint.EMPTY_EXPONENT
#: precision bits of one- and two-word floats over worlds 1 .. 2**16
PRECISIONS = sorted({_fixedpoint.precision_bits(w, k) for w in (1, 2, 3, 4, 7, 64, 1000, 2**16) for k in (1, 2)})
#: every exponent from far below float64's range to far above, EMPTY, and int32's extremes
EVERY = np.concatenate([np.arange(-1300, 1300, dtype=np.int32),
                        np.array([EMPTY, 2**31 - 1, -(2**31) + 1, 5000, -5000], dtype=np.int32)])


def _bits(a: np.ndarray | torch.Tensor | None) -> list[int] | None:
    """Exact bit patterns (float32 as int32, float64 as int64)."""
    if a is None:
        return None
    t = torch.from_numpy(a if a.flags.writeable else a.copy()) if isinstance(a, np.ndarray) else a
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64).tolist()


def _exponent_sets() -> list[np.ndarray]:
    """Arrays of block exponents: each exponent alone (beside an EMPTY block), typical calls (in
    float32's range), a typical call with one block far out, an empty array."""
    g = np.random.default_rng(7)
    sets = [np.array([e, EMPTY, 0], dtype=np.int32) for e in EVERY[::7]]
    sets += [g.integers(-30, 10, 256).astype(np.int32) for _ in range(5)]
    for far in (-400, -140, 140, 400, 1100, -1100):
        typical = g.integers(-30, 10, 64).astype(np.int32)
        typical[g.integers(0, 64)] = far
        sets.append(typical)
    sets.append(np.zeros(0, dtype=np.int32))
    sets.append(EVERY.copy())
    return sets


@pytest.mark.parametrize("p", PRECISIONS)
def test_grid_factors_equal_the_torch_code(p: int) -> None:
    for e in _exponent_sets():
        want1, want2 = _blocks._grid_factors(torch.from_numpy(e), p, -126, 127, torch.float32)
        got1, got2 = _host_factors.grid_factors32(e, p)
        assert got1.dtype == np.float32 and got1.flags.c_contiguous
        assert _bits(got1) == _bits(want1)
        assert _bits(got2) == _bits(want2)  # None exactly where the torch code needs no second factor


@pytest.mark.parametrize("p", PRECISIONS)
def test_decode_factors_equal_the_torch_code(p: int) -> None:
    for e in _exponent_sets():
        t = torch.from_numpy(e)
        shift = t.to(torch.int64)
        shift = torch.where(shift == EMPTY, torch.zeros_like(shift), shift - p)
        in_range = bool(shift.numel() == 0 or (shift.min() >= -126 and shift.max() <= 127))
        got = _host_factors.decode_factors32(e, p)
        assert (got is not None) == in_range
        if got is not None:
            assert _bits(got) == _bits(_fixedpoint._pow2(shift, torch.float32))
        # the wide decoding's two float64 factors (the torch code of homagg_dequantize_wide's caller)
        first = shift.clamp(-1000, 1000)
        rest = shift - first
        want2 = _fixedpoint._pow2(rest.clamp(-1000, 1000)) if bool((rest != 0).any()) else None
        got1, got2 = _host_factors.decode_factors64(e, p)
        assert _bits(got1) == _bits(_fixedpoint._pow2(first))
        assert _bits(got2) == _bits(want2)


def test_decode_range_matches_decodes_in_float32() -> None:
    """The float32 decoding's range test is the one the device path reads (decodes_in_float32)."""
    for world in (1, 2, 5, 1000):
        p = _fixedpoint.precision_bits(world)
        for e in _exponent_sets():
            want = bool(_blocks.decodes_in_float32(torch.from_numpy(e), world))
            assert (_host_factors.decode_factors32(e, p) is not None) == want


def test_frexp_exponents_equal_torch_frexp_in_float64() -> None:
    """Every float32 exponent (subnormals, the smallest and largest values, zero) and random bit
    patterns of finite non-negative float32 values."""
    g = np.random.default_rng(11)
    special = np.array([0.0, 2.0**-149, 2.0**-148 * 3, 2.0**-126, 2.0**-126 * 0.75, 1.0, 0.5, 0.9999999,
                        np.finfo(np.float32).max, 2.0**127, 2.0**-127], dtype=np.float32)
    powers = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)
    pattern = g.integers(0, 0x7F800000, 20000, dtype=np.int64).astype(np.uint32).view(np.float32)
    for peaks in (special, powers, powers * np.float32(1.5), pattern):
        peaks = np.ascontiguousarray(peaks, dtype=np.float32)
        p = torch.from_numpy(peaks.copy())
        want = torch.frexp(p.to(torch.float64)).exponent.to(torch.int32)
        want = torch.where(p == 0, torch.full_like(want, EMPTY), want)
        got = _host_factors.frexp_exponents32(peaks)
        assert got.dtype == np.int32
        assert got.tolist() == want.tolist()


def test_host_exponents_only_for_cpu_tensors() -> None:
    e = torch.arange(5, dtype=torch.int32)
    view = _host_factors.host_exponents(e)
    assert view is not None and view.tolist() == [0, 1, 2, 3, 4]
    assert _host_factors.host_exponents(torch.empty(3, dtype=torch.int32, device="meta")) is None


needs_native = pytest.mark.skipif(not _native.AVAILABLE, reason="the native kernels were not built")


def _torch_path(fn, *args, **kwargs):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "AVAILABLE", False)
        return fn(*args, **kwargs)


@needs_native
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), blocks=st.integers(1, 300), world=st.sampled_from([1, 2, 3, 8, 1000]),
       far=st.sampled_from([None, -200, -140, 100, 150]), words=st.sampled_from([1, 2]))
def test_native_decode_with_host_factors_equals_the_torch_path(seed, blocks, world, far, words) -> None:
    """dequantize_into's native path (factors from numpy) writes the torch path's bits, also when
    a block's exponent is outside float32's decoding range (then both decode in float64), and
    for two-word sums."""
    if words == 2 and not _native.WIDE:
        pytest.skip("library built before wide words")
    g = torch.Generator().manual_seed(seed)
    block = 64
    n = blocks * block - int(torch.randint(0, block, (1,), generator=g))
    exps = torch.randint(-40, 20, (blocks,), generator=g, dtype=torch.int32)
    exps[torch.rand(blocks, generator=g) < 0.1] = EMPTY
    if far is not None:
        exps[int(torch.randint(0, blocks, (1,), generator=g))] = far
    sums = torch.randint(-(2**31) + 1, 2**31 - 1, (n * words,), generator=g, dtype=torch.int32)
    sums[torch.rand(n * words, generator=g) < 0.2] = 0
    got, ref = torch.full((n,), -7.0), torch.full((n,), -7.0)
    counted = _blocks.dequantize_into(got, sums, exps, world, block, None, words)
    assert _torch_path(_blocks.dequantize_into, ref, sums, exps, world, block, None, words) is None
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
    nonzero = (sums.view(-1, words) != 0).any(dim=1)
    assert counted is None or counted == int(nonzero.sum())


@needs_native
def test_local_exponents_of_extreme_float32_blocks_equal_the_torch_path() -> None:
    """Blocks peaking at subnormals, at float32's maximum, at zero (EMPTY) and at -0.0."""
    x = torch.zeros(7 * 16)
    x[0:16] = 2.0**-149
    x[16] = -(2.0**-140)
    x[32:48] = torch.finfo(torch.float32).max
    x[64] = -0.0
    x[80:96] = torch.linspace(-3, 3, 16)
    x[100] = -(2.0**-127)
    got = _blocks.exponents(x, 16)
    want = _torch_path(_blocks.exponents, x, 16)
    assert got.dtype == want.dtype == torch.int32
    assert got.tolist() == want.tolist()
    assert got.tolist()[3] == EMPTY and got.tolist()[4] == EMPTY  # zeros, -0.0 alone


def test_kept_grid_factors_equal_fresh_ones_whatever_the_order() -> None:
    """The kept factors (a steady call's guess repeats) are the fresh ones, bit for bit, when
    exponent sets and precisions alternate, repeat, and outnumber what is kept; they are read-only."""
    sets = _exponent_sets()[-8:] + [np.array([3, EMPTY, -2], dtype=np.int32), np.array([3, EMPTY, -2], dtype=np.int64)]
    order = [(i, p) for _ in range(3) for i in range(len(sets)) for p in PRECISIONS[:3]]
    for i, p in order + order[::-1]:
        e = sets[i].copy()  # a new array of the same values: kept by value, not by identity
        got1, got2 = _host_factors.grid_factors32_kept(e, p)
        want1, want2 = _host_factors.grid_factors32(e, p)
        assert _bits(got1) == _bits(want1) and _bits(got2) == _bits(want2), (i, p)
        assert _host_factors.grid_factors32_kept(e.copy(), p)[0] is got1  # kept: the same arrays again
        with pytest.raises(ValueError):
            got1[:1] = 0  # a writer cannot change a later call's factors
    assert len(_host_factors._KEPT) <= _host_factors._KEEP
