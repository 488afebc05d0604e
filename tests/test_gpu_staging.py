"""A CUDA tensor of more than one block and at most ``_mid.MAX_ELEMENTS`` runs its call on a host
copy (``homagg.codec._protocol._stages_on_host``): one transfer there and one back, the host path's
round (the mid-size path's in steady state), the result in the input's memory.  So does one of at
most one block of float32, float64 or an integer dtype on the small-call path
(``homagg.codec._small``: the C kernels in the port's own arrays in steady state).

Oracle: the same calls on CPU tensors (the host path), bit for bit, and the float64 sum within
README's bound; the CUDA runtime's sync-debug warnings count a steady call's synchronisations.
"""

from __future__ import annotations

import pytest
import torch

import homagg
import switch_emulator
from homagg.bench._syncs import cuda_syncs
from homagg.codec import _mid, _protocol
from homagg.testing import check_within_bound, on_threads, sparse_tensors
from homagg.transport import ControlClient, InProcessSwitch
from tests.test_transport_small_rounds import _close, _ports

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")]
WORLD = 2


def _calls(numel: int, dtype: torch.dtype) -> list[list[torch.Tensor]]:
    """Five calls per worker: a base input, drifts inside the guess window, a jump out of it."""
    base = sparse_tensors(WORLD, numel, 1.0, seed=numel, dtype=dtype, spread=2.0)
    scales = [1.0, 1.25, 1.5, 300.0, 300.0] if dtype.is_floating_point else [1, 2, 3, 4, 5]
    return [[(x * s).to(dtype) for x in base] for s in scales]


def _run(calls: list[list[torch.Tensor]], device: str, inplace: bool) -> list[list[torch.Tensor]]:
    """Each worker's results of the calls in order (one history, one key), on ``device``."""
    switch = InProcessSwitch(WORLD, timeout=60)

    def work(rank: int) -> list[torch.Tensor]:
        history, port, out = homagg.History(), switch.port(rank), []
        for xs in calls:
            x = xs[rank].to(device, copy=True)  # the inputs stay as they are (in place writes a copy)
            ptr = x.data_ptr()
            got = homagg.allreduce(x, port, history=history, key="g", inplace=inplace)
            assert got.device.type == device and got.dtype == x.dtype and got.shape == x.shape
            assert (got is x and x.data_ptr() == ptr) if inplace else got is not x
            out.append(got.cpu())
        return out

    return on_threads(work, WORLD, timeout=120)


@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize(("numel", "dtype"), [(5000, torch.float32), (_mid.MAX_ELEMENTS, torch.float32),
                                               (70_001, torch.bfloat16), (3000, torch.int64),
                                               (1, torch.float32), (7, torch.float64), (1024, torch.float32),
                                               (1, torch.int32), (3, torch.int64), (2, torch.bfloat16)], ids=str)
def test_staged_calls_are_the_host_results(numel: int, dtype: torch.dtype, inplace: bool) -> None:
    calls = _calls(numel, dtype)
    want = _run(calls, "cpu", inplace)
    got = _run(calls, "cuda", inplace)
    for c, xs in enumerate(calls):
        for r in range(WORLD):
            assert torch.equal(got[r][c], want[r][c]), (c, r)
        if dtype.is_floating_point and c == 0:  # a first call's bound (steady ones may sum on a coarser grid)
            check_within_bound(want[0][c], xs)


@pytest.mark.parametrize("inplace", [True, False])
def test_a_staged_steady_call_synchronises_twice(inplace: bool) -> None:
    """A one-worker job's third call (the CUDA runtime's sync warnings are per process, so one
    worker): the copy to the host, and the copy back from pageable memory."""
    results = []
    for device in ("cpu", "cuda"):  # the host path's results, then the staged call's
        x = torch.randn(65_536, generator=torch.Generator().manual_seed(5)).to(device)
        switch = InProcessSwitch(1, timeout=60)
        history, port = homagg.History(), switch.port(0)
        for scale in (1.0, 1.25):
            homagg.allreduce(x * scale, port, history=history, key="g", inplace=True)
        y = x * 1.5
        if device == "cuda":
            torch.cuda.synchronize()
            with cuda_syncs() as found:
                got = homagg.allreduce(y, port, history=history, key="g", inplace=inplace)
            assert found.count <= 2, dict(found.sites)
        else:
            got = homagg.allreduce(y, port, history=history, key="g", inplace=inplace)
        results.append(got.cpu())
    assert torch.equal(results[0], results[1])


def test_a_leaf_that_requires_grad_is_summed_in_place() -> None:
    """``dist.all_reduce(param)`` on a CUDA parameter: the sum lands in its memory (the device
    path writes through a detached view; the host copy's result likewise)."""
    x = torch.randn(5000, device="cuda", requires_grad=True)
    want = x.detach().cpu().clone()
    ptr = x.data_ptr()
    switch = InProcessSwitch(1, timeout=60)
    got = homagg.allreduce(x, switch.port(0), inplace=True)
    assert got is x and x.data_ptr() == ptr and x.requires_grad
    host = homagg.allreduce(want.clone(), InProcessSwitch(1, timeout=60).port(0), inplace=True)
    assert torch.equal(x.detach().cpu(), host)


def test_only_sizes_up_to_the_limit_are_staged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``MAX_ELEMENTS`` (and at one block: the small path's own copy) the call keeps its
    device: the codec's general path gets the CUDA tensor itself."""
    seen: list[str] = []
    real = _protocol._allreduce

    def recorded(tensor: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        seen.append(tensor.device.type)
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(_protocol, "_allreduce", recorded)
    switch = InProcessSwitch(1, timeout=60)
    for n, where in ((_mid.MAX_ELEMENTS + 1, "cuda"), (_mid.MAX_ELEMENTS, "cpu"), (1025, "cpu")):
        x = torch.arange(n, dtype=torch.float32, device="cuda")
        got = homagg.allreduce(x, switch.port(0))
        assert torch.equal(got.cpu(), torch.arange(n, dtype=torch.float32)) and seen[-1] == where, (n, seen)


def _udp_run(switch, calls: list[list[torch.Tensor]], device: str) -> list[list[torch.Tensor]]:
    """:func:`_run` in place through UDP ports of the emulator (own arrays: the small path's kernels)."""
    job, ports = _ports(switch, WORLD, True, k=64, slots=4)

    def work(rank: int) -> list[torch.Tensor]:
        history, out = homagg.History(), []
        for xs in calls:
            x = xs[rank].to(device, copy=True)
            homagg.allreduce(x, ports[rank], history=history, key="g", inplace=True)
            out.append(x.cpu())
        return out

    try:
        return on_threads(work, WORLD, timeout=120)
    finally:
        _close(ports)
        ControlClient(switch.control_addr).remove(job.job_id)


@pytest.mark.parametrize(("numel", "dtype"), [(1, torch.float32), (9, torch.float64), (1, torch.int64)], ids=str)
def test_small_device_calls_through_udp_ports_are_the_host_calls(numel: int, dtype: torch.dtype) -> None:
    """Steady small calls of CUDA tensors on ports with own arrays (the C kernels on the host
    copy): the CPU tensors' results, bit for bit."""
    calls = _calls(numel, dtype)
    with switch_emulator.start() as switch:
        want = _udp_run(switch, calls, "cpu")
        got = _udp_run(switch, calls, "cuda")
    for c in range(len(calls)):
        for r in range(WORLD):
            assert torch.equal(got[r][c], want[r][c]), (c, r)


def test_a_small_staged_steady_call_synchronises_twice() -> None:
    """One element, a one-worker job through a UDP port, its third call: the copy to the host and
    the copy back, nothing else (the small path used to read the values and write the result
    through torch on the device)."""
    with switch_emulator.start() as switch:
        job, ports = _ports(switch, 1, True, k=64, slots=4)
        try:
            history = homagg.History()
            x = torch.tensor([3.0], device="cuda")
            for scale in (1.0, 1.25):
                homagg.allreduce(x * scale, ports[0], history=history, key="g", inplace=True)
            y = x * 1.5
            torch.cuda.synchronize()
            with cuda_syncs() as found:
                homagg.allreduce(y, ports[0], history=history, key="g", inplace=True)
            assert found.count <= 2, dict(found.sites)
            assert y.item() == 4.5
        finally:
            _close(ports)
            ControlClient(switch.control_addr).remove(job.job_id)
