"""One round of a :class:`~homagg.transport.UdpSwitchPort`: the self-clocked loop over its chunks.

The protocol is the one :mod:`._udp`'s docstring describes (window, RTO, fast retransmit, stall
probe, liveness, progress timeout).  It runs in one of two loops, which make the same decisions:

* :meth:`RoundLoop.run_python` -- the reference: one Python iteration per batch of results and one
  per result inside it, around either datapath (:class:`._datapath.PyDatapath` or, with the
  native one built, its batch calls);
* :meth:`RoundLoop.run_native` -- the per-result work in C (``homagg/transport/_fastround.c``:
  receive, match, RTT sample, window, fast retransmit, fill, poll), returning to Python only for
  the timer scan (a few milliseconds apart), stream 0's early verification and errors.

Both share :meth:`RoundLoop.scan` (expired timers, the stall probe, liveness, the timeout) and the
per-slot state (:class:`._datapath.Round`: ``cur``, ``tries``, ``sent_at``, ``deadline``; the port's
``last_g``/``last_retx`` across rounds).  Invariant of either loop: it returns only when every
chunk's result was copied into the outputs (then ``port._seq`` moves past the round), and raises
:class:`~homagg.SwitchTimeoutError` when no chunk completed for ``port.timeout`` seconds.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..wire import FLAG_RETRANSMIT, TAG_MASK, set_flags
from ._datapath import Round
from .._errors import RankTimeoutError
from ._stall import stall_error

__all__ = ["RoundLoop", "DUPTHRESH", "SCAN_SLICE_S"]

#: later chunks completed before an outstanding one counts as lost (tolerates reordering by < 3)
DUPTHRESH = 3
#: the native loop returns to Python at least this often (its RTO for new deadlines is Python's)
SCAN_SLICE_S = 0.005


class RoundLoop:
    """Runs one round of ``port`` (a :class:`~homagg.transport.UdpSwitchPort`, whose timers, window
    and counters it updates) over ``rnd`` with datapath ``dp``; see the module docstring.
    ``names``: the streams' (for errors); ``verify``: stream 0's verifier, called with a copy of its
    combined words (:meth:`verify_early`), or None."""

    def __init__(self, port: Any, rnd: Round, dp: Any, names: Sequence[str],
                 verify: Callable[[np.ndarray], None] | None = None) -> None:
        self.port, self.r, self.dp, self.names, self.verify = port, rnd, dp, names, verify
        self.stats = port.stats
        #: chunks of stream 0 (the first rows of the table) still to complete, when it has a verifier
        self.verify_left = rnd.n0 if verify is not None else 0
        self.low = 0  # every chunk below ``low`` has its result
        self.fr_next = 0  # chunks below this were already considered for fast retransmit
        self.nsent = 0  # chunks below this were sent (at least once)
        self.done = 0
        self.backlog = False
        now = time.monotonic()
        self.last_progress = now
        self.next_scan = now + port.rtt.rto

    # ---------------------------------------------------------------- shared by both loops
    def resend(self, s: int, now: float) -> None:
        r, port = self.r, self.port
        view = r.slot_view(s, r.cur[s])
        set_flags(view, FLAG_RETRANSMIT)
        port._send(port.sock.send, view)
        r.tries[s] += 1
        self.stats["retransmits"] += 1
        r.deadline[s] = now + min(port.max_rto, port.rtt.rto * (2 ** (r.tries[s] - 1)))

    def scan(self, now: float) -> None:
        """The timer scan, due at ``next_scan``: resend expired chunks (only the oldest as a probe
        when nothing completed for a whole RTO: TCP resends one segment), check liveness and the
        progress timeout (raises), schedule the next scan."""
        r, port, est, stats = self.r, self.port, self.port.rtt, self.stats
        cur, deadline = r.cur, r.deadline
        self.next_scan = now + est.rto
        expired = [s for s in range(r.nslot) if cur[s] >= 0 and now >= deadline[s]]
        probe = min(expired, key=cur.__getitem__) if expired and now - self.last_progress >= est.rto else -1
        for s in expired:
            if probe < 0 or s == probe:
                est.expired(now)
                self.resend(s, now)
            else:
                deadline[s] = now + est.rto
        for s in range(r.nslot):
            if cur[s] >= 0:
                self.next_scan = min(self.next_scan, deadline[s])
        stats["refused"] = stats.get("refused", 0) + r.refused
        r.refused = 0
        again = stats["retransmits"] + stats.get("loss_probes", 0)
        gone = port._liveness.gone(now, now - self.last_progress, stats.get("refused", 0), again)
        peers = port.peers
        dead: tuple[int, ...] = ()  # the peer ranks known gone that the switch still waits for
        if not gone and peers is not None:  # the switch is there: is a peer rank it waits for gone?
            left = peers.gone(now, now - self.last_progress)
            if left is not None and self._waits_for(peers.dead):
                gone, dead = left, peers.dead
        if gone or now - self.last_progress > port.timeout:
            port._seq = r.seq0 + r.total  # keep the sequence aligned if the caller retries the job
            self.finish()
            raise self._timeout_error(now - self.last_progress, gone, dead)
        self.send_probes(port._liveness.take_probes())
        if expired or port._liveness.control is not None:
            self.next_scan = min(self.next_scan, now + port._liveness.interval_s)
        if peers is not None:
            self.next_scan = min(self.next_scan, now + peers.interval_s)

    def send_probes(self, n: int) -> None:
        """Send ``n`` copies of the oldest pending chunk, marked as retransmissions: the liveness
        probe's test of whether the switch counts this job's datagrams (``loss_probes``)."""
        r = self.r
        pending = [s for s in range(r.nslot) if r.cur[s] >= 0]
        if n <= 0 or not pending:
            return
        s = min(pending, key=r.cur.__getitem__)
        view = r.slot_view(s, r.cur[s])
        set_flags(view, FLAG_RETRANSMIT)
        for _ in range(n):
            self.port._send(self.port.sock.send, view)
        self.stats["loss_probes"] = self.stats.get("loss_probes", 0) + n

    def verify_early(self) -> None:
        """Run stream 0's ``verify`` on its combined words; if it raises, the round is abandoned
        (the sequence moves past it) and the error propagates at once."""
        port = self.port
        assert self.verify is not None
        try:
            self.verify(self.r.outs[0].copy())
        except BaseException:
            port._seq = self.r.seq0 + self.r.total
            port._sync_rtt_stats()
            raise

    def finish(self) -> None:
        """Move the datapath's counts into ``stats``; sync the timer and window state."""
        st, rnd, port = self.stats, self.r, self.port
        st["ignored"] += rnd.ignored
        if port._scratch is not None:
            st["gso"] = port._scratch.gso.value
        st["group_probes"] += rnd.probes
        if rnd.refused:
            st["refused"] = st.get("refused", 0) + rnd.refused
        rnd.ignored = rnd.probes = rnd.refused = 0
        port._sync_rtt_stats()

    def _oldest(self) -> tuple[int, int, int, int]:
        """(pending chunks, the oldest pending chunk's index, its slot, its bank)."""
        r, job = self.r, self.port.job
        pending = [c for c in r.cur if c >= 0]
        oldest = min(pending)
        g = r.seq0 + oldest
        return len(pending), oldest, job.slot_base + g % job.n_slots, (g // job.n_slots) & 1

    def _waits_for(self, dead: tuple[int, ...]) -> bool:
        """Whether this round may still wait for one of the ``dead`` peer ranks: unless the switch
        says (control port, a flat job: worker index = rank) that it has every one of their words
        for the oldest pending chunk (then a lost result keeps the round waiting, not a dead rank;
        the round's timeout names that).  Asking fails open: True."""
        port = self.port
        if port._ctl is None or port.world_size != port.job.world_size:
            return True
        _, _, slot, bank = self._oldest()
        try:
            missing = port._ctl.slot_status(port.job.job_id, slot)["banks"][bank]["missing"]
        except Exception:  # noqa: BLE001 - cannot tell: the peers' evidence stands
            return True
        return any(rank in missing for rank in dead)

    def _timeout_error(self, stalled_s: float, gone: str | None, ranks: tuple[int, ...] = ()) -> Exception:
        """The stall's error: ``gone`` says why the switch (or, with ``ranks``, those peer ranks) is
        known gone, or None at the progress timeout."""
        r, port = self.r, self.port
        job = port.job
        pending, oldest, slot, bank = self._oldest()
        j, off = int(r.table[oldest, 0]), int(r.table[oldest, 1])
        addr = port.switch_addr
        err = stall_error(port._ctl, job.job_id, port.rank, stalled_s, slot, bank, self.names[j], off, pending,
                          self.stats.get("refused", 0),
                          gone=None if gone is None else gone if ranks else f"the switch at {addr[0]}:{addr[1]} {gone}",
                          ranks=ranks)
        missing = getattr(err, "missing", None)
        if gone is None and port.patient_wait and missing:  # a patient wait (a barrier) for live ranks that never came
            flat = port.world_size == job.world_size  # worker index == group rank (not a tree's leaf)
            late = RankTimeoutError(f"{err} (a patient wait: worker(s) {missing} did not arrive within its "
                                    f"timeout of {port.timeout:.1f}s)", tuple(missing) if flat else ())
            late.job_id, late.slot, late.missing = err.job_id, err.slot, missing  # type: ignore[attr-defined]
            return late
        return err

    # ---------------------------------------------------------------- the reference loop
    def fill(self, now: float) -> bool:
        """Send new chunks while the window allows; True when the socket's send buffer had no
        room for all of them (the rest go when it is writable again: backpressure, not loss)."""
        r, stats = self.r, self.stats
        lim = min(r.total, self.low + self.port.window.size)
        if self.nsent >= lim:
            return False
        ids = list(range(self.nsent, lim))
        rto = now + self.port.rtt.rto
        seq0, nslot, cur, tries, sent_at, deadline = r.seq0, r.nslot, r.cur, r.tries, r.sent_at, r.deadline
        for c in ids:
            sl = (seq0 + c) % nslot
            cur[sl] = c
            tries[sl] = 0
            sent_at[sl] = now
            deadline[sl] = rto
        went = self.dp.send(ids)
        for c in ids[went:]:  # not sent: their slots stay free until the buffer drains
            cur[(seq0 + c) % nslot] = -1
        self.nsent += went
        stats["packets"] += went
        stats["send_stalls"] = stats.get("send_stalls", 0) + (went < len(ids))
        return went < len(ids)

    def late_result(self, s: int, tag: int, bank: int) -> None:
        """Count a result that matches no outstanding chunk; a second copy of a retransmitted,
        already completed chunk proves the retransmission spurious (counted once per chunk)."""
        port = self.port
        self.stats["ignored"] += 1
        g = port._last_g[s]
        if g >= 0 and port._last_retx[s] and tag == g & TAG_MASK and bank == (g // port.job.n_slots) & 1:
            self.stats["spurious_retransmits"] += 1
            port._last_retx[s] = 0
            port.window.on_spurious()

    def on_results(self, events: list[int], t: float) -> None:
        """Per completed chunk, in arrival order: stream 0's countdown, one RTT sample per batch,
        the slot's last chunk, the lowest incomplete chunk, window growth, fast retransmit."""
        r, port = self.r, self.port
        seq0, nslot, total, cur, tries, completed = r.seq0, r.nslot, r.total, r.cur, r.tries, r.completed
        last_g, last_retx, win, stats = port._last_g, port._last_retx, port.window, self.stats
        sampled = -1.0  # one RTT sample per batch of results (its oldest clean send): as TCP
        for c in events:  # samples once per window without timestamps, at a fraction of the cost
            g = seq0 + c
            s = g % nslot
            if self.verify_left and c < r.n0:
                self.verify_left -= 1
                if not self.verify_left:  # stream 0 is back: out of step -> raise now, not at timeout
                    self.verify_early()
            if tries[s] == 0 and sampled < 0:  # Karn: a retransmitted chunk's RTT is ambiguous
                sampled = t - r.sent_at[s]
            last_g[s], last_retx[s] = g, tries[s] > 0
            low = self.low
            while low < total and completed[low]:
                low += 1
            self.low = low
            win.on_result()
            if c - DUPTHRESH > self.fr_next:  # fast retransmit of chunks overtaken by later results
                for i in range(max(self.fr_next, low), c - DUPTHRESH):
                    si = (seq0 + i) % nslot
                    if cur[si] == i and tries[si] == 0:
                        win.on_loss(seq0 + i, seq0 + self.nsent)
                        self.resend(si, t)
                        stats["fast_retransmits"] += 1
                self.fr_next = c - DUPTHRESH
        if sampled >= 0:
            port.rtt.sample(sampled)
        self.done += len(events)
        stats["results"] += len(events)

    def run_python(self) -> None:
        port, r, dp, stats = self.port, self.r, self.dp, self.stats
        self.backlog = self.fill(time.monotonic())
        socks = [port.sock] + ([port.msock] if port.msock is not None else [])
        events: list[int] = []
        late: list[tuple[int, int, int]] = []
        while self.done < r.total:
            for sock in socks:  # unicast socket (answers), then the result group
                try:
                    dp.recv(sock.fileno(), sock.recv_into, events, late)
                except BlockingIOError:
                    pass
                except ConnectionRefusedError:  # ICMP port unreachable (see _liveness)
                    stats["refused"] = stats.get("refused", 0) + 1
            for lt in late:
                self.late_result(*lt)
            late.clear()
            got = len(events)
            if events:
                t = time.monotonic()
                self.on_results(events, t)
                events.clear()
                self.backlog = self.fill(t)
            elif self.backlog:
                self.backlog = self.fill(time.monotonic())
            now = time.monotonic()
            if got:
                self.last_progress = now
            if self.done >= r.total:
                break
            if now >= self.next_scan:
                self.scan(now)
            if not got:
                select.select(socks, [port.sock] if self.backlog else [], [],
                              max(0.0, min(self.next_scan, self.last_progress + port.timeout) - now) + 1e-4)
        port._seq = r.seq0 + r.total
        self.finish()

    # ---------------------------------------------------------------- the native loop
    def run_native(self, run: Any = None, rc: int | None = None) -> None:
        """The native loop; ``run`` and ``rc``: resume a round whose C loop ``run`` (already pulled
        into this loop: :meth:`._fastpath.NativeRound.pull`) last returned ``rc`` (the small-round
        path of :mod:`._roundplan` hands its round over so)."""
        port, r = self.port, self.r
        if run is None:
            run = self.dp.round_run(self, port.msock.fileno() if port.msock is not None else -1)
        while True:
            if rc is None:
                rc = run.step(port.rtt, min(self.next_scan, time.monotonic() + SCAN_SLICE_S))
            if rc == run.VERIFY:
                self.verify_early()
                if self.done < r.total:
                    rc = None
                    continue
                break  # the step that verified completed the round too (the next would return DONE at once)
            if rc == run.DONE:
                break
            rc = None
            now = time.monotonic()
            if now >= self.next_scan or now - self.last_progress > port.timeout:
                self.scan(now)  # its resends change only the slots' state, which C reads in place
        port._seq = r.seq0 + r.total
        self.finish()


def chunk_table(sizes: Sequence[int], ops: Sequence[int], k: int) -> np.ndarray:
    """The round's chunks as rows ``(stream, offset, word_count, op)`` (int32), stream by stream,
    each cut into chunks of at most ``k`` words (no Python object per chunk)."""
    parts = []
    for j, (n, op) in enumerate(zip(sizes, ops, strict=True)):
        offs = np.arange(0, n, k, dtype=np.int64)
        t = np.empty((offs.size, 4), dtype=np.int32)
        t[:, 0], t[:, 1], t[:, 2], t[:, 3] = j, offs, np.minimum(k, n - offs), op
        parts.append(t)
    return np.concatenate(parts) if parts else np.empty((0, 4), dtype=np.int32)
