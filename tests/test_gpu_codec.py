"""The codec on device tensors: bit for bit the CPU's results, on the input's device, in place.

Oracle: the same inputs as CPU tensors through the same in-process switch (the CPU path: native
kernels and numpy views where built), and for floats README's error bound against the float64 sum.
Each test runs on two devices:

* ``cuda`` (marker ``gpu``): CUDA tensors, the path a GPU rank takes;
* ``cpu-device-path``: CPU tensors through the code CUDA tensors take (no native kernels, no numpy:
  :func:`homagg.bench._syncs.device_paths`), so the torch code a GPU runs is checked here too.

The synchronisation tests count host reads of device tensors (:class:`~homagg.bench._syncs.HostReads`
on the CPU, the CUDA runtime's sync-debug warnings on a GPU) in a steady-state call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

import homagg
from homagg.bench._syncs import HostReads, cuda_syncs, device_paths
from homagg.codec import _hostops, _native, _protocol
from homagg.codec._pipeline import HOST_SEGMENT
from homagg.testing import check_within_bound, local_allreduce, on_threads, run_local, sparse_tensors
from homagg.transport import InProcessSwitch

SCHEMES = homagg.SCHEMES
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64)
WORLD = 3
N = 40_000  # not a multiple of the block size: a partial last block


@pytest.fixture(params=["cpu-device-path", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Where the tensors live (``cpu-device-path``: the CPU, through the code CUDA tensors take).
    A CUDA tensor of at most ``_mid.MAX_ELEMENTS`` runs on a host copy (``tests/test_gpu_staging.py``);
    here every size takes the device path, the code under test."""
    if request.param == "cuda":
        monkeypatch.setattr(_protocol, "_stages_on_host", lambda tensor: False)
        yield "cuda"
        return
    with device_paths():
        yield "cpu"


def inputs(density: float, dtype: torch.dtype, seed: int = 3, numel: int = N) -> list[torch.Tensor]:
    """Per-worker inputs with a wide dynamic range (floats), or integers in ``[-1000, 1000]``."""
    return sparse_tensors(WORLD, numel, density, seed=seed, dtype=dtype, spread=2.0)


def on(device: str, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [x.to(device) for x in xs]


#: the CPU path's switches, read at import (before any test patches them)
_CPU_PATH = (_native.AVAILABLE, _native.FILL_QUANTIZE32, _hostops._host, _hostops.reads_free)


@contextlib.contextmanager
def host_path() -> Iterator[None]:
    """The CPU reference's code path, also inside a ``cpu-device-path`` test."""
    saved = (_native.AVAILABLE, _native.FILL_QUANTIZE32, _hostops._host, _hostops.reads_free)
    _native.AVAILABLE, _native.FILL_QUANTIZE32, _hostops._host, _hostops.reads_free = _CPU_PATH
    try:
        yield
    finally:
        _native.AVAILABLE, _native.FILL_QUANTIZE32, _hostops._host, _hostops.reads_free = saved


def cpu_reference(xs: Sequence[torch.Tensor], scheme: str, **options: Any) -> torch.Tensor:
    with host_path():
        return local_allreduce([x.cpu() for x in xs], scheme, **options)[0]


def assert_same(got: Sequence[torch.Tensor], want: torch.Tensor, device: str) -> None:
    for r, g in enumerate(got):
        assert g.device.type == torch.device(device).type, f"worker {r}: result on {g.device}"
        assert g.dtype == want.dtype and g.shape == want.shape
        assert torch.equal(g.cpu(), want), f"worker {r}: {int((g.cpu() != want).sum())} elements differ from the CPU"


@pytest.mark.parametrize("density", [0.02, 1.0])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_first_call_is_the_cpu_result(device: str, scheme: str, dtype: torch.dtype, density: float) -> None:
    xs = inputs(density, dtype)
    want = cpu_reference(xs, scheme)
    got = local_allreduce(on(device, xs), scheme)
    assert_same(got, want, device)
    if dtype.is_floating_point:
        check_within_bound(want, xs)
    else:
        assert torch.equal(want, torch.stack([x.to(torch.int64) for x in xs]).sum(0).to(dtype))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_in_place_result_lands_in_the_input(device: str, scheme: str) -> None:
    xs = inputs(0.05, torch.float32)
    want = cpu_reference(xs, scheme)
    targets = on(device, xs)
    ptrs = [t.data_ptr() for t in targets]
    got = local_allreduce(targets, scheme, inplace=True)
    for r in range(WORLD):
        assert got[r] is targets[r] and targets[r].data_ptr() == ptrs[r]
    assert_same(got, want, device)


def steady_calls(calls: Sequence[Sequence[torch.Tensor]], scheme: str, **options: Any) -> list[list[torch.Tensor]]:
    """Every worker runs the calls in order with its own :class:`homagg.History` (one key): the
    first agrees exponents, the later ones guess from the previous call (steady state)."""
    world = len(calls[0])
    switch = InProcessSwitch(world, timeout=60)

    def work(rank: int) -> list[torch.Tensor]:
        try:
            history, port = homagg.History(), switch.port(rank)
            return [homagg.allreduce(xs[rank], port, scheme=scheme, history=history, key="grad", **options)
                    for xs in calls]
        except BaseException as exc:
            switch.fail(exc)  # the other workers stop waiting for this one
            raise

    per_rank = on_threads(work, world, timeout=120)
    return [[per_rank[r][c] for r in range(world)] for c in range(len(calls))]


def drifting_calls(dtype: torch.dtype, density: float) -> list[list[torch.Tensor]]:
    """Four calls: a base input, the same scaled by 1.5 (drift inside the guess window), by 300
    (exponents leave it: redo rounds) and a new support (moving nonzeros)."""
    base = inputs(density, dtype)
    moved = inputs(density, dtype, seed=11)
    scale = [1.0, 1.5, 300.0] if dtype.is_floating_point else [1, 2, 3]
    return [[(x * s).to(dtype) for x in base] for s in scale] + [moved]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_steady_state_calls_are_the_cpu_results(device: str, scheme: str, dtype: torch.dtype) -> None:
    calls = drifting_calls(dtype, 0.03)
    with host_path():
        want = steady_calls(calls, scheme)
    got = steady_calls([on(device, xs) for xs in calls], scheme)
    for g, w in zip(got, want, strict=True):
        assert all(torch.equal(x, w[0]) for x in w)
        assert_same(g, w[0], device)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_segments_are_the_cpu_result(device: str, scheme: str) -> None:
    xs = inputs(0.05, torch.float32, numel=70_001)
    want = cpu_reference(xs, scheme, segment=16 * 1024)
    assert torch.equal(want, cpu_reference(xs, scheme, segment=0))
    got = local_allreduce(on(device, xs), scheme, segment=16 * 1024)
    assert_same(got, want, device)


@pytest.mark.parametrize("scheme", ["compact", "sketch", "auto"])
def test_sparse_coo_input_is_the_cpu_result(device: str, scheme: str) -> None:
    rows = sparse_tensors(WORLD, (500, 8), 0.04, seed=5)
    xs = [r.to_sparse() for r in rows]
    with host_path():
        want = local_allreduce(xs, scheme)[0]
    got = local_allreduce([x.to(device) for x in xs], scheme)
    for g in got:
        assert g.layout == torch.sparse_coo and g.device.type == torch.device(device).type
        assert torch.equal(g.cpu().to_dense(), want.to_dense())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_non_finite_device_input_raises_before_sending(device: str, scheme: str) -> None:
    xs = on(device, inputs(0.05, torch.float32))
    xs[1][77] = float("nan")
    with pytest.raises(homagg.NonFiniteError):
        local_allreduce(xs, scheme, timeout=5)


# --------------------------------------------------------------------------- synchronisations
@contextlib.contextmanager
def counted(device: str) -> Iterator[Any]:
    """Host reads of device tensors on worker 0's thread (``.total``; ``.sites`` names the lines)."""
    if device == "cuda":
        with cuda_syncs() as found:
            yield found
        return
    with HostReads() as reads:
        yield reads


def _total(found: Any) -> int:
    return found.count if hasattr(found, "count") else found.total


#: host reads allowed per steady-state call (:func:`steady_syncs`), by scheme and bitmap levels
STEADY_SYNCS = {("dense", None): 2, ("compact", 1): 2, ("compact", 2): 3}


def steady_syncs(device: str, scheme: str, numel: int, **options: Any) -> tuple[int, Any]:
    """Host reads of worker 0's third call of a one-worker job (one key, inputs drifting inside the
    guess window): the steady state of a training loop."""
    xs = [x.to(device) for x in sparse_tensors(1, numel, 0.01, seed=4)]
    switch = InProcessSwitch(1, timeout=30)
    history, port = homagg.History(), switch.port(0)
    for scale in (1.0, 1.25):
        homagg.allreduce(xs[0] * scale, port, scheme=scheme, history=history, key="g", **options)
    x = xs[0] * 1.5
    with counted(device) as found:
        homagg.allreduce(x, port, scheme=scheme, history=history, key="g", inplace=True, **options)
    return _total(found), found.sites


@pytest.mark.parametrize(("scheme", "levels"), sorted(STEADY_SYNCS, key=str))
def test_steady_state_call_synchronises_at_most_twice(device: str, scheme: str, levels: int | None) -> None:
    options = {} if levels is None else {"bitmap_levels": levels}
    count, sites = steady_syncs(device, scheme, 300_000, **options)
    assert count <= STEADY_SYNCS[(scheme, levels)], f"{count} host reads: {dict(sites)}"


def test_a_large_device_tensor_is_one_segment_by_default(device: str) -> None:
    """Above the CPU's segment size a device tensor still takes two host reads per steady call:
    it is not cut into segments (each would read twice), unless ``segment`` says so."""
    count, sites = steady_syncs(device, "dense", HOST_SEGMENT + 4096)
    assert count <= 2, f"{count} host reads: {dict(sites)}"
    run = run_local([x.to(device) for x in sparse_tensors(2, HOST_SEGMENT + 4096, 0.001, seed=2)], "dense")
    assert run.stats[0].segments == 0
