"""compact's fused passes over the union (``homagg_quantize_place64``, ``homagg_decode_bits32``)
against the unfused path they replace (slots by ``bit_ranks``, ``quantize``, scatter; positions
by ``set_bit_positions``, then ``decode_into_``) and against torch, bit for bit; their refusals of
inconsistent input; and a whole compact call equal with the fused passes and without, and
within the documented bound of the float64 sum."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from homagg.codec import CodecConfig, _bitmap, _fixedpoint, _hostops, _native
from homagg.codec._bitmap import pack_positions
from homagg.codec._schemes import protocol
from homagg.codec._stats import WorkerStats
from homagg.testing import within_bound
from homagg.transport import combine_words

needs_native = pytest.mark.skipif(not _native.AVAILABLE, reason="the native kernels were not built (no C compiler "
                                  "at install time, or HOMAGG_NATIVE=0)")


def _union_and_mine(seed: int, n: int, union_density: float, mine: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted union positions of ``n`` elements and a sorted subset of them (the local nonzeros)."""
    g = torch.Generator().manual_seed(seed)
    union = torch.nonzero(torch.rand(n, generator=g) < union_density).squeeze(1)
    own = union[torch.rand(union.numel(), generator=g) < mine]
    return union, own


def _exponents(seed: int, n: int, block: int, spread: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    blocks = -(-n // block)
    return torch.randint(-spread, spread + 1, (blocks,), generator=g, dtype=torch.int32)


@needs_native
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 9000), union_density=st.sampled_from([0.001, 0.04, 0.3, 1.0]),
       mine=st.sampled_from([0.0, 0.2, 1.0]), block=st.sampled_from([1, 32, 256, 1024]), world=st.sampled_from([2, 4, 8]),
       spread=st.sampled_from([3, 1100]))
def test_quantize_into_slots_equals_ranks_quantize_and_scatter(seed, n, union_density, mine, block, world, spread) -> None:
    union, own = _union_and_mine(seed, n, union_density, mine)
    words = pack_positions(union, n)
    values = torch.randn(own.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    values *= 2.0 ** torch.randint(-40, 40, (own.numel(),), generator=torch.Generator().manual_seed(seed + 2))
    exps = _exponents(seed, n, block, spread)  # spread 1100: the two-factor path (shift beyond +-1000)
    want = torch.zeros(union.numel(), dtype=torch.int32)
    want[_hostops.bit_ranks(words, own)] = _fixedpoint.quantize(own, values, exps, block, world)
    # the unfused path's words are torch's own (the hostops and quantize tests tie them to torch)
    assert torch.equal(want[torch.searchsorted(union, own)], _fixedpoint.quantize(own, values, exps, block, world))
    got = torch.zeros(union.numel(), dtype=torch.int32)
    assert _fixedpoint.places_natively(own, values, words, block)
    _fixedpoint.quantize_into_slots(own, values, exps, block, world, words, got)
    assert torch.equal(got, want)


@needs_native
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(0, 200_000), union_density=st.sampled_from([0.0, 0.001, 0.04, 0.3, 1.0]),
       block=st.sampled_from([1, 64, 1024]), world=st.sampled_from([2, 4, 8]))
def test_decode_bits_equals_positions_then_decode(seed, n, union_density, block, world) -> None:
    union, _ = _union_and_mine(seed, n, union_density, 0.0)
    words = pack_positions(union, n)
    g = torch.Generator().manual_seed(seed)
    sums = torch.randint(-2**31, 2**31 - 1, (union.numel(),), generator=g, dtype=torch.int32)
    factor = _fixedpoint.float32_factors(_exponents(seed, max(n, 1), block, 20), world)
    assert factor is not None
    start = torch.randn(max(n, 0), generator=g)  # untouched outside the union
    want = start.clone()
    _hostops.decode_into_(want, _hostops.set_bit_positions(words), sums, factor, block)
    got = start.clone()
    _hostops.decode_bits_into_(got, words, sums, factor, block)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    # and the reference in torch: float32(sum) * factor of the block, at the positions
    ref = start.clone()
    ref[union] = sums.to(torch.float32) * factor[union // block]
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n_words=st.integers(0, 3000), held=st.sampled_from([0.0, 0.01, 0.7, 1.0]),
       native=st.booleans())
def test_two_level_select_and_place_equal_listing_the_held_words(seed, n_words, held, native) -> None:
    """select_words / place_words by the word bitmap (native: one pass each, nothing listed) equal
    gathering at, and scattering to, the listed positions of its set bits."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(-2**31, 2**31 - 1, (n_words,), generator=g, dtype=torch.int32)
    words[torch.rand(n_words, generator=g) >= held] = 0
    mask = _bitmap.word_bitmap(words)
    positions = _hostops.set_bit_positions(mask)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "AVAILABLE", native and _native.AVAILABLE)
        selected = _bitmap.select_words(words, mask)
        assert torch.equal(selected, words[positions])
        assert torch.equal(_bitmap.place_words(selected, mask, n_words), words)  # zeros left out come back


@needs_native
def test_fused_kernels_refuse_inconsistent_input() -> None:
    n, block = 4096, 256
    union = torch.tensor([3, 70, 900, 4000])
    words = pack_positions(union, n)
    f1 = torch.ones(n // block, dtype=torch.float64).numpy()
    out = torch.zeros(4, dtype=torch.int32).numpy()
    for own in ([3, 71], [70, 3], [3, 3], [5000]):  # a clear bit, descending, repeated, outside the bitmap
        with pytest.raises(ValueError):
            _native.quantize_place64(torch.tensor(own).numpy(), torch.ones(len(own), dtype=torch.float64).numpy(),
                                     block, f1, None, 100.0, words.numpy(), out)
    with pytest.raises(ValueError):  # fewer slots than the union's set bits
        _native.quantize_place64(torch.tensor([3]).numpy(), torch.ones(1, dtype=torch.float64).numpy(), block, f1,
                                 None, 100.0, words.numpy(), out[:3])
    with pytest.raises(ValueError):  # a block without its factor
        _native.quantize_place64(torch.tensor([4000]).numpy(), torch.ones(1, dtype=torch.float64).numpy(), block,
                                 f1[:2], None, 100.0, words.numpy(), out)
    result = torch.full((n,), 7.0)
    factor = torch.ones(n // block, dtype=torch.float32).numpy()
    for sums, size, fac in ((torch.ones(3, dtype=torch.int32), n, factor),  # one sum short
                            (torch.ones(4, dtype=torch.int32), 3999, factor),  # a bit past the result
                            (torch.ones(4, dtype=torch.int32), n, factor[:3])):  # a block without its factor
        target = result[:size].clone()
        with pytest.raises(ValueError):
            _native.decode_bits32(target.numpy(), words.numpy(), sums.numpy(), fac, block.bit_length() - 1)
        assert torch.equal(target, result[:size])  # nothing written
    with pytest.raises(ValueError):  # one word short for the mask's set bits
        _native.place_bits32(words.numpy(), torch.ones(3, dtype=torch.int32).numpy(), n)


def _compact_call(tensors: list[torch.Tensor], cfg: CodecConfig) -> list[torch.Tensor]:
    world = len(tensors)
    gens = [protocol(t.clone(), world, "compact", cfg, WorkerStats(), inplace=True) for t in tensors]
    replies: list = [None] * world
    while True:
        rounds, done = [], []
        for r, gen in enumerate(gens):
            try:
                rounds.append(gen.send(replies[r]))
            except StopIteration as stop:
                done.append(stop.value)
        if done:
            return done
        combined = [combine_words(s.op, [rd[i].words for rd in rounds]) for i, s in enumerate(rounds[0])]
        replies = [[c.clone() for c in combined] for _ in range(world)]


@needs_native
@pytest.mark.parametrize("levels", [1, 2])
def test_compact_call_is_bit_identical_with_and_without_the_fused_passes(levels, monkeypatch) -> None:
    g = torch.Generator().manual_seed(5)
    n, world = 300_000, 4
    tensors = []
    for _ in range(world):
        x = torch.zeros(n)
        pos = torch.randint(0, n, (3000,), generator=g)
        x[pos] = torch.randn(pos.numel(), generator=g) * 10.0 ** torch.randint(-6, 6, (pos.numel(),), generator=g)
        tensors.append(x)
    cfg = CodecConfig(bitmap_levels=levels)
    fused = _compact_call(tensors, cfg)
    monkeypatch.setattr(_fixedpoint, "places_natively", lambda *a: False)
    monkeypatch.setattr(_hostops, "decode_bits_into_",
                        lambda out, words, sums, factor, block: _hostops.decode_into_(
                            out, _hostops.set_bit_positions(words), sums, factor, block))
    unfused = _compact_call(tensors, cfg)
    for a, b in zip(fused, unfused, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
        assert within_bound(a, tensors)  # the float64 sum, within the documented per-block bound
