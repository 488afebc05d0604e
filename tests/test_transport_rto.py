"""Retransmission timer (RFC 6298 estimator) and the port's retransmission accounting.

The estimator is checked against the RFC's formulas computed by hand; the port against a scripted
fake switch on loopback (a UDP socket in a thread) that delays or drops chosen datagrams, so the
oracle is exact: which chunks were resent, which resends were spurious, and the summed words.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest
import torch

from homagg import ConfigError
from homagg import wire
from homagg.transport import CombineOp, Stream, UdpSwitchPort
from homagg.transport._fastpath import AVAILABLE
from homagg.transport._rto import RtoEstimator

#: both round loops: the Python reference and the native one (where it was built)
LOOPS = [pytest.param(False, id="python-loop"),
         pytest.param(True, id="native-loop",
                      marks=pytest.mark.skipif(not AVAILABLE, reason="the native datapath was not built"))]


def test_estimator_follows_rfc6298() -> None:
    est = RtoEstimator(initial=1.0, min_rto=0.01, max_rto=10.0, granularity=0.001)
    assert est.rto == 1.0 and est.srtt is None
    est.sample(0.1)  # first: SRTT = R, RTTVAR = R/2, RTO = SRTT + 4 RTTVAR
    assert est.srtt == pytest.approx(0.1) and est.rttvar == pytest.approx(0.05)
    assert est.rto == pytest.approx(0.3)
    est.sample(0.2)  # RTTVAR = 3/4 * 0.05 + 1/4 * |0.1 - 0.2|; SRTT = 7/8 * 0.1 + 1/8 * 0.2
    assert est.rttvar == pytest.approx(0.0625) and est.srtt == pytest.approx(0.1125)
    assert est.rto == pytest.approx(0.1125 + 4 * 0.0625)
    for _ in range(200):  # a constant RTT: RTTVAR -> 0, RTO -> SRTT + G (G dominates 4 RTTVAR)
        est.sample(0.05)
    assert est.rto == pytest.approx(0.05 + 0.001, abs=1e-4)


def test_estimator_floor_ceiling_and_backoff_once_per_period() -> None:
    est = RtoEstimator(initial=0.5, min_rto=0.2, max_rto=1.0)
    est.sample(0.001)
    assert est.rto == 0.2  # the software-switch floor
    est.expired(now=10.0)
    assert est.rto == 0.4 and est.backoffs == 1
    est.expired(now=10.1)  # another slot expiring within the same RTO period: one event
    assert est.rto == 0.4 and est.backoffs == 1
    est.expired(now=10.5)
    est.expired(now=11.5)
    assert est.rto == 1.0 and est.backoffs == 3  # capped
    est.sample(0.001)  # a valid sample recomputes the RTO
    assert est.rto == 0.2
    with pytest.raises(ConfigError):
        RtoEstimator(min_rto=2.0, max_rto=1.0)


class FakeSwitch:
    """One-worker switch on loopback: answers each datagram with its words, per a script.

    ``script(index, header) -> list of (delay_s, copies)`` decides per received datagram (in
    arrival order) how many result copies to send after which delay; ``[]`` drops it.
    """

    def __init__(self, script: Callable[[int, tuple], list[tuple[float, int]]]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.addr = self.sock.getsockname()
        self.script = script
        self.received: list[tuple] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        buf = bytearray(wire.datagram_len(wire.MAX_WORDS_JUMBO))
        while not self._stop.is_set():
            try:
                n, src = self.sock.recvfrom_into(buf)
            except TimeoutError:
                continue
            h = wire.unpack_header(buf)
            self.received.append(h)
            reply = bytearray(buf[:n])
            wire.set_flags(reply, wire.FLAG_RESULT)
            for delay, copies in self.script(len(self.received) - 1, h):
                if delay == 0:  # in arrival order, as a FIFO switch answers (a timer thread could reorder)
                    self._send(bytes(reply), src, copies)
                    continue
                t = threading.Timer(delay, self._send, args=(bytes(reply), src, copies))
                t.daemon = True
                t.start()

    def _send(self, data: bytes, dst: tuple[str, int], copies: int) -> None:
        if self._stop.is_set():
            return
        for _ in range(copies):
            try:
                self.sock.sendto(data, dst)
            except OSError:
                return  # closed meanwhile: the copy is lost, as on a network

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _run(script: Callable[[int, tuple], list[tuple[float, int]]], n_words: int, k: int, slots: int, native: bool,
         **rto: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, int], list[tuple]]:
    fake = FakeSwitch(script)
    words = torch.arange(1, n_words + 1, dtype=torch.int32) * 7
    try:
        with UdpSwitchPort(fake.addr, rank=0, job_id=1, world_size=1, n_slots=slots, words_per_packet=k,
                           timeout=10.0, native=native, **rto) as port:
            (out,) = port.combine([Stream("x", CombineOp.ADD, words)])
            stats = dict(port.stats)
    finally:
        fake.close()
    return out, words, stats, fake.received


@pytest.mark.parametrize("native", LOOPS)
def test_late_result_makes_a_retransmission_that_is_counted_spurious(native: bool) -> None:
    # one slot, two chunks of 10 words.  Chunk 0's first copy is answered after 0.3 s (past the
    # 20-50 ms RTO) and every retransmission of it after 0.35 s, as the switch's shadow copy
    # answers them: the later copies prove chunk 0's retransmission spurious.  Chunk 1 (offset 10)
    # is answered after 0.8 s and its retransmissions dropped (a switch counts those, not the port).
    def script(i: int, h: tuple) -> list[tuple[float, int]]:
        retx, offset = h[2] & wire.FLAG_RETRANSMIT, h[9]
        if offset == 0:
            return [(0.35, 1)] if retx else [(0.3, 1)]
        return [] if retx else [(0.8, 1)]

    out, words, stats, received = _run(script, 20, 10, 1, native, rto=0.02, min_rto=0.02, max_rto=0.05)
    assert torch.equal(out, words)
    retx = [h for h in received if h[2] & wire.FLAG_RETRANSMIT]
    assert stats["retransmits"] == len(retx) >= 2
    assert {h[9] for h in retx} == {0, 10}
    assert stats["spurious_retransmits"] == 1 and stats["fast_retransmits"] == 0
    assert stats["rtt_samples"] == 0  # Karn: both chunks were retransmitted, so no sample


@pytest.mark.parametrize("native", LOOPS)
def test_lost_chunk_is_fast_retransmitted_before_the_timer(native: bool) -> None:
    # the first copy of chunk 0 is lost; chunks 1.. complete; the RTO (5 s) never fires
    def script(i: int, h: tuple) -> list[tuple[float, int]]:
        return [] if i == 0 else [(0.0, 1)]

    out, words, stats, received = _run(script, 80, 8, 8, native, rto=5.0, min_rto=5.0, max_rto=5.0)
    assert torch.equal(out, words)
    assert stats["retransmits"] == stats["fast_retransmits"] == 1
    assert stats["rto_backoffs"] == 0 and stats["spurious_retransmits"] == 0
    resent = [h for h in received if h[2] & wire.FLAG_RETRANSMIT]
    assert [h[9] for h in resent] == [0]  # offset of chunk 0


@pytest.mark.parametrize("native", LOOPS)
def test_stall_resends_only_the_oldest_chunk(native: bool) -> None:
    # a late peer: every chunk's result comes 0.6 s after its first copy, retransmissions get no
    # answer (the switch drops them as duplicates); with a 50 ms RTO only chunk 0 is probed
    def script(i: int, h: tuple) -> list[tuple[float, int]]:
        return [] if h[2] & wire.FLAG_RETRANSMIT else [(0.6, 1)]

    out, words, stats, received = _run(script, 40, 10, 4, native, rto=0.05, min_rto=0.05, max_rto=0.1)
    assert torch.equal(out, words)
    assert {h[9] for h in received if h[2] & wire.FLAG_RETRANSMIT} == {0}
    assert stats["retransmits"] >= 1 and stats["fast_retransmits"] == 0
