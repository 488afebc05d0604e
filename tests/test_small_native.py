"""The steady small call's encode and decode in C (``homagg/codec/_small_kernels.c``) against the
Python arithmetic they replace (:mod:`homagg.codec._small_grid`), bit for bit:

* the kernels alone, on random values of every magnitude (zeros, -0.0, subnormals, values the clamp
  cuts), one and two words per value, float32 and float64, with and without a previous exponent,
  and the non-finite inputs they refuse;
* whole steady calls through UDP ports on the emulator (whose own arrays the kernels use), run once
  with the kernels and once with the Python arithmetic (the same sequence: guesses, windows, redos),
  results, statistics and histories equal.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import switch_emulator
from homagg.codec import History, WorkerStats
from homagg.codec import _small, _small_native
from homagg.codec._config import CodecConfig
from homagg.codec._small_grid import EMPTY, decode, grid, local_exponent, quantize
from homagg.testing import on_threads
from homagg.transport import ControlClient
from homagg.transport._fastpath import AVAILABLE as DATAPATH
from tests.test_transport_small_rounds import _close, _ports

pytestmark = pytest.mark.skipif(not _small_native.AVAILABLE, reason="the codec's native kernels were not built")
_DESCRIPTOR_LENGTH = 18
_NP = {torch.float32: np.float32, torch.float64: np.float64}


def _values(rng: np.random.Generator, n: int, dtype: torch.dtype) -> np.ndarray:
    top = 300 if dtype == torch.float64 else 36  # every magnitude the dtype holds
    x = rng.standard_normal(n) * 10.0 ** rng.integers(-top, top, n).astype(np.float64)
    pick = rng.random(n)
    x[pick < 0.15] = 0.0
    x[(pick >= 0.15) & (pick < 0.2)] = -0.0
    if dtype == torch.float64:
        x[(pick >= 0.2) & (pick < 0.25)] = 5e-324 * rng.integers(1, 1000)  # subnormal
    else:
        x[(pick >= 0.2) & (pick < 0.25)] = 1e-45 * rng.integers(1, 100)
    return x.astype(_NP[dtype])


def _kernel(n: int, dtype: torch.dtype, world: int, limbs: int, window: bool):
    p, limit, slack = grid(world, limbs, dtype == torch.float64, window)
    head = np.arange(_DESCRIPTOR_LENGTH, dtype=np.int32) * 7 - 50
    kernel = _small_native.SmallKernel(n, limbs, dtype == torch.float64, p, limit, slack, slack // 2, head)
    return kernel, head, p, limit, slack


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("limbs", [1, 2])
def test_encode_and_decode_are_the_python_arithmetic(dtype: torch.dtype, limbs: int) -> None:
    rng = np.random.default_rng(3 * limbs + (dtype == torch.float64))
    for trial in range(300):
        n = int(rng.integers(1, 70))
        kernel, template, p, limit, slack = _kernel(n, dtype, int(rng.integers(1, 9)), limbs, trial % 5 != 0)
        x = _values(rng, n, dtype)
        if trial % 11 == 0:
            x[:] = 0
        values = x.astype(np.float64).tolist()
        previous = EMPTY if trial % 7 == 0 else int(rng.integers(-140, 140))
        head = np.zeros(_DESCRIPTOR_LENGTH, dtype=np.int32)
        words = np.zeros(n * limbs, dtype=np.int32)
        assert kernel.encode(x.ctypes.data, previous, head, words) == _small_native.ENCODED
        local = local_exponent(values)
        guess = EMPTY if local == EMPTY else max(previous if previous == EMPTY else previous + slack // 2, local)
        assert (kernel.local, kernel.guess) == (local, guess)
        np.testing.assert_array_equal(words, quantize(values, guess, p, limit, limbs))
        np.testing.assert_array_equal(head[:-2], template[:-2])
        assert head[-2:].tolist() == [local, EMPTY if guess == EMPTY else -guess]

        # decode: combined words of a few ranks (sums of such words), under an agreed exponent
        # inside the window, at its edges, or outside it (then REDO and nothing written)
        sums = sum(quantize((x * s).astype(np.float64).tolist(), guess, p, limit, limbs).astype(np.int64)
                   for s in (1.0, -0.5, 0.25)[: int(rng.integers(1, 4))]).astype(np.int32)
        agreed = EMPTY if guess == EMPTY else guess - int(rng.integers(-2, slack + 3))
        out_head = head.copy()
        out_head[-2] = agreed
        dst = np.full(n, 99.0, dtype=_NP[dtype])
        rc = kernel.decode(out_head, sums, dst.ctypes.data)
        assert kernel.agreed == agreed
        if agreed != EMPTY and not agreed <= guess <= agreed + slack:
            assert rc == _small_native.REDO and (dst == 99.0).all()
            continue
        assert rc == _small_native.DECODED
        want, union = decode(sums, guess if agreed != EMPTY else EMPTY, p, limbs, True)
        assert kernel.union == union
        np.testing.assert_array_equal(dst.view(np.int32 if dtype == torch.float32 else np.int64),
                                      np.array(want, dtype=_NP[dtype]).view(dst.view(np.int32 if dtype == torch.float32
                                                                                     else np.int64).dtype))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_input_is_refused_and_nothing_written(bad: float) -> None:
    kernel, _, _, _, _ = _kernel(4, torch.float32, 2, 1, True)
    x = np.array([1.0, bad, 2.0, bad], dtype=np.float32)
    head = np.full(_DESCRIPTOR_LENGTH, 5, dtype=np.int32)
    words = np.full(4, 5, dtype=np.int32)
    assert kernel.encode(x.ctypes.data, 3, head, words) == _small_native.NONFINITE
    assert (head == 5).all() and (words == 5).all()


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


def _placed(t: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``t``'s values as the tensor a call gets: ``flat``, ``matrix`` (2-D), ``scalar`` (0-d, one
    element), ``offset`` (a contiguous view 3 elements into a zeroed buffer: also returned)."""
    if layout == "matrix":
        return t.clone().reshape(1, -1), None
    if layout == "scalar":
        return t.clone().reshape(()), None
    if layout == "offset":
        buf = torch.zeros(t.numel() + 3, dtype=t.dtype)
        buf[3:] = t
        return buf[3:], buf
    return t.clone(), None


def _steady_calls(switch, world: int, dtype: torch.dtype, n: int, native: bool, scales: list[float],
                  precision: str, layout: str = "flat"
                  ) -> tuple[list[list[torch.Tensor]], list[list[WorkerStats]], list[History]]:
    """A sequence of in-place small calls (the scales move the exponent: steady guesses, windows,
    redos) on fresh UDP ports; the kernels on or off; the tensors laid out as :func:`_placed` says."""
    job, ports = _ports(switch, world, True, k=64, slots=4)
    cfg = CodecConfig(precision=precision)
    histories = [History() for _ in range(world)]
    stats = [[WorkerStats() for _ in scales] for _ in range(world)]
    gen = torch.Generator().manual_seed(world * 100 + n)
    inputs = [[(torch.randn(n, generator=gen, dtype=torch.float64) * s).to(dtype) for _ in range(world)]
              for s in scales]
    for call in inputs:
        for t in call:
            t[t.abs() < 0.3 * t.abs().max()] = 0.0  # some zero sums

    def rank(r: int) -> list[torch.Tensor]:
        out = []
        for i, call in enumerate(inputs):
            t, buf = _placed(call[r], layout)
            _small.allreduce(t, ports[r], "auto", cfg, stats[r][i], True, histories[r], None)
            if buf is not None:  # nothing written outside the view
                assert (buf[:3] == 0).all()
            out.append(t.reshape(-1).clone())
        return out

    kept = _small_native.AVAILABLE
    _small._steady.cache_clear()  # the kept signatures say whether the kernels run
    _small_native.AVAILABLE = native
    try:
        results = on_threads(rank, world)
        limbs = _small._steady(n, dtype, "auto", world, precision, cfg.guess_window).limbs
        for port in ports:  # the kernels ran where they were on: kept with the port's own arrays
            own = port.own_round(_small._OPS, (_DESCRIPTOR_LENGTH, n * limbs))
            assert [type(k) for k in own.kept.values()] == ([_small_native.SmallKernel] if native else [])
        return results, stats, histories
    finally:
        _small_native.AVAILABLE = kept
        _small._steady.cache_clear()
        _close(ports)
        # the job leaves the shared emulator: a later port that the OS gives a closed port's
        # address must not find that address still admitted
        ControlClient(switch.control_addr).remove(job.job_id)


@pytest.mark.skipif(not DATAPATH, reason="the native datapath was not built (no own arrays)")
@pytest.mark.parametrize(("dtype", "world", "n", "precision"), [
    (torch.float32, 2, 1, "auto"), (torch.float32, 3, 7, "auto"), (torch.float64, 2, 40, "auto"),
    (torch.float32, 2, 5, "wide"), (torch.float64, 4, 3, "wide")])
def test_steady_calls_with_the_kernels_are_the_python_calls(switch, dtype: torch.dtype, world: int, n: int,
                                                           precision: str) -> None:
    scales = [1.0, 1.0, 1.5, 0.9, 1e3, 1e3, 2e-3, 2e-3, 1.0, 0.0, 1.0, 1.0]  # jumps: windows missed, redone
    fast, fast_stats, fast_hist = _steady_calls(switch, world, dtype, n, True, scales, precision)
    slow, slow_stats, slow_hist = _steady_calls(switch, world, dtype, n, False, scales, precision)
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    for r in range(world):
        for i, (a, b) in enumerate(zip(fast[r], slow[r], strict=True)):
            assert torch.equal(a.view(bits), b.view(bits)), (r, i, a, b)
            assert (fast_stats[r][i].rounds, fast_stats[r][i].redos, dict(fast_stats[r][i].bytes_per_stream),
                    dict(fast_stats[r][i].schemes)) == (slow_stats[r][i].rounds, slow_stats[r][i].redos,
                                                        dict(slow_stats[r][i].bytes_per_stream),
                                                        dict(slow_stats[r][i].schemes)), (r, i)
        a_entries, b_entries = list(fast_hist[r]._entries.items()), list(slow_hist[r]._entries.items())
        assert [k for k, _ in a_entries] == [k for k, _ in b_entries]
        for (_, a), (_, b) in zip(a_entries, b_entries, strict=True):
            assert (a.union, a.changed, a.changed_before, a.local_nnz) == (b.union, b.changed, b.changed_before,
                                                                           b.local_nnz)
            assert torch.equal(a.exponents, b.exponents)
    assert sum(s.redos for s in fast_stats[0]) > 0  # the sequence did miss windows
    # and the exact sums (the grid holds these values: a float64 oracle)
    for i in range(len(scales)):
        for r in range(world):
            assert torch.equal(fast[r][i], fast[0][i])


@pytest.mark.skipif(not DATAPATH, reason="the native datapath was not built (no own arrays)")
@pytest.mark.parametrize(("layout", "n"), [("matrix", 6), ("scalar", 1), ("offset", 5)])
def test_kernels_read_and_write_the_tensors_own_memory(switch, layout: str, n: int) -> None:
    """A 2-D tensor, a 0-d one and a view into a larger buffer (its ``data_ptr`` is past the
    buffer's): the same results with and without the kernels, and nothing written outside."""
    scales = [1.0, 1.0, 40.0, 1.0, 1.0]
    fast, _, _ = _steady_calls(switch, 2, torch.float32, n, True, scales, "auto", layout)
    slow, _, _ = _steady_calls(switch, 2, torch.float32, n, False, scales, "auto", layout)
    for r in range(2):
        for a, b in zip(fast[r], slow[r], strict=True):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))
