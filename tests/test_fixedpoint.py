"""Fixed-point stage: grid arithmetic, limbs and typed errors, against exact references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import homagg
from homagg.codec import _blocks
from homagg.codec import _fixedpoint as fp
from homagg.codec._worker import Worker
from homagg.testing import local_allreduce


@pytest.mark.parametrize(("world", "bits"), [(1, 31), (2, 30), (3, 29), (8, 28), (33, 25), (128, 24)])
def test_precision_leaves_log2_world_headroom(world: int, bits: int) -> None:
    assert fp.precision_bits(world) == bits
    assert world * (2**bits - 1) <= 2**31 - 1


def test_quantize_extremes_never_overflow_the_sum() -> None:
    world = 8
    x = torch.tensor([1.0 - 2**-53, -(1.0 - 2**-53), 0.75], dtype=torch.float64)
    idx = torch.arange(3)
    exps = fp.block_exponents(idx, x, 3, 1024)
    q = fp.quantize(idx, x, exps, 1024, world).to(torch.int64)
    assert int(q.abs().max()) * world <= 2**31 - 1


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8])
def test_limbs_round_trip_exactly(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    v = torch.tensor([info.min, info.max, 0, -1 if info.min < 0 else 1, 12345 % info.max], dtype=dtype)
    limbs = fp.to_limbs(v, fp.limb_count(dtype))
    assert torch.equal(fp.from_limbs(limbs, dtype), v)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integer_sum_exact_and_overflow_is_typed(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    near = [torch.tensor([info.max // 2, info.min // 2, 7], dtype=dtype) for _ in range(2)]
    for scheme in homagg.SCHEMES:
        out = local_allreduce(near, scheme)[0]
        assert out.tolist() == [sum(int(t[i]) for t in near) for i in range(3)]
    over = [torch.tensor([info.max, 1], dtype=dtype), torch.tensor([1, 1], dtype=dtype)]
    with pytest.raises(homagg.IntegerOverflowError):
        local_allreduce(over, "dense")
    under = [torch.tensor([info.min], dtype=dtype), torch.tensor([-1], dtype=dtype)]
    with pytest.raises(homagg.IntegerOverflowError):
        local_allreduce(under, "compact")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("scheme", homagg.SCHEMES)
def test_non_finite_input_raises_before_sending(bad: float, scheme: str) -> None:
    sent: list[str] = []

    class Recorder(homagg.InProcessSwitch):
        def _combine(self, rank, streams):  # type: ignore[no-untyped-def]
            sent.extend(s.name for s in streams)
            return super()._combine(rank, streams)

    x = torch.ones(100)
    x[17] = bad
    with pytest.raises(homagg.NonFiniteError):
        homagg.allreduce(x, Recorder(1).port(0), scheme=scheme)
    assert sent == []
    with pytest.raises(homagg.NonFiniteError):
        local_allreduce([torch.ones(100), x], scheme)


def test_bad_inputs_are_typed_errors() -> None:
    with pytest.raises(homagg.InputError):
        local_allreduce([torch.zeros(3, dtype=torch.complex64)] * 2)
    with pytest.raises(homagg.InputError):
        local_allreduce([torch.zeros(3), torch.zeros(4)])
    with pytest.raises(homagg.InputError):
        local_allreduce([])
    with pytest.raises(homagg.ConfigError):
        local_allreduce([torch.zeros(3)], "zip")
    with pytest.raises(homagg.ConfigError):
        local_allreduce([torch.zeros(3)], "auto", block_size=0)
    with pytest.raises(homagg.ConfigError):
        local_allreduce([torch.zeros(3)], "auto", no_such_option=1)
    assert issubclass(homagg.NonFiniteError, homagg.HomAggError)


@settings(max_examples=60, deadline=None)
@given(numel=st.integers(1, 3000), density=st.floats(0.0, 1.0), log_scale=st.integers(-140, 120),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]), seed=st.integers(0, 2**31))
def test_index_and_dense_exponents_agree_bit_for_bit(numel: int, density: float, log_scale: int,
                                                     dtype: torch.dtype, seed: int) -> None:
    """A Worker's local exponents from its index list (O(nnz)) equal the dense pass's, subnormals
    and empty blocks included, so choosing the cheaper path never changes a word."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=gen, dtype=torch.float64) * 2.0**log_scale
    x[torch.rand(numel, generator=gen) >= density] = 0
    x = x.to(dtype)
    cfg = homagg.CodecConfig(block_size=64)
    by_index = Worker(x, 2, cfg)
    by_index.idx  # noqa: B018 - the index list first: exponents from it
    if not bool(torch.isfinite(x).all()):  # overflowed to Inf in a narrow dtype: both paths refuse it
        for w in (Worker(x, 2, cfg), by_index):
            with pytest.raises(homagg.NonFiniteError):
                w.local_exponents  # noqa: B018
        return
    dense = Worker(x, 2, cfg).local_exponents
    assert torch.equal(by_index.local_exponents, dense)
    assert torch.equal(dense, _blocks.exponents(x, 64))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), numel=st.integers(1, 5000), density=st.sampled_from([0.001, 0.05, 0.5, 1.0]),
       block=st.sampled_from([1, 16, 1024, 100]), log_scale=st.integers(-1070, 1000), native=st.booleans())
def test_block_exponents_native_pass_equals_the_scatter_amax(seed, numel, density, block, log_scale, native) -> None:
    """The native peaks (homagg_block_peaks_at64; block 100 is not a power of two: torch's path)
    give the exponents torch's scatter-amax and frexp give, subnormals and empty blocks included."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=gen, dtype=torch.float64) * 2.0**log_scale
    idx = torch.nonzero((torch.rand(numel, generator=gen) < density) & (x != 0)).squeeze(1)
    values = x[idx]
    blocks = -(-numel // block)
    peak = torch.zeros(blocks, dtype=torch.float64).scatter_reduce_(0, idx // block, values.abs(), reduce="amax")
    e = torch.frexp(peak).exponent.to(torch.int32)
    want = torch.where(peak == 0, torch.full_like(e, fp.EMPTY_EXPONENT), e)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fp._native, "AVAILABLE", native and fp._native.AVAILABLE)
        assert torch.equal(fp.block_exponents(idx, values, numel, block), want)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_block_exponents_refuse_non_finite_values_on_both_paths(bad, native, monkeypatch) -> None:
    monkeypatch.setattr(fp._native, "AVAILABLE", native and fp._native.AVAILABLE)
    idx = torch.tensor([0, 700, 2049])
    values = torch.tensor([1.0, bad, -3.0], dtype=torch.float64)
    with pytest.raises(homagg.NonFiniteError, match="non-finite"):
        fp.block_exponents(idx, values, 4096, 1024)


def test_native_block_peaks_refuse_a_position_past_the_elements() -> None:
    if not fp._native.AVAILABLE:
        pytest.skip("the native kernels were not built")
    with pytest.raises(ValueError):  # 3000 lies in the last block, but past the 2100 elements
        fp._native.block_peaks_at64(torch.tensor([5, 3000]).numpy(), torch.ones(2, dtype=torch.float64).numpy(), 2100, 1024)
