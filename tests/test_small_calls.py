"""The small-call path (homagg/codec/_small.py) against the general path and the exact sums.

Every test runs the same sequence of calls (one History per worker, so later calls are steady:
guesses, windows, redos) once with ``small_calls=True`` and once with ``small_calls=False`` (the
general path) through in-process switches, and asserts the results bit for bit equal (the raw
bits: -0.0, inf and every rounding count), plus the rounds each call took and the history each
worker recorded.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

import homagg
from homagg.codec import History, WorkerStats
from homagg.codec import _small
from homagg.codec._config import CodecConfig
from homagg.testing import on_threads
from homagg.transport import InProcessSwitch

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8]
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}


def _run(calls: list[list[torch.Tensor]], small: bool, scheme: str = "auto", **options: object):
    """Each worker's results, stats and history after ``calls`` (one list of W tensors per call)."""
    world = len(calls[0])
    switch = InProcessSwitch(world, timeout=60.0)
    histories = [History() for _ in range(world)]
    stats = [[WorkerStats() for _ in calls] for _ in range(world)]

    def rank(r: int) -> list[torch.Tensor]:
        port = switch.port(r)
        # every other call in place (the result written into the input: numpy's view or torch's copy)
        return [homagg.codec.allreduce(call[r].clone(), port, scheme=scheme, stats=stats[r][i], inplace=i % 2 == 0,
                                       history=histories[r], small_calls=small, **options)
                for i, call in enumerate(calls)]

    return on_threads(rank, world), stats, histories


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_BITS[t.dtype]) if t.dtype in _BITS else t


def _assert_same_as_general(calls: list[list[torch.Tensor]], scheme: str = "auto", **options: object) -> None:
    fast, fast_stats, fast_hist = _run(calls, True, scheme, **options)
    slow, slow_stats, slow_hist = _run(calls, False, scheme, **options)
    for r in range(len(calls[0])):
        for i, (a, b) in enumerate(zip(fast[r], slow[r], strict=True)):
            assert a.dtype == b.dtype and a.shape == b.shape
            # signed zeros too: every scheme writes +0.0 where a sum is zero (tests/test_signed_zeros.py)
            assert torch.equal(_bits(a), _bits(b)), (r, i, a, b)
            assert fast_stats[r][i].schemes["dense"] == 1
            assert fast_stats[r][i].redos == slow_stats[r][i].redos, (r, i)
            if scheme == "dense":  # auto: the general path spends a union estimate on first calls
                assert fast_stats[r][i].rounds == slow_stats[r][i].rounds, (r, i)
    if scheme == "dense":  # auto's general path records a sketch's union instead (not a result)
        for hf, hs in zip(fast_hist, slow_hist, strict=True):
            for key, rec in hs._entries.items():
                mine = hf._entries[key]
                assert (mine.exponents is None) == (rec.exponents is None)
                if rec.exponents is not None:
                    assert torch.equal(mine.exponents, rec.exponents)
                assert (mine.union, mine.changed, mine.changed_before) == (rec.union, rec.changed, rec.changed_before)


def _values(gen: torch.Generator, n: int, dtype: torch.dtype, scale: float) -> torch.Tensor:
    x = torch.randn(n, generator=gen, dtype=torch.float64) * scale
    kind = int(torch.randint(0, 6, (1,), generator=gen))
    if kind == 1:
        x[torch.rand(n, generator=gen) < 0.5] = 0.0  # some zeros
    elif kind == 2:
        x.zero_()  # a worker holding nothing
    elif kind == 3 and n > 1:
        x[0] = -0.0
        x[-1] = x[-1] * 1e-3
    return x.to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("scheme", ["auto", "dense"])
def test_float_sequences_are_bit_identical_to_the_general_path(dtype: torch.dtype, world: int, scheme: str) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{dtype}{world}{scheme}".encode()))
    for n in (1, 3, 1000):
        scale = 1.0
        calls = []
        for step in range(9):
            # drift inside the guess window, then a jump beyond it, then back: guesses, redos, agreements
            scale *= (1.3, 0.8, 1.1, 2.0**9, 1.0, 2.0**-12, 1.5, 0.9, 1.0)[step]
            calls.append([_values(gen, n, dtype, scale) for _ in range(world)])
        _assert_same_as_general(calls, scheme)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_magnitudes_are_bit_identical(dtype: torch.dtype) -> None:
    info = torch.finfo(dtype)
    tiny, huge = info.smallest_normal / 2**10, info.max / 64  # subnormal inputs; sums near the top
    calls = [[torch.tensor([tiny, -tiny * 3, 0.0], dtype=dtype), torch.tensor([tiny * 5, 0.0, -0.0], dtype=dtype)],
             [torch.tensor([huge, -huge, 1.0], dtype=dtype), torch.tensor([huge, huge / 3, 2.0], dtype=dtype)],
             [torch.tensor([huge * 8, 1.0, 0.0], dtype=dtype), torch.tensor([huge * 8, 0.0, 0.0], dtype=dtype)],
             [torch.tensor([1e-30, 0.0, 1.0], dtype=dtype), torch.tensor([0.0, 0.0, 0.0], dtype=dtype)]]
    _assert_same_as_general(calls, "dense")
    _assert_same_as_general(calls, "auto")


@pytest.mark.parametrize("precision", ["wide", "single"])
@pytest.mark.parametrize("guess_window", [True, False])
def test_wide_words_and_no_window_are_bit_identical(precision: str, guess_window: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    calls = [[_values(gen, 17, torch.float32, s) for _ in range(3)] for s in (1.0, 1.2, 3.0, 3.1, 40.0)]
    _assert_same_as_general(calls, "dense", precision=precision, guess_window=guess_window)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("world", [1, 2, 4])
def test_integers_are_exact_and_identical(dtype: torch.dtype, world: int) -> None:
    gen = torch.Generator().manual_seed(world)
    info = torch.iinfo(dtype)
    span = min(info.max, 2**40) // (world + 1)
    low = 0 if dtype == torch.uint8 else -span
    calls = [[torch.randint(low, span, (n,), generator=gen, dtype=torch.int64).to(dtype) for _ in range(world)]
             for n in (1, 5, 1024, 5)]
    _assert_same_as_general(calls, "auto")
    _assert_same_as_general(calls, "dense")
    results, _, _ = _run(calls, True)
    for i, call in enumerate(calls):
        exact = sum(t.to(torch.int64) for t in call)
        assert torch.equal(results[0][i].to(torch.int64), exact)


@pytest.mark.parametrize(("dtype", "value"), [(torch.int32, 2**31 - 1), (torch.int16, 2**14), (torch.int64, 2**62)])
def test_integer_overflow_raises_the_same_error_on_both_paths(dtype: torch.dtype, value: int) -> None:
    big = torch.tensor([value], dtype=dtype)
    messages = []
    for small in (True, False):
        with pytest.raises(homagg.IntegerOverflowError, match=f"does not fit {dtype}") as err:
            _run([[big, big]], small)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_non_finite_input_raises_before_sending() -> None:
    switch = InProcessSwitch(1, timeout=5.0)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(homagg.NonFiniteError, match=r"input holds 2 non-finite value\(s\); nothing was sent"):
            homagg.codec.allreduce(torch.tensor([1.0, bad, bad]), switch.port(0))


def test_exact_against_float64_where_the_grid_holds_the_values() -> None:
    xs = [torch.tensor([0.5, -3.0, 1024.0, 0.0]), torch.tensor([0.25, 1.0, 1.0, -0.0]), torch.tensor([1.0, 1.0, 0.0, 0.0])]
    results, _, _ = _run([xs], True)
    assert torch.equal(results[0][0], torch.tensor([1.75, -1.0, 1025.0, 0.0]))


def test_inplace_noncontiguous_and_shapes() -> None:
    switch = InProcessSwitch(2, timeout=10.0)
    base = [torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1) for r in range(2)]
    views = [b.t() for b in base]  # non-contiguous

    def rank(r: int) -> torch.Tensor:
        return homagg.codec.allreduce(views[r], switch.port(r), inplace=True)

    out = on_threads(rank, 2)
    expect = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * 3
    assert out[0] is views[0] and torch.equal(views[0], expect) and torch.equal(base[1], expect.t())
    scalar = on_threads(lambda r: homagg.codec.allreduce(torch.tensor(float(r + 1)), switch.port(r)), 2)
    assert scalar[0].shape == () and float(scalar[0]) == 3.0


def test_which_calls_take_the_small_path() -> None:
    cfg = CodecConfig()
    assert _small.takes(torch.ones(1024), "auto", cfg, 4) and _small.takes(torch.ones(3), "dense", cfg, 4)
    assert not _small.takes(torch.ones(1025), "auto", cfg, 4)  # two blocks
    assert not _small.takes(torch.ones(3), "sketch", cfg, 4) and not _small.takes(torch.ones(3), "compact", cfg, 4)
    assert not _small.takes(torch.ones(0), "auto", cfg, 4)
    assert not _small.takes(torch.ones(3).to_sparse(), "auto", cfg, 4)
    assert not _small.takes(torch.ones(3), "auto", CodecConfig(small_calls=False), 4)
    # a cost model that could pick compact for this size keeps auto on the general path
    assert not _small.takes(torch.ones(1024), "auto", CodecConfig(rtt_us=0.0, bandwidth_gbps=0.001), 4)


def test_a_steady_small_call_takes_one_round_and_a_first_float_call_two() -> None:
    gen = torch.Generator().manual_seed(3)
    calls = [[torch.randn(1, generator=gen) for _ in range(2)] for _ in range(3)]
    _, stats, _ = _run(calls, True)
    assert [s.rounds for s in stats[0]] == [2, 1, 1]
    _, slow, _ = _run(calls, False)
    assert [s.rounds for s in slow[0]] == [2, 1, 1]
    ints = [[torch.tensor([r], dtype=torch.int64) for r in range(2)]] * 2
    _, stats, _ = _run(ints, True)
    assert [s.rounds for s in stats[0]] == [1, 1]  # the general path's auto spends a union estimate first
