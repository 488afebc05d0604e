"""The total-loss rule of :class:`homagg.transport._liveness.Liveness`, sighting by sighting.

A port's timer scan calls ``gone(now, stalled_s, refused, sent)``; here the scan is driven with
explicit times, the control port is a real TCP listener on loopback (so the switch "answers"), and
``job_known`` reports what a switch's status would: the job held, its accepted count.  A small
network model delivers the probes the rule asks for (``take_probes``) or drops them by a script.

Oracle: the rule's contract (module docstring).  A working switch behind a lossy link whose first
batch of probes is lost entirely (at 20% ingress loss, one batch of 4 in 0.16% of checks: this
made ``bench faults --quick`` fail once) is not called dead when a later batch arrives; a switch
that accepts nothing is called dead once 12 of this worker's datagrams went unseen, in about 2 s of
stall, and the reason names what was seen.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from homagg.transport._liveness import JobSighting, Liveness


@pytest.fixture
def control() -> Iterator[tuple[str, int]]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[:2]


class _Switch:
    """The job's accepted count and ingress drops, as the emulator's status reports them."""

    def __init__(self, lost_batches: set[int] | None) -> None:
        self.lost_batches = lost_batches  # which batches of probes are lost (0-based); None: all
        self.packets, self.drop_injected, self.rx = 100, 0, 0
        self.batches = 0

    def receive(self, n: int) -> None:
        self.rx += n
        if self.lost_batches is None or self.batches in self.lost_batches:
            self.drop_injected += n
        else:
            self.packets += n
        self.batches += 1

    def sighting(self) -> JobSighting:
        return JobSighting(True, self.packets, {"rx": self.rx, "drop_injected": self.drop_injected})


def _scan(live: Liveness, switch: _Switch, *, until_s: float) -> tuple[str | None, float, int]:
    """The port's timer scan every 50 ms of one stall that starts at t = 0: (verdict, when, sent)."""
    sent = 0
    t = 0.0
    while t <= until_s:
        why = live.gone(t, t, 0, sent)
        due = live.take_probes()
        if due:
            switch.receive(due)
            sent += due
        if why is not None:
            return why, t, sent
        t = round(t + 0.05, 3)
    return None, t, sent


@pytest.mark.parametrize("lost", [{0}, {0, 1}, {1, 2}])
def test_a_lost_batch_of_probes_is_not_total_loss(control: tuple[str, int], lost: set[int]) -> None:
    switch = _Switch(lost)
    live = Liveness(control, job_known=switch.sighting)
    why, at, sent = _scan(live, switch, until_s=6.0)
    assert why is None, (why, at, sent)
    assert switch.batches >= 2 and switch.packets > 100  # a later batch arrived and moved the count


def test_a_switch_that_accepts_nothing_is_dead_after_three_batches(control: tuple[str, int]) -> None:
    switch = _Switch(None)
    live = Liveness(control, job_known=switch.sighting)
    why, at, sent = _scan(live, switch, until_s=6.0)
    assert why is not None and why.startswith("holds this job but accepted none of its datagrams"), why
    assert sent == 12 and switch.batches == 3, (sent, switch.batches)
    assert "drop_injected +12" in why and "rx +12" in why and "stayed at 100" in why, why
    assert at <= 2.5, at  # stall 0.5 s, a batch per job sighting (0.5 s apart), the verdict at the fourth


def test_a_late_peer_costs_a_batch_every_two_seconds(control: tuple[str, int]) -> None:
    """Every batch arrives (the switch sees this worker; another worker is late): never dead, and
    the probes stay at one batch per ``loss_probe_gap_s`` once the count keeps moving."""
    switch = _Switch(set())
    live = Liveness(control, job_known=switch.sighting)
    why, _, sent = _scan(live, switch, until_s=8.45)
    assert why is None
    assert sent <= 4 * 5, sent  # 8 s of stall: at most one batch per 2 s (plus the first)
