"""Going back to the switch after a fallback: the canary round and the schedule of returns.

The canary runs on real ports: a real emulator (a child process) that forwards, one that drops
every datagram (its fault injection), and the in-process switch; oracle: the exact sum of the
known words, and the bound of a few retransmission timeouts instead of the port's 30 s progress
timeout.  The schedule is checked against its rules step by step (it is pure bookkeeping).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

import switch_emulator
from homagg.torch._comeback import CANARY_RTOS, FLAP_WINDOW_S, GIVE_UP, STAY, TRY, ReturnSchedule, canary
from homagg.transport import CombineOp, ControlClient, InProcessSwitch, Stream, UdpSwitchPort


def _canaries(ports: list, world: int) -> list[str | None]:
    out: list[str | None] = [None] * world
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, canary(ports[r], r, world)))
               for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_the_canary_passes_on_a_switch_that_forwards() -> None:
    world = 3
    sw = InProcessSwitch(world)
    assert _canaries([sw.port(r) for r in range(world)], world) == [None] * world


def test_the_canary_sees_wrong_sums() -> None:
    """Ranks 0 and 1 run the canary, rank 2's port sends other words: the sum is wrong on both."""
    world = 3
    sw = InProcessSwitch(world)
    ports = [sw.port(r) for r in range(world)]
    out: list = [None] * world
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, canary(ports[r], r, world))) for r in (0, 1)]
    for t in threads:
        t.start()
    ports[2].combine([Stream("canary", CombineOp.ADD, torch.zeros(256, dtype=torch.int32))])
    for t in threads:
        t.join(60)
    assert all("words wrong" in (why or "") for why in out[:2]), out


@pytest.mark.parametrize("drop", [0.0, 1.0])
def test_the_canary_on_an_emulator_is_bounded_by_a_few_rtos(drop: float) -> None:
    """A real emulator: the canary passes when it forwards; when it drops every datagram the canary
    fails within a few retransmission timeouts of the new port (1 s each), not its 30 s timeout."""
    world = 2
    with switch_emulator.spawn(allow_faults=True, engine="python") as sw:
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            job = ctl.admit(world, n_slots=16, words_per_packet=2048)
            ctl.set_faults(drop=drop)
        ports = [UdpSwitchPort(sw.data_addr, rank=r, job=job, control=sw.control_addr, secret=sw.secret,
                               timeout=30.0, multicast=False) for r in range(world)]
        try:
            bound = CANARY_RTOS * ports[0].rtt.rto
            t0 = time.monotonic()
            verdicts = _canaries(ports, world)
            took = time.monotonic() - t0
            assert all(p.timeout == 30.0 for p in ports)  # restored after the round
        finally:
            for p in ports:
                p.close()
    if drop == 0.0:
        assert verdicts == [None] * world
    else:
        assert all(v is not None and "canary round failed" in v for v in verdicts), verdicts
        assert took < bound + 5.0, (took, bound)  # not the 30 s progress timeout


def test_the_schedule_probes_at_its_interval_and_backs_off_after_failures() -> None:
    probes: list[float] = []

    def probe() -> bool:
        probes.append(0.0)
        return True

    s = ReturnSchedule(1.0, 3, probe)
    assert s.verdict(0.0) == TRY
    assert s.verdict(0.5) == STAY and len(probes) == 1  # not before the interval
    s.failed(0.5, "canary")
    assert s.interval_s == 2.0 and s.verdict(2.0) == STAY and s.verdict(2.5) == TRY
    s.failed(2.5, "canary")
    assert s.interval_s == 4.0 and s.verdict(6.5) == TRY
    s.failed(6.5, "re-admission")
    assert s.failures == 3 and s.last_failure == "re-admission"
    assert s.verdict(6.5) == GIVE_UP  # at once, once
    assert [s.verdict(t) for t in (100.0, 1000.0)] == [STAY, STAY]


def test_a_probe_that_finds_nothing_is_not_a_failed_return() -> None:
    s = ReturnSchedule(1.0, 1, lambda: False)
    assert [s.verdict(float(t)) for t in range(5)] == [STAY] * 5
    assert s.failures == 0 and s.interval_s == 1.0


def test_a_return_whose_first_call_falls_back_failed() -> None:
    s = ReturnSchedule(1.0, 2, lambda: True)
    s.returned(10.0)
    s.fell_back(11.0, "no progress")  # no call completed on the switch since the return
    assert s.failures == 1 and "first call after the return" in s.last_failure and s.interval_s == 2.0
    s.returned(20.0)
    s.served()  # its first call completed: the return worked
    assert s.failures == 0
    s.fell_back(20.0 + FLAP_WINDOW_S / 2, "killed")  # soon after, but it served: probe less often only
    assert s.failures == 0 and s.interval_s == 4.0
    s.returned(100.0)
    s.served()
    s.fell_back(100.0 + FLAP_WINDOW_S + 1, "killed")  # the return held a minute: start afresh
    assert s.failures == 0 and s.interval_s == 1.0


def test_no_returns_when_attempts_is_zero() -> None:
    s = ReturnSchedule(1.0, 0, lambda: True)
    assert s.verdict(0.0) == GIVE_UP and s.verdict(10.0) == STAY
