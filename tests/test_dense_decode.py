"""A steady dense float32 call's decode on the CPU: the native float32 path of
:func:`homagg.codec._blocks.dequantize_into` (what :meth:`homagg.codec._decoding.Decoding.dense_result`
calls), the kernel on the tensors' addresses under decode factors kept per exponent set
(:func:`homagg.codec._host_factors.decode_factors32_kept`).  Oracles: each value's exact float64
product ``sum * 2**(E - P)`` rounded once to float32 (+0.0 for a zero sum, whatever the target held),
and the torch path of :func:`~homagg.codec._blocks.dequantize_into` (the native kernels off: what
every device tensor, and every CPU tensor without them, takes), also in whole in-place all_reduce
calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import homagg
from homagg.codec import History, _fixedpoint, _host_factors, _native
from homagg.codec._config import CodecConfig
from homagg.codec._worker import Worker
from homagg.testing import on_threads
from homagg.transport import InProcessSwitch

needs_native = pytest.mark.skipif(not _native.AVAILABLE, reason="the native kernels were not built (no C compiler "
                                  "at install time, or HOMAGG_NATIVE=0)")
EMPTY = _fixedpoint.EMPTY_EXPONENT
BLOCK = CodecConfig().block_size


def _bits(t: torch.Tensor) -> list[int]:
    return t.reshape(-1).view(torch.int32).tolist()


def _exact(sums: torch.Tensor, exps: torch.Tensor, world: int) -> torch.Tensor:
    """float32 of each sum times its block's ``2**(E - P)`` (1 for EMPTY), exact in float64, one rounding."""
    shift = torch.where(exps == EMPTY, 0, exps.to(torch.int64) - _fixedpoint.precision_bits(world))
    scale = torch.pow(torch.tensor(2.0, dtype=torch.float64), shift.double()).repeat_interleave(BLOCK)[: sums.numel()]
    return (sums.reshape(-1).double() * scale).to(torch.float32)


def _case(seed: int, n: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums (n, 1) with zeros and extremes, exponents with an EMPTY block whose sums are zero)."""
    g = torch.Generator().manual_seed(seed)
    sums = torch.randint(-(2**31) + 1, 2**31 - 1, (n, 1), generator=g, dtype=torch.int64).to(torch.int32)
    sums[torch.rand(n, generator=g) < 0.2] = 0
    sums[-1] = 0
    exps = torch.randint(-20, 8, (-(-n // BLOCK),), generator=g, dtype=torch.int32)
    if exps.numel() > 1:
        exps[1] = EMPTY
        sums[BLOCK: 2 * BLOCK] = 0
    return sums, exps


def _decode(x: torch.Tensor, sums: torch.Tensor, exps: torch.Tensor, world: int, inplace: bool) -> tuple[torch.Tensor, int]:
    w = Worker(x, world, CodecConfig(), inplace=inplace)
    w.exponents = exps
    out = w.dense_result(sums, {"redo": 0})
    assert (out is x) == inplace
    return out, w.union


def _torch_decode(x: torch.Tensor, sums: torch.Tensor, exps: torch.Tensor, world: int,
                  inplace: bool) -> tuple[torch.Tensor, int]:
    """:func:`_decode` with the native kernels off: dequantize_into's torch path."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "AVAILABLE", False)
        return _decode(x, sums, exps, world, inplace)


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the steady path's kernel calls (the real kernel runs)."""
    calls: list[int] = []
    real = _native.dequantize32_at

    def counted(*args: int) -> int:
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(_native, "dequantize32_at", counted)
    return calls


@needs_native
@pytest.mark.parametrize("n", [65536, 65536 * 4 + 37, 1000, 1])
def test_steady_decode_is_exact_and_kept_factors_follow_exponents_and_world(n: int, native_calls: list[int]) -> None:
    """The same exponent bytes under worlds 2, 4, 3 (three precisions), then other exponents, then
    the first again: each result is the exact one and the torch path's, +0.0 where the sum is zero
    (the target held -0.0 there), the union counted; every decode took the native path."""
    sums, exps = _case(n, n, 2)
    other_sums, other_exps = _case(n + 1, n, 2)
    order = [(sums, exps, 2), (sums, exps, 4), (sums, exps, 3), (other_sums, other_exps, 4), (sums, exps, 2),
             (other_sums, other_exps, 4), (sums, exps, 4)]
    for i, (s, e, world) in enumerate(order):
        inplace = i % 2 == 0
        x = torch.full((n,), -0.0)
        out, union = _decode(x, s, e.clone(), world, inplace)
        want = _exact(s, e, world)
        assert _bits(out) == _bits(want), (i, world)
        assert union == int(torch.count_nonzero(s))
        torch_out, torch_union = _torch_decode(torch.full((n,), -0.0), s, e.clone(), world, inplace)
        assert _bits(out) == _bits(torch_out) and union == torch_union, (i, world)
        zero = s.reshape(-1) == 0
        assert bool(zero.any()) and set(out[zero].view(torch.int32).tolist()) == {0}  # +0.0, never -0.0
    assert native_calls == [n] * len(order)


@needs_native
def test_steady_decode_declines_what_it_cannot_take(native_calls: list[int]) -> None:
    """Sums that are not one contiguous int32 word per element (a strided view, as (n, 1) and
    flat), and exponents whose ``E - P`` leaves float32's range (the float64 decoding), are not
    the native kernel's: the torch path's values, the exact oracle's."""
    n, world = 5000, 2
    sums, exps = _case(3, n, world)
    strided = torch.stack([sums.reshape(-1), torch.full((n,), 12345, dtype=torch.int32)], 1)[:, :1]
    for view in (strided, strided.reshape(-1)):
        assert not view.is_contiguous()
        out, union = _decode(torch.full((n,), -0.0), view, exps, world, True)
        assert _bits(out) == _bits(_exact(sums, exps, world)) and union == int(torch.count_nonzero(sums))
        torch_out, _ = _torch_decode(torch.full((n,), -0.0), view, exps, world, True)
        assert _bits(out) == _bits(torch_out)
    far = exps.clone()
    far[0] = -120  # E - P = -150: below float32's normal range (a subnormal result)
    small = sums.clone()
    small[:BLOCK] = torch.arange(-BLOCK // 2, BLOCK // 2, dtype=torch.int32).reshape(-1, 1)
    assert _host_factors.decode_factors32_kept(far.numpy(), _fixedpoint.precision_bits(world)) is None
    out, _ = _decode(torch.full((n,), -0.0), small, far, world, False)
    assert _bits(out) == _bits(_exact(small, far, world))
    assert native_calls == []
    torch_out, _ = _torch_decode(torch.full((n,), -0.0), small, far, world, False)
    assert _bits(torch_out) == _bits(out)


def test_kept_decode_factors_equal_fresh_ones_whatever_the_order() -> None:
    """Kept decode factors equal :func:`decode_factors32` bit for bit (None where it gives None) when
    exponent sets, dtypes and precisions alternate and outnumber what is kept; the address is the
    kept array's and the array is read-only."""
    g = np.random.default_rng(5)
    sets = [g.integers(-30, 10, 64).astype(np.int32) for _ in range(6)]
    sets += [np.array([3, EMPTY, -2], dtype=np.int32), np.array([3, EMPTY, -2], dtype=np.int64),
             np.array([-200, 0], dtype=np.int32), np.zeros(0, dtype=np.int32)]
    precisions = [30, 29, 28]
    order = [(i, p) for _ in range(2) for i in range(len(sets)) for p in precisions]
    for i, p in order + order[::-1]:
        e = sets[i].copy()  # a new array of the same values: kept by value
        kept = _host_factors.decode_factors32_kept(e, p)
        fresh = _host_factors.decode_factors32(e, p)
        if fresh is None:
            assert kept is None, (i, p)
            continue
        assert kept is not None
        factor, address = kept
        assert factor.tobytes() == fresh.tobytes() and factor.dtype == np.float32, (i, p)
        assert address == factor.ctypes.data
        assert _host_factors.decode_factors32_kept(e.copy(), p)[0] is factor  # kept: the same array again
        with pytest.raises(ValueError):
            factor[:1] = 0  # a writer cannot change a later call's factors
    assert len(_host_factors._KEPT_DECODE) <= _host_factors._KEEP


@needs_native
def test_address_kernel_checks_the_factor_count() -> None:
    sums = np.arange(10, dtype=np.int32)
    out = np.full(10, -1.0, dtype=np.float32)
    factor = np.array([0.5, 2.0], dtype=np.float32)
    with pytest.raises(ValueError):
        _native.dequantize32_at(sums.ctypes.data, out.ctypes.data, 10, 4, factor.ctypes.data, 2)  # 3 blocks
    assert _native.dequantize32_at(sums.ctypes.data, out.ctypes.data, 10, 5, factor.ctypes.data, 2) == 9
    assert out.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 10.0, 12.0, 14.0, 16.0, 18.0]
    assert _native.dequantize32_at(0, 0, 0, 5, 0, 0) == 0


@needs_native
@pytest.mark.parametrize("world", [2, 4])
def test_steady_inplace_all_reduce_equals_the_torch_path(world: int, native_calls: list[int],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole in-place dense calls (a first call, then steady ones under the kept factors): every
    rank's result equals, bit for bit, the same calls with the native kernels off (the torch
    decode); elements that cancel are +0.0 though every input held -0.0 or x and -x there."""
    n = 3 * BLOCK + 100
    g = torch.Generator().manual_seed(world)
    base = [torch.randn(n, generator=g) * (1 + r) for r in range(world)]
    for t in base:
        t[:50] = -0.0
    base[0][50:90] = 1.5
    base[1][50:90] = -1.5
    for t in base[2:]:
        t[50:90] = 0.0

    def run() -> list[list[torch.Tensor]]:
        switch = InProcessSwitch(world)
        histories = [History() for _ in range(world)]

        def rank(r: int) -> list[torch.Tensor]:
            outs = []
            for _ in range(4):
                x = base[r].clone()
                out = homagg.allreduce(x, switch.port(r), scheme="dense", history=histories[r], key="d", inplace=True)
                assert out is x
                outs.append(out.clone())
            return outs

        return on_threads(rank, world)

    got = run()
    assert len(native_calls) == 4 * world, "a call's decode did not take the native kernel"
    monkeypatch.setattr(_native, "AVAILABLE", False)  # the torch path, the whole call (every device tensor's)
    want = run()
    assert len(native_calls) == 4 * world
    for rank_got, rank_want in zip(got, want, strict=True):
        for a, b in zip(rank_got, rank_want, strict=True):
            assert _bits(a) == _bits(b)
            assert set(a[:90].view(torch.int32).tolist()) == {0}
