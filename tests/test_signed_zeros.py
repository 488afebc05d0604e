"""Signed zeros: every scheme of the general path gives dense's bits, on every rank.

An element whose exact sum is zero is +0.0 in the result, whatever the signs of the zeros the
ranks held there: dense decodes every element's combined words (a zero sum decodes to +0.0), so
sketch and compact (and ``auto``, whichever it picks) must write +0.0 at an element outside the
union too, also in place, where the input's -0.0 would otherwise stay (and ranks holding -0.0
and +0.0 there would disagree bit for bit).  The oracle: each rank's raw bits equal every other
rank's and the dense scheme's (out of place, on the CPU's host path), and are +0.0 wherever the
exact sum is zero.  Each code path decodes: the CPU's native kernels, its numpy views without
them, the torch code a device tensor takes (on the CPU: :func:`homagg.bench._syncs.device_paths`)
and CUDA tensors (marker ``gpu``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

import homagg
from homagg.bench._syncs import device_paths
from homagg.codec import _native
from homagg.codec import History, WorkerStats
from homagg.codec._config import SCHEMES
from homagg.testing import exact_sum, on_threads
from homagg.transport import InProcessSwitch

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}
WORLD = 3
NUMEL = 5000  # several blocks (beyond the small path), block 2 (2048..3071) all zeros


def _inputs(dtype: torch.dtype, density: float, seed: int = 0) -> list[torch.Tensor]:
    """Per rank: zeros of random sign everywhere, nonzeros at a ``density`` of the elements outside
    block 2 (some shared by every rank), and a pair that cancels exactly (its sum is zero, inside
    the union)."""
    g = torch.Generator().manual_seed(seed)
    xs = []
    shared = torch.rand(NUMEL, generator=g) < density / 2
    for _ in range(WORLD):
        signs = torch.where(torch.rand(NUMEL, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        x = signs * 0.0  # -0.0 or +0.0
        hit = shared | (torch.rand(NUMEL, generator=g) < density / 2)
        hit[2048:3072] = False
        x[hit] = torch.randn(int(hit.sum()), generator=g, dtype=torch.float64)
        xs.append(x.to(dtype))
    xs[0][10], xs[1][10] = 1.5, -1.5  # an exact cancellation inside the union
    xs[2][10] = 0.0
    return xs


def _run(xs: list[torch.Tensor], scheme: str, inplace: bool, calls: int = 1,
         **options: object) -> list[tuple[torch.Tensor, WorkerStats]]:
    """Each rank's result and statistics of the last of ``calls`` calls on the same inputs (one
    History per rank: later calls are steady)."""
    switch = InProcessSwitch(len(xs), timeout=60.0)
    histories = [History() for _ in xs]

    def rank(r: int) -> tuple[torch.Tensor, WorkerStats]:
        out, stats = None, WorkerStats()
        for _ in range(calls):
            mine, stats = xs[r].clone(), WorkerStats()
            out = homagg.codec.allreduce(mine, switch.port(r), scheme=scheme, inplace=inplace, stats=stats,
                                         history=histories[r], **options)
            if inplace:
                assert out is mine
        assert out is not None
        return out, stats

    return on_threads(rank, len(xs))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().view(_BITS[t.dtype])


@contextlib.contextmanager
def _numpy_only() -> Iterator[None]:
    """The CPU's host path without the native kernels (numpy views and torch)."""
    saved = _native.AVAILABLE, _native.FILL_QUANTIZE32
    _native.AVAILABLE, _native.FILL_QUANTIZE32 = False, None
    try:
        yield
    finally:
        _native.AVAILABLE, _native.FILL_QUANTIZE32 = saved


PATHS = ["native", "numpy", "cpu-device-path", pytest.param("cuda", marks=pytest.mark.gpu)]


def _check(xs: list[torch.Tensor], scheme: str, inplace: bool, calls: int = 1, path: str = "native",
           **options: object) -> WorkerStats:
    """Assert every rank's bits (on ``path``) equal dense's (out of place, on the CPU's host path);
    return rank 0's statistics."""
    want = _run(xs, "dense", False, calls, **options)[0][0]
    zero = exact_sum(xs) == 0
    assert zero.any() and not torch.signbit(want[zero]).any()  # dense: +0.0 wherever the sum is zero
    if path == "cuda":
        xs = [x.cuda() for x in xs]
    with {"numpy": _numpy_only, "cpu-device-path": device_paths}.get(path, contextlib.nullcontext)():
        got = _run(xs, scheme, inplace, calls, **options)
    for r, (result, _) in enumerate(got):
        assert torch.equal(_bits(result), _bits(want)), (scheme, inplace, r, torch.nonzero(_bits(result) != _bits(want)))
    return got[0][1]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("inplace", [True, False])
def test_zero_sums_are_positive_zero_on_every_rank(dtype: torch.dtype, scheme: str, inplace: bool, path: str) -> None:
    _check(_inputs(dtype, 0.02), scheme, inplace, path=path)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("picks", ["sketch", "compact"])
def test_auto_gives_dense_bits_whichever_it_picks(dtype: torch.dtype, picks: str) -> None:
    """``auto``'s cost model steered to each sparse continuation (free peeling; free rounds and
    compact CPU)."""
    steer = {"sketch": {"peel_ns": 0.0}, "compact": {"rtt_us": 0.0, "compact_ns": 0.0, "peel_ns": 1e6}}[picks]
    stats = _check(_inputs(dtype, 0.02, seed=3), "auto", True, **steer)
    assert stats.schemes[picks] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_steady_calls_and_wide_words(dtype: torch.dtype, scheme: str) -> None:
    """A steady call (history: guesses; without a window, whose coarser grid differs by scheme by
    design) and two words per value decode their zeros alike."""
    xs = _inputs(dtype, 0.05, seed=1)
    _check(xs, scheme, True, calls=2, guess_window=False)
    _check(xs, scheme, True, precision="wide")


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("inplace", [True, False])
def test_segments_in_and_out_of_place(scheme: str, inplace: bool) -> None:
    """A segmented call (the pipeline writes every segment into the input, or into a copy of it
    out of place) and a two-level bitmap."""
    xs = _inputs(torch.float32, 0.01, seed=2)
    _check(xs, scheme, inplace, segment=2048)
    _check(xs, scheme, inplace, bitmap_levels=2)
