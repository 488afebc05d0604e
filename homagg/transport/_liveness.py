"""Is the switch still there?  Telling a dead switch from a slow one while a round stalls.

A worker whose round makes no progress would otherwise wait its whole progress timeout (30 s by
default) before :class:`~homagg.SwitchTimeoutError`.  A crashed emulator (embedded or standalone)
leaves two traces that need no cooperation from it:

* its control port refuses TCP connections (the kernel answers a SYN to a closed port with a
  reset) or, with the host gone, a connection attempt times out;
* its data port answers datagrams with ICMP port unreachable, which a connected UDP socket reports
  as ``ECONNREFUSED`` (the port counts them as ``refused``).

:meth:`Liveness.gone` is called by the port's timer scan.  Once the round has stalled for
``min_stall_s`` (0.5 s: not scaled by the RTO, whose backoff would push the first probe out to
seconds; a probe is harmless, since only positive evidence counts) it tries, at most every ``interval_s``, to open a TCP
connection to the control port (a plain connect: no request, nothing authenticated; a live but
busy switch is answered by its kernel's listen queue).  Without a control address it trusts the
data port's refusals once they keep coming for ``no_control_stall_s``.  A slow switch or a late
peer never looks dead: both keep the control port open and send no ICMP.

A switch that was restarted (or reprogrammed) at the same address answers its control port but
has lost the job's admission, and drops the job's datagrams without a word.  With ``job_known`` (a
question the port asks over its authenticated control client: a :class:`JobSighting`), once the
round has stalled for ``job_stall_s`` (0.5 s) the probe also asks, at most every
``job_interval_s`` (0.5 s), whether the switch still holds this job (its id *and* token: a new job
that reuses the id is not ours); a definite "no" is positive evidence too.

Total loss: a switch that holds the job but forwards nothing (it drops every datagram, or every one
of this job's) looks alive on both counts.  Where its status counts the job's accepted datagrams
(the emulator's ``packets``), the first sighting of a stall is a baseline (so is any sighting whose
count moved), and the port then sends ``loss_probes`` (4) copies of its oldest pending datagram
(:meth:`Liveness.take_probes`; marked as retransmissions, so the switch treats them as it treats
any).  Each later sighting whose count has not moved asks for another batch, up to
``loss_batches`` (3) batches per baseline; a new baseline (the count moved: the switch sees this
job) waits ``loss_probe_gap_s`` (2 s) before its first batch, so a long wait for a late peer costs
a few datagrams a second, not more.  A sighting ``loss_window_s`` (0.5 s) or more after the
baseline whose count has not moved, while this worker sent at least ``loss_probes x loss_batches``
(12) datagrams since (other workers' datagrams would only move it), means none arrived: the reason
says so, with the switch's counters that moved meanwhile (``rx``, ``drop_<reason>``).
A lossy but working network loses all 12 only with probability (loss rate)^12 (4e-9 at 20% loss;
a single batch of 4 was lost in 0.16% of checks at 20% and made a working switch look dead).
Results lost on their way back are not seen this way (the switch accepted the datagrams): the
progress timeout finds those.  "Cannot tell" (no job list, no count, an error) is never evidence.

Invariant: ``gone`` returns a reason only on positive evidence (a refused or timed-out connect,
refusals on the data port, the switch saying it does not hold the job, or not counting any of the
job's datagrams while this worker sent them again); then the caller raises at once instead of at
the timeout.  The reason is a clause whose subject is the switch ("is gone: ...", "holds this job
but ...").
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import HomAggError

__all__ = ["Liveness", "JobSighting", "control_silent", "job_sighting"]


@dataclass(frozen=True)
class JobSighting:
    """What the switch's status says about one port's job (the port's answer to ``job_known``)."""

    held: bool | None  #: it holds the job (id and token); None: cannot tell
    packets: int | None = None  #: the job's datagrams it accepted so far; None: not reported
    counters: Mapping[str, int] = field(default_factory=dict)  #: its counters (``rx``, ``drop_<reason>``...)


@dataclass(frozen=True)
class _Baseline:
    """The first sighting of a stall that the accepted count has not moved since."""

    at: float
    stall_start: float
    packets: int
    sent: int
    counters: Mapping[str, int]


def control_silent(control: tuple[str, int], timeout_s: float) -> str | None:
    """Why the switch's control port does not take a TCP connection (refused, timed out,
    unreachable), or None when it does (a plain connect: nothing sent, nothing authenticated)."""
    host, port = control
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return f"its control port {host}:{port} refuses connections"
    except OSError as exc:  # timeout, unreachable host or network
        return f"its control port {host}:{port} does not answer ({exc.__class__.__name__})"
    return None


class Liveness:
    """Liveness probe of one port's switch (see the module docstring)."""

    def __init__(self, control: tuple[str, int] | None, *, interval_s: float = 0.25, connect_timeout_s: float = 0.5,
                 min_stall_s: float = 0.5, no_control_stall_s: float = 1.0,
                 job_known: Callable[[], JobSighting] | None = None, job_stall_s: float = 0.5,
                 job_interval_s: float = 0.5, loss_window_s: float = 0.5, loss_probes: int = 4,
                 loss_probe_gap_s: float = 2.0, loss_batches: int = 3) -> None:
        self.control = control
        self.interval_s, self.connect_timeout_s = interval_s, connect_timeout_s
        self.min_stall_s, self.no_control_stall_s = min_stall_s, no_control_stall_s
        self.job_known, self.job_stall_s, self.job_interval_s = job_known, job_stall_s, job_interval_s
        self.loss_window_s, self.loss_probes, self.loss_probe_gap_s = loss_window_s, loss_probes, loss_probe_gap_s
        self.loss_batches = loss_batches
        self._next = 0.0
        self._next_job = 0.0
        self._baseline: _Baseline | None = None
        self._probes_due = 0
        self._probed_at = -1e9  # when this stall's last probes were asked for
        self._probed_base: _Baseline | None = None  # the baseline the last batch was asked for
        self.probes = 0
        self.job_probes = 0

    def gone(self, now: float, stalled_s: float, refused: int, sent: int = 0) -> str | None:
        """Why the switch is gone or fails this job, or None (alive, or not probed yet).
        ``refused``: ICMP port-unreachable answers so far; ``sent``: this worker's datagrams sent
        again so far (retransmissions and probes: a running count)."""
        if stalled_s < self.min_stall_s or now < self._next:
            return None
        self._next = now + self.interval_s
        if self.control is None:
            if refused and stalled_s >= self.no_control_stall_s:
                return f"is gone: its data port refused {refused} datagrams (ICMP port unreachable)"
            return None
        self.probes += 1
        why = control_silent(self.control, self.connect_timeout_s)
        if why is None:
            return self._job_gone(now, stalled_s, sent)
        if refused:
            why += f", and its data port refused {refused} datagrams (ICMP port unreachable)"
        return "is gone: " + why

    def take_probes(self) -> int:
        """How many copies of its oldest pending datagram the port should send now (then zero)."""
        due, self._probes_due = self._probes_due, 0
        return due

    def _job_gone(self, now: float, stalled_s: float, sent: int) -> str | None:
        """The control port answers: does the switch still hold the job, and accept its datagrams?
        (None: yes, or cannot tell.)"""
        if self.job_known is None or stalled_s < self.job_stall_s or now < self._next_job:
            return None
        self._next_job = now + self.job_interval_s
        self.job_probes += 1
        seen = self.job_known()
        if seen.held is False:
            return ("answers its control port, but no longer holds this job (restarted or reprogrammed: "
                    "the job's admission is lost)")
        if seen.held is None or seen.packets is None:
            return None
        return self._nothing_accepted(now, now - stalled_s, seen, sent)

    def _nothing_accepted(self, now: float, stall_start: float, seen: JobSighting, sent: int) -> str | None:
        """Total loss: in this stall, the switch's count of the job's datagrams did not move for
        ``loss_window_s`` while this worker sent ``loss_probes x loss_batches`` or more (see the
        module docstring)."""
        base = self._baseline
        assert seen.packets is not None
        needed = self.loss_probes * self.loss_batches
        new_stall = base is None or abs(base.stall_start - stall_start) > 1e-3
        if new_stall:
            self._probed_at = -1e9
        if new_stall or base is None or base.packets != seen.packets:
            base = self._baseline = _Baseline(now, stall_start, seen.packets, sent, dict(seen.counters))
        elif now - base.at >= self.loss_window_s and sent - base.sent >= needed:
            return self._loss_reason(now, base, seen, sent)
        unmoved_since_batch = self._probed_base is base  # the last batch changed nothing: the next one now
        if sent - base.sent < needed and (unmoved_since_batch or now - self._probed_at >= self.loss_probe_gap_s):
            self._probes_due, self._probed_at, self._probed_base = self.loss_probes, now, base
        return None

    @staticmethod
    def _loss_reason(now: float, base: _Baseline, seen: JobSighting, sent: int) -> str:
        """What was seen: the unmoved count, what this worker sent, the switch's counters that moved."""
        moved = {k: v - base.counters.get(k, 0) for k, v in sorted(seen.counters.items())
                 if isinstance(v, int) and v != base.counters.get(k, 0)}
        shown = ", ".join(f"{k} {d:+d}" for k, d in list(moved.items())[:6]) or "none moved"
        return (f"holds this job but accepted none of its datagrams for {now - base.at:.1f}s, while this worker "
                f"sent {sent - base.sent} again (the job's count stayed at {seen.packets}; the switch's counters "
                f"meanwhile: {shown})")


def job_sighting(ctl: Any, job: Any) -> JobSighting:
    """What the switch's status says of ``job`` (a :class:`~homagg.jobs.JobSpec`), asked over the
    port's control client ``ctl``: does it still hold it (its id and token), and, where it counts
    them, how many of the job's datagrams it accepted, with its counters (the emulator; total loss
    is found with them).  One control request, ``status`` with ``jobs_only`` (the emulator answers
    its status, BMv2's control agent its job list without a P4Runtime session).  ``held`` is None
    when it cannot tell (no job list in the answer, an error)."""
    try:
        status = ctl.request("status", jobs_only=True)
    except HomAggError:
        return JobSighting(None)
    jobs = status.get("jobs")
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        return JobSighting(None)
    mine = [j for j in jobs if j.get("job_id") == job.job_id and j.get("token") == job.token]
    if not mine:
        return JobSighting(False)
    packets, counters = mine[0].get("packets"), status.get("counters")
    return JobSighting(True, packets if isinstance(packets, int) else None,
                       {k: v for k, v in counters.items() if isinstance(v, int)} if isinstance(counters, dict) else {})
