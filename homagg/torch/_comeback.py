"""Going back to the switch after a fallback: when to try (:class:`ReturnSchedule`) and whether the
switch forwards this job's datagrams before the group commits to it (:func:`canary`).

A switch can answer its control port and admit a job, yet drop what the job sends (it came back
dropping every datagram, or most of them; its data path does not carry full-size datagrams).
Measured before the canary: a return to a switch that dropped 100% or 90% of datagrams cost the
progress timeout (30 s) on the first call, on every return.  So after the re-admission every rank
runs one round on the new port: one full-size chunk of known words (word ``i`` of rank ``r`` is
``i % 1024 + r``), combined with ADD, bounded by a few of the port's retransmission timeouts
instead of the progress timeout, and checked against the exact sum.  The group returns only if it
came back right on every rank.

Schedule (rank 0 decides; the others learn the verdict through the probe's gloo allreduce):

* rank 0 probes the switch at most every ``probe_interval`` seconds; the interval doubles (up to
  30 s) after a failed return and after a fallback within a minute of a return (a switch that
  works for a while after each return, then fails again: returning still pays, less often);
* a return *fails* when the re-admission or the canary round fails on some rank, or the first call
  after it falls back; a return whose first call completes on the switch resets the count;
* after ``attempts`` failed returns in a row the verdict is :data:`GIVE_UP`: the group stays on the
  host path for the rest of its life (one :class:`~homagg.PathWarning`).  ``attempts=0`` never
  returns.

Invariant: :func:`canary` waits at most ``rtos`` times the new port's RTO (one chunk: its progress
timeout, lowered for the round and then restored, bounds the whole round) and reports a failure as
text instead of raising; :class:`ReturnSchedule` says :data:`GIVE_UP` once, then only :data:`STAY`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .._errors import HomAggError
from ..transport import CombineOp, Stream, SwitchPort

__all__ = ["canary", "CANARY_RTOS", "ReturnSchedule", "STAY", "TRY", "GIVE_UP"]

#: the canary round's bound, in retransmission timeouts of the new port (1 s each before its first
#: sample: the first copy and two retransmissions, so one lost datagram is tolerated)
CANARY_RTOS = 3
_DEFAULT_WORDS = 256
STAY, TRY, GIVE_UP = 0, 1, 2  #: rank 0's verdict at a call boundary on the host path
MAX_PROBE_INTERVAL_S = 30.0
FLAP_WINDOW_S = 60.0  #: a fallback this soon after a return doubles the probe interval


def _words(rank: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.int32) % 1024 + rank


def canary(port: SwitchPort, rank: int, world_size: int, rtos: int = CANARY_RTOS) -> str | None:
    """Run the canary round on ``port`` (every rank of the job at once); None when every word came
    back right within the bound, else what went wrong."""
    job = getattr(port, "job", None)
    n = job.words_per_packet if job is not None else _DEFAULT_WORDS
    rtt = getattr(port, "rtt", None)
    saved = getattr(port, "timeout", None)
    bounded = rtt is not None and saved is not None
    if bounded:
        port.timeout = min(saved, rtos * rtt.rto)  # type: ignore[attr-defined]
    t0 = time.monotonic()
    try:
        out = port.combine([Stream("canary", CombineOp.ADD, _words(rank, n))])[0].cpu()
    except HomAggError as exc:
        return f"the canary round failed after {time.monotonic() - t0:.2f}s: {exc}"
    finally:
        if bounded:
            port.timeout = saved  # type: ignore[attr-defined]
    expected = _words(0, n) * world_size + world_size * (world_size - 1) // 2
    if not torch.equal(out, expected):
        return f"the canary round came back with {int((out != expected).sum())} of {n} words wrong"
    return None


class ReturnSchedule:
    """Rank 0's schedule of returns to the switch (see the module docstring)."""

    def __init__(self, probe_interval_s: float, attempts: int, probe: Callable[[], bool]) -> None:
        self.base_interval_s = self.interval_s = probe_interval_s
        self.attempts = attempts
        self.failures = 0  #: failed returns in a row
        self.last_failure = ""  #: why the last one failed
        self._probe = probe
        self._next_probe = 0.0
        self._returned_at = -1e9
        self._unproven = False  # a return whose first call has not completed on the switch yet
        self._gave_up = False

    def verdict(self, now: float) -> int:
        """:data:`GIVE_UP` (once), :data:`TRY` (the probe found the switch) or :data:`STAY`."""
        if self._gave_up:
            return STAY
        if self.failures >= self.attempts:
            self._gave_up = True
            return GIVE_UP
        if now < self._next_probe:
            return STAY
        self._next_probe = now + self.interval_s
        return TRY if self._probe() else STAY

    def failed(self, now: float, why: str) -> None:
        """A return failed (re-admission or canary): back off, count it."""
        self.failures += 1
        self.last_failure = why
        self._back_off(now)

    def returned(self, now: float) -> None:
        self._returned_at, self._unproven = now, True

    def served(self) -> None:
        """A call completed on the switch: the return (if one is pending) worked."""
        if self._unproven:
            self._unproven, self.failures = False, 0

    def fell_back(self, now: float, why: str) -> None:
        """The group fell back: in the first call after a return, that return failed; soon after a
        return, probe less often; else start afresh."""
        if self._unproven:
            self._unproven = False
            self.failed(now, f"the first call after the return fell back: {why}")
        elif now - self._returned_at < FLAP_WINDOW_S:
            self._back_off(now)
        else:
            self.interval_s = self.base_interval_s
            self._next_probe = now + self.interval_s

    def _back_off(self, now: float) -> None:
        self.interval_s = min(2 * self.interval_s, MAX_PROBE_INTERVAL_S)
        self._next_probe = now + self.interval_s
