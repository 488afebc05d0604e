"""A dead peer rank told from a late one (``homagg/transport/_peers.py``) and the barrier as one
switch round (``homagg/codec/_barrier.py``), on loopback: presence sockets, UDP ports on the
emulator (native and Python loops), the in-process switch."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import switch_emulator
from homagg import RankMismatchError, RankTimeoutError, SwitchTimeoutError
from homagg.codec import WorkerStats, _barrier, _extremum
from homagg.testing import on_threads
from homagg.transport import CombineOp, ControlClient, InProcessSwitch, UdpSwitchPort
from homagg.transport._fastpath import AVAILABLE as DATAPATH
from homagg.transport._peers import PeerWatch, presence_socket
from tests.test_transport_small_rounds import _ports

LOOPS = [True, False] if DATAPATH else [False]


def test_a_live_peer_is_never_gone_and_a_closed_one_is_named() -> None:
    live, dead = presence_socket("127.0.0.1"), presence_socket("127.0.0.1")
    watch = PeerWatch({1: live.getsockname(), 3: dead.getsockname()}, min_stall_s=0.5, interval_s=0.5)
    try:
        assert watch.gone(0.0, 0.4) is None and watch.sent == 0  # a short stall sends nothing
        for i in range(300):  # far more probes than the live socket's buffer holds: still no evidence
            assert watch.gone(float(i), 1.0) is None
        assert watch.sent == 600
        dead.close()
        reasons = [watch.gone(400.0 + i, 1.0) for i in range(3)]
        reason = next(r for r in reasons if r is not None)  # the probe after the close, then its answer
        assert reasons.index(reason) <= 1 and watch.dead == (3,), reasons
        assert reason.startswith("rank(s) 3 of the group are gone") and "127.0.0.1" in reason
        assert watch.gone(400.25 + reasons.index(reason), 1.0) is None  # not before interval_s
    finally:
        watch.close()
        live.close()


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


def _one_round(port) -> list[np.ndarray]:
    return port.combine_arrays([CombineOp.ADD], [np.arange(3, dtype=np.int32)])


@pytest.mark.parametrize("native", LOOPS)
def test_a_round_waiting_for_a_dead_rank_ends_within_a_second(switch, native: bool) -> None:
    """Worker 0 of 2 sends a round; worker 1's process is gone (its presence socket closed): the
    round raises RankTimeoutError naming rank 1 in about a second, not at the 20 s progress
    timeout; with the peer's socket open the same wait runs into the timeout's error instead."""
    job, ports = _ports(switch, 2, native, k=64, slots=8, timeout=20.0)
    late = presence_socket("127.0.0.1")
    gone = presence_socket("127.0.0.1")
    try:
        on_threads(lambda r: _one_round(ports[r]), 2)  # a working round first
        ports[0].peers = PeerWatch({1: gone.getsockname()})
        gone.close()
        t0 = time.monotonic()
        with pytest.raises(RankTimeoutError, match=r"rank\(s\) 1 of the group are gone") as caught:
            _one_round(ports[0])
        assert caught.value.ranks == (1,) and time.monotonic() - t0 < 3.0
        ports[0].peers.close()
        ports[0].peers = PeerWatch({1: late.getsockname()})  # a late rank: only the timeout ends the wait
        ports[0].timeout = 2.0
        with pytest.raises(SwitchTimeoutError) as caught:
            _one_round(ports[0])
        assert not isinstance(caught.value, RankTimeoutError) and ports[0].peers.sent >= 2
    finally:
        late.close()
        for port in ports:
            if port.peers is not None:
                port.peers.close()
            port.close()
        ControlClient(switch.control_addr).remove(job.job_id)


@pytest.mark.parametrize("native", LOOPS)
def test_a_dead_rank_whose_words_the_switch_holds_is_not_blamed(native: bool) -> None:
    """Worker 0 gets no results (muted at the switch) while worker 1, whose words the switch
    already holds, dies: worker 0's stall is no dead rank's doing, and its error says what the
    switch says (it has the complete result), not RankTimeoutError."""
    with switch_emulator.spawn(allow_faults=True) as sw:
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            job = ctl.admit(2, n_slots=8, words_per_packet=64)
            ctl.set_faults(mute=[0])
        ports = [UdpSwitchPort(sw.data_addr, rank=r, job=job, control=sw.control_addr, secret=sw.secret,
                               native=native, timeout=t, multicast=False) for r, t in ((0, 2.5), (1, 10.0))]
        gone = presence_socket("127.0.0.1")
        ports[0].peers = PeerWatch({1: gone.getsockname()})
        try:
            def rank(r: int) -> str:
                try:
                    _one_round(ports[r])
                except SwitchTimeoutError as exc:
                    return type(exc).__name__ + ": " + str(exc)
                if r == 1:
                    gone.close()  # worker 1 got its result and died
                return "done"

            outcome = on_threads(rank, 2)
            assert outcome[1] == "done", outcome
            assert outcome[0].startswith("SwitchTimeoutError") and "the switch has the complete result" in outcome[0]
            assert ports[0].peers.sent >= 2  # the watch did find rank 1 gone, and asked the switch
        finally:
            ports[0].peers.close()
            for port in ports:
                port.close()


@pytest.mark.parametrize("native", LOOPS)
def test_a_patient_barrier_waits_for_a_late_rank_and_keeps_the_timers(switch, native: bool) -> None:
    """Rank 1 enters the barrier 1.5 s after rank 0, past the port's 0.5 s progress timeout: inside
    ``patient`` rank 0 waits for it, leaves only after it entered, and its RTO estimator and window
    are as before; outside, the same wait times out (SwitchTimeoutError); a patient wait for a rank
    that never comes ends at its own timeout with RankTimeoutError naming that rank (the switch
    says whom it has not heard from)."""
    job, ports = _ports(switch, 2, native, k=64, slots=8, timeout=0.5)  # (rank 1's: 10 s)
    try:
        for _ in range(5):
            on_threads(lambda r: _barrier.barrier(ports[r]), 2)
        before = [(p.timeout, vars(p.rtt).copy(), vars(p.window).copy()) for p in ports]
        entered: dict[int, float] = {}
        left: dict[int, float] = {}

        def rank(r: int) -> None:
            if r == 1:
                time.sleep(1.5)
            entered[r] = time.monotonic()
            with ports[r].patient(60.0):
                _barrier.barrier(ports[r], WorkerStats())
            left[r] = time.monotonic()

        on_threads(rank, 2)
        assert min(left.values()) >= max(entered.values())
        for port, (timeout, rtt, window) in zip(ports, before, strict=True):
            assert port.timeout == timeout
            for saved, now, counters in ((rtt, vars(port.rtt), ("samples", "backoffs")),
                                         (window, vars(port.window), ("reductions", "undos"))):
                assert {k: v for k, v in now.items() if k not in counters} == \
                       {k: v for k, v in saved.items() if k not in counters}
        with pytest.raises(SwitchTimeoutError) as caught:  # not patient: rank 1 never comes
            _barrier.barrier(ports[0])
        assert not isinstance(caught.value, RankTimeoutError)
        t0 = time.monotonic()
        with pytest.raises(RankTimeoutError, match=r"worker\(s\) \[1\] did not arrive") as caught, ports[0].patient(1.5):
            _barrier.barrier(ports[0])  # patient, and rank 1 (alive: no presence watch says otherwise) never comes
        assert caught.value.ranks == (1,) and caught.value.missing == [1] and time.monotonic() - t0 >= 1.5
    finally:
        for port in ports:
            port.close()
        ControlClient(switch.control_addr).remove(job.job_id)


def test_the_barrier_holds_every_rank_and_stops_a_rank_in_another_call() -> None:
    """On the in-process switch: nobody leaves before the last (3 ranks, staggered); a rank in a
    barrier and one in an all_reduce (MAX) both raise RankMismatchError naming the barrier."""
    switch = InProcessSwitch(3, timeout=30)
    entered: dict[int, float] = {}
    left: dict[int, float] = {}

    def rank(r: int) -> None:
        time.sleep(0.1 * r)
        entered[r] = time.monotonic()
        stats = WorkerStats()
        _barrier.barrier(switch.port(r), stats)
        left[r] = time.monotonic()
        assert stats.rounds == 1

    on_threads(rank, 3)
    assert min(left.values()) >= max(entered.values())
    pair = InProcessSwitch(2, timeout=30)
    t = torch.ones(3)

    def mismatched(r: int) -> str:
        try:
            if r == 0:
                _barrier.barrier(pair.port(0))
            else:
                _extremum.allreduce(t, pair.port(1), "max")
        except RankMismatchError as exc:
            return str(exc)
        return "no error"

    for message in on_threads(mismatched, 2):
        assert "a barrier" in message, message
    assert torch.equal(t, torch.ones(3))
