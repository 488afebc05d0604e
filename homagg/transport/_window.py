"""Congestion window of a worker port: how many slots it keeps in flight (AIMD, as TCP Reno does).

SwitchML's self-clocking fills the job's whole slot pool at once and keeps it full.  A switch with
short queues cannot take that: BMv2 1.15.5 drops silently once its queues are full (64 packets per
egress port; neither its P4Runtime server nor its command line sets the depth), and four workers
filling a 64-slot pool each send 256 datagrams at once.  (The loss first measured there -- 7% of
first sends, every rank retransmitting a third with the old fast-retransmit rule -- was mostly
libpcap's capture ring on BMv2's ports, ~30 frames while the veth has segmentation offloads on;
``topologies/bmv2.py`` turns them off, after which a lossless BMv2 run retransmits nothing.)  The window bounds the
chunks a worker has sent whose results have not come back, between ``floor`` and ``limit`` (the
job's ``n_slots``):

* additive increase from the start: +1/window per result (one chunk per round trip; the initial
  window is the slow-start threshold, so a port never doubles into a short queue);
* a loss (a fast retransmit: results of later chunks overtook the chunk) halves the window, once
  per window of data (NewReno's ``recover`` point: losses of chunks sent before the cut are the
  same congestion event), never below ``floor``;
* a retransmission later proven spurious (the switch answered it with a second result copy: the
  first was only late) undoes the last cut.

Why a floor (16 chunks) and no cut on timer expiries: in an aggregation every worker waits for
the slowest contribution, so a worker's timer often expires for another worker's loss, and a
window below ~16 leaves too few later results to detect a loss by overtaking -- every loss then
waits a whole RTO (measured on the emulator with 5% drop/duplicate/reorder: 122-258 s instead of
35 s).  Growing the fast-retransmit threshold on spurious retransmissions (Linux's reordering
metric) was measured too and dropped for the same reason: a "spurious" retransmission here mostly
means another worker's datagram was lost, not that the switch reordered.

Invariants: ``floor <= size <= limit``; one reduction per loss event.  The window persists across
rounds (the port's rounds are one stream of global chunk numbers).
"""

from __future__ import annotations

__all__ = ["CongestionWindow", "INITIAL_WINDOW", "MIN_WINDOW"]

#: chunks in flight when a port starts (and the slow-start threshold)
INITIAL_WINDOW = 16
#: the window never shrinks below this (see the module docstring)
MIN_WINDOW = 16


class CongestionWindow:
    """AIMD window of one port over ``limit`` slots; see the module docstring."""

    def __init__(self, limit: int, initial: int = INITIAL_WINDOW, floor: int = MIN_WINDOW) -> None:
        self.limit = limit
        self.floor = float(max(1, min(limit, floor)))
        self.cwnd = float(max(self.floor, min(limit, initial)))
        self.ssthresh = self.cwnd
        self.recover = -1  # global chunk number: losses of chunks below it belong to the last cut
        self.reductions = 0
        self.undos = 0
        self._before_cut: tuple[float, float] | None = None

    @property
    def size(self) -> int:
        """Chunks that may be in flight now (``floor``..``limit``)."""
        return int(self.cwnd)

    def on_result(self) -> None:
        """A chunk's result came back: grow (slow start below ``ssthresh``, else +1/window)."""
        c = self.cwnd
        if c < self.limit:
            self.cwnd = min(float(self.limit), c + (1.0 if c < self.ssthresh else 1.0 / c))

    def on_loss(self, lost: int, next_new: int) -> None:
        """Chunk ``lost`` (global number) is being resent; ``next_new``: the next chunk not yet
        sent.  Halves the window unless this loss belongs to the last cut."""
        if lost < self.recover:
            return
        self._before_cut = (self.cwnd, self.ssthresh)
        self.ssthresh = max(self.floor, self.cwnd / 2)
        self.cwnd = self.ssthresh
        self.recover = next_new
        self.reductions += 1

    def on_spurious(self) -> None:
        """A retransmission proved unnecessary (a late result, not a loss): undo the last cut."""
        if self._before_cut is not None:
            self.cwnd, self.ssthresh = max(self.cwnd, self._before_cut[0]), self._before_cut[1]
            self._before_cut = None
            self.undos += 1
