"""Congestion window (AIMD over the slot pool) and liveness of the switch (a SIGKILLed emulator).

The window is checked against its rules computed by hand, and on loopback against a fake switch
that counts the datagrams it holds unanswered (oracle: the exact count in flight, the exact sum).
The liveness probe against a real emulator child killed with SIGKILL: the stalled round must end
in a :class:`homagg.SwitchTimeoutError` naming the dead switch within about a second, not at the
port's 30 s timeout.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import pytest
import torch

import switch_emulator
from homagg import SwitchTimeoutError, wire
from homagg.transport import CombineOp, ControlClient, Stream, UdpSwitchPort
from homagg.transport._window import MIN_WINDOW, CongestionWindow
from tests.test_transport_rto import LOOPS, FakeSwitch


def test_window_grows_one_chunk_per_window_of_results() -> None:
    w = CongestionWindow(limit=64, initial=16, floor=4)
    assert w.size == 16
    for _ in range(20):  # about one window of results: +1 chunk (additive from the start, no doubling)
        w.on_result()
    assert w.size == 17
    for _ in range(20):
        w.on_result()
    assert w.size == 18
    for _ in range(10_000):
        w.on_result()
    assert w.size == 64  # never above the slot pool


def test_window_halves_once_per_loss_event_never_below_floor_and_undoes_spurious_cuts() -> None:
    w = CongestionWindow(limit=64, initial=64, floor=8)
    w.on_loss(lost=100, next_new=164)
    assert w.size == 32 and w.reductions == 1
    w.on_loss(lost=130, next_new=170)  # sent before the cut: the same congestion event
    assert w.size == 32 and w.reductions == 1
    w.on_spurious()  # the resend proved unnecessary: the cut is undone
    assert w.size == 64 and w.undos == 1
    w.on_spurious()  # nothing left to undo
    assert w.size == 64 and w.undos == 1
    for lost in (200, 300, 400, 500, 600):  # a new event each time (each past ``recover``)
        w.on_loss(lost=lost, next_new=lost + 1)
    assert w.size == 8 and w.reductions == 6  # 64 -> 32 -> 16 -> 8 (floor) -> 8 -> 8


def test_window_floor_and_initial_are_clamped_to_the_pool() -> None:
    w = CongestionWindow(limit=4, initial=16, floor=MIN_WINDOW)
    assert w.size == 4
    w.on_loss(lost=0, next_new=4)
    assert w.size == 4  # the floor is at most the pool


class CountingSwitch(FakeSwitch):
    """Answers every datagram ``delay_s`` after it came, in arrival order (a FIFO queue, as a
    switch's egress is); records how many datagrams it held unanswered after each arrival."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.fifo: queue.Queue[tuple[float, bytes, tuple[str, int]] | None] = queue.Queue()
        self.held: list[int] = []
        self._sender = threading.Thread(target=self._answer, daemon=True)
        self._sender.start()
        super().__init__(lambda i, h: [(0.0, 0)])  # 0 copies now: _send queues the reply instead

    def _send(self, data: bytes, dst: tuple[str, int], copies: int) -> None:
        if copies == 0:
            self.fifo.put((time.monotonic() + self.delay_s, data, dst))
            self.held.append(self.fifo.qsize())
        else:
            super()._send(data, dst, copies)

    def _answer(self) -> None:
        while (item := self.fifo.get()) is not None:
            due, data, dst = item
            time.sleep(max(0.0, due - time.monotonic()))
            self._send(data, dst, 1)

    def close(self) -> None:
        self.fifo.put(None)
        self._sender.join(5)
        super().close()


@pytest.mark.parametrize("native", LOOPS)
def test_port_keeps_at_most_the_window_in_flight_and_grows_it(native: bool) -> None:
    fake = CountingSwitch(delay_s=0.02)
    words = torch.arange(1, 64 * 8 * 40 + 1, dtype=torch.int32)
    try:
        with UdpSwitchPort(fake.addr, rank=0, job_id=1, world_size=1, n_slots=64, words_per_packet=8,
                           timeout=20.0, window=16, native=native) as port:
            (out,) = port.combine([Stream("x", CombineOp.ADD, words)])
            stats = dict(port.stats)
    finally:
        fake.close()
    assert torch.equal(out, words)
    held = fake.held
    assert max(held[:32]) <= 16  # the first burst is the initial window, not the 64-slot pool
    assert max(held) <= 64 and max(held) > 16  # grown additively, bounded by the pool
    assert stats["retransmits"] == 0 and stats["window_cuts"] == 0 and stats["cwnd"] > 16


@pytest.mark.parametrize("native", LOOPS)
def test_sigkilled_emulator_is_reported_gone_within_a_second(native: bool) -> None:
    with switch_emulator.spawn() as sw:
        assert sw.process is not None
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            job = ctl.admit(1, n_slots=16, words_per_packet=wire.MAX_WORDS_JUMBO)
        with UdpSwitchPort(sw.data_addr, rank=0, job=job, control=sw.control_addr, secret=sw.secret,
                           timeout=30.0, multicast=False, native=native) as port:
            words = torch.arange(200_000, dtype=torch.int32)
            (out,) = port.combine([Stream("x", CombineOp.ADD, words)])
            assert torch.equal(out, words)  # the switch works
            os.kill(sw.process.pid, signal.SIGKILL)
            sw.process.wait(10)
            t0 = time.monotonic()
            with pytest.raises(SwitchTimeoutError) as err:
                port.combine([Stream("x", CombineOp.ADD, words)])
            waited = time.monotonic() - t0
    assert "is gone" in str(err.value) and f"{sw.control_addr[1]}" in str(err.value), str(err.value)
    assert waited < 2.0, waited  # ~0.5-0.75 s (a stall of 0.5 s, then a probe), not 30 s


@pytest.mark.parametrize("native", LOOPS)
def test_sigkilled_emulator_without_control_port_is_reported_by_icmp_refusals(native: bool) -> None:
    with switch_emulator.spawn() as sw:
        assert sw.process is not None
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            job = ctl.admit(1, n_slots=16, words_per_packet=64)
            port = UdpSwitchPort(sw.data_addr, rank=0, job=job, timeout=30.0, native=native)
            ctl.register(job.job_id, 0, port.local_addr)
        with port:
            words = torch.arange(50_000, dtype=torch.int32)
            (out,) = port.combine([Stream("x", CombineOp.ADD, words)])
            assert torch.equal(out, words)
            os.kill(sw.process.pid, signal.SIGKILL)
            sw.process.wait(10)
            t0 = time.monotonic()
            with pytest.raises(SwitchTimeoutError) as err:
                port.combine([Stream("x", CombineOp.ADD, words)])
            waited = time.monotonic() - t0
    assert "ICMP port unreachable" in str(err.value), str(err.value)
    assert waited < 2.5, waited  # ~1 s of refusals, not 30 s
