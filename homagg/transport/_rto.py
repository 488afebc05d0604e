"""Retransmission timer of a worker port (RFC 6298, adapted to a slot window).

One estimator per port, i.e. per (job, slot window): every RTT sample is the time from sending a
chunk into a slot to its result, so it includes the queueing of the window at the switch and the
wait for the slowest worker -- exactly what the timer must outwait.

* samples: ``SRTT``/``RTTVAR`` as in RFC 6298 (alpha 1/8, beta 1/4; the first sample sets
  ``SRTT = R``, ``RTTVAR = R/2``); ``RTO = SRTT + max(G, 4 * RTTVAR)`` clamped to
  ``[min_rto, max_rto]``;
* Karn's rule: the caller never samples a chunk that was retransmitted (ambiguous);
* backoff: a timer expiry doubles ``RTO`` (up to ``max_rto``), at most once per RTO period (many
  slots expiring together are one congestion event); the next valid sample recomputes it;
* the floor ``min_rto`` is for a *software* switch on a shared host: scheduling delays of tens of
  milliseconds are normal there, so the default floor (0.2 s, Linux TCP's) sits well above them;
  ``G`` is the granularity of the port's timer scan.

Invariants: ``min_rto <= rto <= max_rto`` at all times; no sample is taken from a retransmitted
chunk; ``rto`` never shrinks on a timeout.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import ConfigError

__all__ = ["RtoEstimator", "MIN_RTO_S", "INITIAL_RTO_S", "MAX_RTO_S", "GRANULARITY_S"]

MIN_RTO_S = 0.2  #: floor for a software switch on a loaded host
INITIAL_RTO_S = 1.0  #: before the first sample (RFC 6298: 1 s)
MAX_RTO_S = 2.0  #: backoff ceiling (the port's progress timeout bounds the wait anyway)
GRANULARITY_S = 0.005  #: timer scan granularity G


class RtoEstimator:
    """SRTT / RTTVAR / RTO of one port (see the module docstring)."""

    def __init__(self, initial: float = INITIAL_RTO_S, min_rto: float = MIN_RTO_S, max_rto: float = MAX_RTO_S,
                 granularity: float = GRANULARITY_S) -> None:
        if not (0 < min_rto <= max_rto and initial > 0 and granularity >= 0):
            raise ConfigError(f"bad RTO bounds: initial={initial} min={min_rto} max={max_rto} G={granularity}")
        self.min_rto, self.max_rto, self.granularity = min_rto, max_rto, granularity
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = min(max_rto, max(min_rto, initial))
        self.samples = 0
        self.backoffs = 0
        self._backed_off_at = float("-inf")

    def sample(self, r: float) -> None:
        """Take one RTT measurement (seconds) of a chunk sent exactly once (Karn's rule)."""
        self.take((r,))

    def take(self, rs: Sequence[float]) -> None:
        """Take RTT measurements ``rs`` in order (each as :meth:`sample` takes one), in one call: the
        native round loop hands its RTT samples over so."""
        if not rs:
            return
        srtt, rttvar = self.srtt, self.rttvar
        for r in rs:
            if srtt is None:
                srtt, rttvar = r, r / 2
            else:
                rttvar = 0.75 * rttvar + 0.25 * abs(srtt - r)
                srtt = 0.875 * srtt + 0.125 * r
        self.srtt, self.rttvar = srtt, rttvar
        self.samples += len(rs)
        self.rto = min(self.max_rto, max(self.min_rto, srtt + max(self.granularity, 4 * rttvar)))

    def expired(self, now: float) -> None:
        """A retransmission timer fired at ``now``: back off (once per RTO period)."""
        if now - self._backed_off_at >= self.rto:
            self.rto = min(self.max_rto, 2 * self.rto)
            self._backed_off_at = now
            self.backoffs += 1
