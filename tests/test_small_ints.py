"""Small integer calls in the port's own arrays (``homagg/codec/_small_ints.py``) against the
same calls through a port without them, bit for bit: the call sequences run on UDP ports of the
emulator (whose own arrays the steady integer call writes into, with no ``combine_arrays`` round)
and through the in-process switch on the small-call path's ``combine_arrays`` round (results,
statistics, histories equal) and on the general path (results and overflow errors equal); the exact
int64 sum as the oracle."""

from __future__ import annotations

import pytest
import torch

import homagg
import switch_emulator
from homagg.codec import History, WorkerStats
from homagg.codec import _small
from homagg.testing import on_threads
from homagg.transport import ControlClient, InProcessSwitch
from homagg.transport._fastpath import AVAILABLE as DATAPATH
from tests.test_transport_small_rounds import _close, _ports

pytestmark = pytest.mark.skipif(not DATAPATH, reason="the native datapath was not built (no own arrays)")
INTS = [torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8]


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


def _own(switch, calls: list[list[torch.Tensor]], monkeypatch: pytest.MonkeyPatch):
    """Each rank's results, stats and history on UDP ports, the small path on; ``int_call`` (the
    ``combine_arrays`` round) refuses to run, so every call went through the own arrays."""
    world = len(calls[0])
    job, ports = _ports(switch, world, True, k=64, slots=4)
    histories = [History() for _ in range(world)]
    stats = [[WorkerStats() for _ in calls] for _ in range(world)]

    def refuse(*_: object) -> None:
        raise AssertionError("an integer call took the combine_arrays round")

    monkeypatch.setattr(_small, "int_call", refuse)

    def rank(r: int) -> list[torch.Tensor]:
        out = []
        for i, call in enumerate(calls):
            t = call[r].clone()
            homagg.codec.allreduce(t, ports[r], stats=stats[r][i], inplace=True, history=histories[r])
            out.append(t)
        return out

    try:
        return on_threads(rank, world), stats, histories
    finally:
        monkeypatch.undo()
        _close(ports)
        ControlClient(switch.control_addr).remove(job.job_id)  # the job leaves the shared emulator


def _general(calls: list[list[torch.Tensor]], small: bool = False):
    """The same calls through the in-process switch (no own arrays): on the general path, or with
    ``small`` on the small-call path's ``combine_arrays`` round."""
    world = len(calls[0])
    switch = InProcessSwitch(world, timeout=60.0)
    histories = [History() for _ in range(world)]
    stats = [[WorkerStats() for _ in calls] for _ in range(world)]

    def rank(r: int) -> list[torch.Tensor]:
        return [homagg.codec.allreduce(call[r].clone(), switch.port(r), stats=stats[r][i], inplace=True,
                                       history=histories[r], small_calls=small) for i, call in enumerate(calls)]

    return on_threads(rank, world), stats, histories


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("world", [2, 3])
def test_own_array_calls_are_the_general_path(switch, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype,
                                              world: int) -> None:
    gen = torch.Generator().manual_seed(world * 7 + INTS.index(dtype))
    info = torch.iinfo(dtype)
    span = min(info.max, 2**62) // (world + 1)
    low = 0 if dtype == torch.uint8 else -span
    sizes = (1, 1, 5, 16, 17, 40, 1, 1024, 3)  # Python numbers up to 16 elements, arrays above
    calls = [[torch.randint(low, span, (n,), generator=gen, dtype=torch.int64).to(dtype) for _ in range(world)]
             for n in sizes]
    calls.append([torch.zeros(4, dtype=dtype) for _ in range(world)])  # a zero union
    calls.append([torch.full((2,), info.max // world, dtype=dtype) for _ in range(world)])  # near the top
    fast, fast_stats, fast_hist = _own(switch, calls, monkeypatch)
    slow, slow_stats, slow_hist = _general(calls, small=True)
    general = _general(calls)[0]
    for i, call in enumerate(calls):
        exact = sum(t.to(torch.int64) for t in call)
        for r in range(world):
            a, b = fast[r][i], slow[r][i]
            assert a.dtype == dtype and torch.equal(a, b) and torch.equal(a, general[r][i]), (r, i)
            assert torch.equal(a.to(torch.int64), exact), (r, i)
            fs, ss = fast_stats[r][i], slow_stats[r][i]
            assert (fs.rounds, dict(fs.bytes_per_stream), dict(fs.schemes)) == \
                (ss.rounds, dict(ss.bytes_per_stream), dict(ss.schemes)), (r, i)
    for r in range(world):
        a_entries, b_entries = list(fast_hist[r]._entries.values()), list(slow_hist[r]._entries.values())
        assert [(e.union, e.changed, e.changed_before, e.local_nnz) for e in a_entries] == \
            [(e.union, e.changed, e.changed_before, e.local_nnz) for e in b_entries]


@pytest.mark.parametrize(("dtype", "values"), [
    (torch.int32, [2**31 - 1]),       # the carry check: the top limb's sum leaves 16 bits
    (torch.int64, [2**62]),
    (torch.int16, [2**14, 5]),        # the range check: the limbs carry fine, int16 does not hold it
    (torch.int16, [5, 2**14]),
    (torch.int64, [2**62, -(2**62)]),  # element 0's top fails, element 1 (-2**63) fits
    (torch.int32, [2**31 - 1] * 20),  # above 16 elements: arrays
])
def test_overflow_raises_the_general_paths_error_and_writes_nothing(switch, monkeypatch: pytest.MonkeyPatch,
                                                                    dtype: torch.dtype, values: list[int]) -> None:
    call = [torch.tensor(values, dtype=dtype)] * 2
    with pytest.raises(homagg.IntegerOverflowError) as general:
        _general([call])
    job, ports = _ports(switch, 2, True, k=64, slots=4)
    monkeypatch.setattr(_small, "int_call", None)  # the own arrays only
    try:
        tensors = [t.clone() for t in call]
        errors = on_threads(lambda r: _raises(tensors[r], ports[r]), 2)
        for r in range(2):
            assert str(errors[r]) == str(general.value)
            assert torch.equal(tensors[r], call[r])  # nothing written
    finally:
        monkeypatch.undo()
        _close(ports)
        ControlClient(switch.control_addr).remove(job.job_id)


def _raises(t: torch.Tensor, port) -> homagg.IntegerOverflowError:
    with pytest.raises(homagg.IntegerOverflowError) as err:
        homagg.codec.allreduce(t, port, inplace=True, history=History())
    return err.value
