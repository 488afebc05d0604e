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
question the port asks over its authenticated control client), once the round has stalled for
``job_stall_s`` (2 s) the probe also asks, at most every ``job_interval_s``, whether the switch
still holds this job (its id *and* token: a new job that reuses the id is not ours); a definite
"no" is positive evidence too.  "Cannot tell" (no job list, an error) never is.

Invariant: ``gone`` returns a reason only on positive evidence (a refused or timed-out connect,
refusals on the data port, or the switch saying it does not hold the job); then the caller raises
at once instead of at the timeout.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

__all__ = ["Liveness", "control_silent"]


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
                 job_known: Callable[[], bool | None] | None = None, job_stall_s: float = 2.0,
                 job_interval_s: float = 1.0) -> None:
        self.control = control
        self.interval_s, self.connect_timeout_s = interval_s, connect_timeout_s
        self.min_stall_s, self.no_control_stall_s = min_stall_s, no_control_stall_s
        self.job_known, self.job_stall_s, self.job_interval_s = job_known, job_stall_s, job_interval_s
        self._next = 0.0
        self._next_job = 0.0
        self.probes = 0
        self.job_probes = 0

    def gone(self, now: float, stalled_s: float, refused: int) -> str | None:
        """Why the switch is gone, or None (alive, or not probed yet)."""
        if stalled_s < self.min_stall_s or now < self._next:
            return None
        self._next = now + self.interval_s
        if self.control is None:
            if refused and stalled_s >= self.no_control_stall_s:
                return f"its data port refused {refused} datagrams (ICMP port unreachable)"
            return None
        self.probes += 1
        why = control_silent(self.control, self.connect_timeout_s)
        if why is None:
            return self._job_gone(now, stalled_s)
        if refused:
            why += f", and its data port refused {refused} datagrams (ICMP port unreachable)"
        return why

    def _job_gone(self, now: float, stalled_s: float) -> str | None:
        """The control port answers: does the switch still hold the job?  (None: yes, or cannot tell.)"""
        if self.job_known is None or stalled_s < self.job_stall_s or now < self._next_job:
            return None
        self._next_job = now + self.job_interval_s
        self.job_probes += 1
        if self.job_known() is False:
            return ("its control port answers, but it no longer holds this job (restarted or reprogrammed: "
                    "the job's admission is lost)")
        return None

