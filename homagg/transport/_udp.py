"""UdpSwitchPort: the switch contract over UDP to the emulator or a BMv2 switch.

A round's streams are cut into chunks of at most K = ``words_per_packet`` words.  Chunks carry a
*global* sequence number ``g`` (continuing across rounds, identical on every worker of the job):

* slot ``slot_base + g % n_slots``, bank ``(g // n_slots) % 2`` (alternates on each reuse),
* tag ``g % 2**16`` (lets the switch tell a late copy from the next use of a bank),
* offset = word offset of the chunk within its stream.

Self-clocking (SwitchML): a chunk is sent into a slot only after the result of the slot's previous
chunk came back, and at most a congestion window of chunks (at most ``n_slots``) is in flight:
AIMD, with the reordering a software switch does tolerated (:mod:`._window`).  A chunk without result after its RTO
is resent with ``FLAG_RETRANSMIT``; the switch answers a retransmission of a completed slot from
its shadow copy.  The RTO is RFC 6298's, per port (= per job and slot window), with Karn's rule,
exponential backoff and a floor for a software switch (:mod:`._rto`).  Fast retransmit: every
worker sends chunks in index order, so results mostly complete in index order; a result for chunk
``c`` while chunk ``i < c - DUPTHRESH`` (sent once) is still outstanding means ``i`` or its result
was lost, and ``i`` is resent at once (no backoff; the timer stays the backstop, e.g. for the last
chunks of a round).  A stalled round whose switch is gone (control port refusing, data port
answering ICMP port unreachable) raises within a few RTOs (:mod:`._liveness`).  When no result
arrived for a whole RTO, an expiry resends only the oldest chunk and restarts the others.
Duplicated, reordered and stale results are ignored (matched on slot, bank, tag, offset), and so
are results without the job's token (wire v2; a forged result from an off-path host).

``stats``: ``packets`` sent (first copies), ``retransmits`` (``fast_retransmits`` of them early),
``spurious_retransmits`` (a second result copy of the chunk arrived: the switch had counted the
first), ``results``, ``ignored`` (no result of this job), ``group_probes`` (other workers' probes
of the result group), ``rounds``, ``rtt_samples``, ``rto_backoffs``, ``srtt_us``, ``rto_us``,
``cwnd``, ``window_cuts``, ``window_undos``, ``send_stalls`` (sends that found the send buffer
full: the rest waited for room), ``gso`` (native: runs of chunks leave as UDP GSO messages).

Result arrays of the last two rounds are reused once unreferenced (:func:`homagg._buffers.spare_int32`).

Never hangs: when no chunk completes for ``timeout`` seconds, :class:`~homagg.SwitchTimeoutError`
is raised naming the job, the oldest pending slot/bank/offset and the workers the switch has not
heard from for it (asked over the control port when ``control`` is given).  The error object has
attributes ``job_id``, ``slot``, ``bank``, ``offset``, ``stream``, ``missing`` (list or None).

Usage (one process per worker; job admitted once by anyone, e.g. rank 0)::

    from homagg.transport import ControlClient, UdpSwitchPort
    job = ControlClient(ctl_addr).admit(world_size=4, n_slots=64, words_per_packet=2048)  # rank 0
    port = UdpSwitchPort(data_addr, job=job, rank=r, control=ctl_addr)   # registers its address
    out = homagg.allreduce(tensor, port)          # or port.combine([Stream(...), ...])
    port.close()
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._errors import ConfigError, SwitchTimeoutError
from ..jobs import JobSpec
from ..wire import FLAG_RETRANSMIT, TAG_MASK, datagram_len, set_flags
from ._base import Stream, SwitchPort
from ._control import ControlClient, parse_addr
from . import _fastpath as fastpath
from ._datapath import PyDatapath, Round
from .._buffers import spare_int32
from ._sockets import join_results_group, send_datagram, set_buffers
from ._liveness import Liveness
from ._rto import INITIAL_RTO_S, MAX_RTO_S, MIN_RTO_S, RtoEstimator
from ._stall import stall_error
from ._window import INITIAL_WINDOW, CongestionWindow

__all__ = ["UdpSwitchPort", "DUPTHRESH"]

#: later chunks completed before an outstanding one counts as lost (tolerates reordering by < 3)
DUPTHRESH = 3


class UdpSwitchPort(SwitchPort):
    """One worker's UDP port to a homagg switch; see the module docstring for the protocol.

    Either pass ``job`` (a :class:`~homagg.jobs.JobSpec`, e.g. from ``ControlClient.admit``) or
    the fields ``job_id``, ``world_size``, ``slot_base``, ``n_slots``, ``words_per_packet``.
    ``control`` (HOST:PORT of the switch's control port) enables self-registration of this
    worker's source address and missing-worker diagnostics; with ``multicast`` (default) the
    port also joins the job's result multicast group when the switch offers one (``multicast``
    attribute: whether it did), so that the switch sends each result once for all such workers.
    ``secret``: the switch's control secret (default: found as :mod:`._auth` says).  Data packets
    carry ``job.token`` (wire v2), which the switch checks; results with another token are ignored.
    ``window``: chunks in flight at the start (the congestion window then adapts, up to ``n_slots``).
    ``native``: build, send, receive and match datagrams in C with batched syscalls
    (:mod:`._fastpath`; default: where it was built) or in Python (:mod:`._datapath`, the reference).
    ``gso``: native sends as UDP GSO messages (default :func:`._fastpath.gso_default`: physical NICs).
    """

    def __init__(
        self,
        switch: str | tuple[str, int],
        *,
        rank: int,
        job: JobSpec | None = None,
        job_id: int | None = None,
        world_size: int | None = None,
        slot_base: int = 0,
        n_slots: int = 64,
        words_per_packet: int = 32,
        control: str | tuple[str, int] | None = None,
        register: bool = True,
        bind: tuple[str, int] | None = None,
        timeout: float = 30.0,
        rto: float = INITIAL_RTO_S,
        min_rto: float = MIN_RTO_S,
        max_rto: float = MAX_RTO_S,
        multicast: bool = True,
        secret: str | None = None,
        window: int = INITIAL_WINDOW,
        native: bool | None = None,
        gso: bool | None = None,
    ) -> None:
        if job is None:
            if job_id is None or world_size is None:
                raise ConfigError("UdpSwitchPort needs job= or job_id= and world_size=")
            job = JobSpec(job_id, world_size, slot_base, n_slots, words_per_packet)
        self.job = job.validate()
        if not 0 <= rank < job.world_size:
            raise ConfigError(f"rank {rank} outside [0, {job.world_size}) of job {job.job_id}")
        if timeout <= 0 or not 0 < min_rto <= max_rto:
            raise ConfigError("timeouts must be positive and min_rto <= max_rto")
        self.rank = rank
        self.world_size = job.world_size
        self.switch_addr = parse_addr(switch)
        self.timeout, self.max_rto = timeout, max_rto
        self.rtt = RtoEstimator(rto, min_rto, max_rto)
        self.window = CongestionWindow(job.n_slots, window)
        self._liveness = Liveness(parse_addr(control) if control is not None else None)
        self._ctl = ControlClient(control, timeout=min(timeout, 10.0), secret=secret) if control is not None else None
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.msock: socket.socket | None = None  # the result group's socket, when subscribed
        # the send buffer (32 MB) holds a whole window of datagrams: the window, not the buffer,
        # limits what is in flight; should it fill all the same (a shaped link's queue), sending
        # waits for room instead of losing datagrams
        set_buffers(self.sock)
        if bind is not None:
            self.sock.bind(bind)
        self.sock.connect(self.switch_addr)  # picks the local address; only the switch's datagrams arrive
        self.sock.setblocking(False)
        self.local_addr: tuple[str, int] = self.sock.getsockname()
        k, n = job.words_per_packet, job.n_slots
        self._stride = -(-datagram_len(k) // 64) * 64
        self._slotbuf = np.zeros(n * self._stride, dtype=np.uint8)  # slot s's datagram at s * stride
        #: per-datagram work in C (``_fastpath``) or Python (``_datapath``, the reference)
        self.native = fastpath.AVAILABLE if native is None else native
        if self.native and not fastpath.AVAILABLE:
            raise ConfigError("native=True, but the native datapath was not built (no C compiler at install?)")
        self._gso, self._scratch = gso, None  # native: Scratch, made with the port's last socket
        self._seq = 0  # global chunk counter, identical on every worker of the job
        self._spare: list[np.ndarray] = []  # result arrays of the last rounds, reused once unreferenced
        self._last_g = [-1] * n  # per slot: global sequence number of the last chunk completed there
        self._last_retx = [False] * n  # ... whether it was retransmitted (a second result copy = spurious)
        self.stats: dict[str, int] = dict.fromkeys(
            ("packets", "retransmits", "fast_retransmits", "spurious_retransmits", "results", "ignored", "group_probes",
             "rounds", "rtt_samples", "rto_backoffs", "srtt_us", "rto_us"), 0)
        if self._ctl is not None and register:
            try:
                self._ctl.register(job.job_id, rank, self.local_addr)
                if multicast:
                    self.msock = join_results_group(self._ctl, job.job_id, rank, self.local_addr[0])
            except BaseException:
                self.close()
                raise
        self.multicast = self.msock is not None
        self.stats["multicast"] = int(self.multicast)

    # ------------------------------------------------------------------------------------------
    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        srcs = [s.words.detach().cpu().contiguous().numpy() for s in streams]
        outs = [spare_int32(self._spare, a.size) for a in srcs]
        k = self.job.words_per_packet
        chunks: list[tuple[int, int, int, int]] = []  # (stream, offset, word_count, op)
        for j, (s, a) in enumerate(zip(streams, srcs)):
            chunks.extend((j, off, min(k, a.size - off), int(s.op)) for off in range(0, a.size, k))
        self.stats["rounds"] += 1
        if chunks:
            self._run(chunks, srcs, outs, streams)
        self._spare = self._spare[-len(outs):] + outs  # at most two rounds' worth
        # results go back to the device the words came from (only compressed words cross to the host)
        return [torch.from_numpy(o).to(s.words.device) for o, s in zip(outs, streams, strict=True)]

    def _run(self, chunks: list[tuple[int, int, int, int]], srcs: list[np.ndarray], outs: list[np.ndarray],
             streams: Sequence[Stream]) -> None:
        job = self.job
        nslot = job.n_slots
        total = len(chunks)
        seq0 = self._seq
        rnd = Round(job=job, rank=self.rank, seq0=seq0, chunks=chunks, srcs=srcs, outs=outs, bufs=self._slotbuf,
                    stride=self._stride)
        if self.native and self._scratch is None:
            self._scratch = fastpath.Scratch.for_port(self.sock, self.msock, self._gso)
        dp: Any = fastpath.NativeDatapath(rnd, self.sock.fileno(), self._scratch) if self.native else PyDatapath(
            rnd, lambda view: self._send(self.sock.send, view))
        cur, completed = rnd.cur, rnd.completed
        sent_at = [0.0] * nslot
        deadline = [0.0] * nslot
        tries = [0] * nslot
        est = self.rtt
        win = self.window
        last_g, last_retx = self._last_g, self._last_retx
        verify_left = sum(1 for ch in chunks if ch[0] == 0) if streams and streams[0].verify else 0
        low = 0  # every chunk below ``low`` has its result
        fr_next = 0  # chunks below this were already considered for fast retransmit
        nsent = 0  # chunks below this were sent (at least once)
        stats = self.stats

        def resend(s: int, now: float) -> None:
            view = rnd.slot_view(s, cur[s])
            set_flags(view, FLAG_RETRANSMIT)
            self._send(self.sock.send, view)
            tries[s] += 1
            stats["retransmits"] += 1
            deadline[s] = now + min(self.max_rto, est.rto * (2 ** (tries[s] - 1)))

        def fill(now: float) -> bool:
            """Send new chunks while the window allows; True when the socket's send buffer had no
            room for all of them (the rest go when it is writable again: backpressure, not loss)."""
            nonlocal nsent
            lim = min(total, low + win.size)
            if nsent >= lim:
                return False
            ids = list(range(nsent, lim))
            rto = now + est.rto
            for c in ids:
                sl = (seq0 + c) % nslot
                cur[sl] = c
                tries[sl] = 0
                sent_at[sl] = now
                deadline[sl] = rto
            went = dp.send(ids)
            for c in ids[went:]:  # not sent: their slots stay free until the buffer drains
                cur[(seq0 + c) % nslot] = -1
            nsent += went
            stats["packets"] += went
            stats["send_stalls"] = stats.get("send_stalls", 0) + (went < len(ids))
            return went < len(ids)

        now = time.monotonic()
        backlog = fill(now)
        done = 0
        last_progress = now
        next_scan = now + est.rto
        socks = [self.sock] + ([self.msock] if self.msock is not None else [])
        events: list[int] = []
        late: list[tuple[int, int, int]] = []
        while done < total:
            got = 0
            for sock in socks:  # unicast socket (answers), then the result group
                try:
                    dp.recv(sock.fileno(), sock.recv_into, events, late)
                except BlockingIOError:
                    pass
                except ConnectionRefusedError:  # ICMP port unreachable (see _liveness)
                    stats["refused"] = stats.get("refused", 0) + 1
            for lt in late:
                self._late_result(*lt)
            late.clear()
            if events:
                t = time.monotonic()
                sampled = -1.0  # one RTT sample per batch of results (its oldest clean send): as TCP
                for c in events:  # samples once per window without timestamps, at a fraction of the cost
                    g = seq0 + c
                    s = g % nslot
                    if verify_left and chunks[c][0] == 0:
                        verify_left -= 1
                        if not verify_left:  # stream 0 is back: out of step -> raise now, not at timeout
                            self._verify_early(streams[0], outs[0], seq0 + total)
                    if tries[s] == 0 and sampled < 0:  # Karn: a retransmitted chunk's RTT is ambiguous
                        sampled = t - sent_at[s]
                    last_g[s], last_retx[s] = g, tries[s] > 0
                    while low < total and completed[low]:
                        low += 1
                    win.on_result()
                    if c - DUPTHRESH > fr_next:  # fast retransmit of chunks overtaken by later results
                        for i in range(max(fr_next, low), c - DUPTHRESH):
                            si = (seq0 + i) % nslot
                            if cur[si] == i and tries[si] == 0:
                                win.on_loss(seq0 + i, seq0 + nsent)
                                resend(si, t)
                                stats["fast_retransmits"] += 1
                        fr_next = c - DUPTHRESH
                if sampled >= 0:
                    est.sample(sampled)
                got = len(events)
                done += got
                stats["results"] += got
                events.clear()
                backlog = fill(t)
            elif backlog:
                backlog = fill(time.monotonic())
            now = time.monotonic()
            if got:
                last_progress = now
            if done >= total:
                break
            if now >= next_scan:
                next_scan = now + est.rto
                expired = [s for s in range(nslot) if cur[s] >= 0 and now >= deadline[s]]
                # stalled (no result for a whole RTO): a late peer or switch, or all lost -- resend only
                # the oldest chunk as a probe and restart the others' timers (TCP resends one segment)
                probe = min(expired, key=cur.__getitem__) if expired and now - last_progress >= est.rto else -1
                for s in expired:
                    if probe < 0 or s == probe:
                        est.expired(now)
                        resend(s, now)
                    else:
                        deadline[s] = now + est.rto
                for s in range(nslot):
                    if cur[s] >= 0:
                        next_scan = min(next_scan, deadline[s])
                stats["refused"] = stats.get("refused", 0) + rnd.refused
                rnd.refused = 0
                gone = self._liveness.gone(now, now - last_progress, stats.get("refused", 0))
                if gone or now - last_progress > self.timeout:
                    self._seq = seq0 + total  # keep the sequence aligned if the caller retries the job
                    self._count(rnd)
                    raise self._timeout_error(chunks, list(cur), seq0, streams, now - last_progress, gone)
                if expired or self._liveness.control is not None:
                    next_scan = min(next_scan, now + self._liveness.interval_s)
            if not got:
                select.select(socks, [self.sock] if backlog else [], [],
                              max(0.0, min(next_scan, last_progress + self.timeout) - now) + 1e-4)
        self._seq = seq0 + total
        self._count(rnd)

    def _count(self, rnd: Round) -> None:
        """Move the datapath's counts into ``stats``; sync the timer and window state."""
        st = self.stats
        st["ignored"] += rnd.ignored
        if self._scratch is not None:
            st["gso"] = self._scratch.gso.value
        st["group_probes"] += rnd.probes
        if rnd.refused:
            st["refused"] = st.get("refused", 0) + rnd.refused
        rnd.ignored = rnd.probes = rnd.refused = 0
        self._sync_rtt_stats()

    def _verify_early(self, stream: Stream, words: np.ndarray, next_seq: int) -> None:
        """Run ``stream.verify`` on its combined words; if it raises, the round is abandoned (the
        sequence moves past it) and the error propagates at once."""
        assert stream.verify is not None
        try:
            stream.verify(torch.from_numpy(words.copy()))
        except BaseException:
            self._seq = next_seq
            self._sync_rtt_stats()
            raise

    def _late_result(self, s: int, tag: int, bank: int) -> None:
        """Count a result that matches no outstanding chunk; a second copy of a retransmitted,
        already completed chunk proves the retransmission spurious (counted once per chunk)."""
        self.stats["ignored"] += 1
        g = self._last_g[s]
        if g >= 0 and self._last_retx[s] and tag == g & TAG_MASK and bank == (g // self.job.n_slots) & 1:
            self.stats["spurious_retransmits"] += 1
            self._last_retx[s] = False
            self.window.on_spurious()

    def _sync_rtt_stats(self) -> None:
        est = self.rtt
        st = self.stats
        st["rtt_samples"], st["rto_backoffs"] = est.samples, est.backoffs
        st["srtt_us"] = round(1e6 * (est.srtt or 0.0))
        st["rto_us"] = round(1e6 * est.rto)
        win = self.window
        st["cwnd"], st["window_cuts"], st["window_undos"] = win.size, win.reductions, win.undos

    # ------------------------------------------------------------------------------------------
    def _send(self, send: Any, dgram: memoryview) -> None:
        send_datagram(self.sock, send, dgram, self.stats,
                      lambda: f"job {self.job.job_id} worker {self.rank}: sending to {self.switch_addr}")

    def _timeout_error(self, chunks: list[tuple[int, int, int, int]], cur: list[int], seq0: int,
                       streams: Sequence[Stream], stalled_s: float, gone: str | None) -> SwitchTimeoutError:
        job = self.job
        pending = [c for c in cur if c >= 0]
        oldest = min(pending)
        g = seq0 + oldest
        j, off, _wc, _op = chunks[oldest]
        return stall_error(self._ctl, job.job_id, self.rank, stalled_s, job.slot_base + g % job.n_slots,
                           (g // job.n_slots) & 1, streams[j].name, off, len(pending), self.stats.get("refused", 0),
                           gone=None if gone is None else f"the switch at {self.switch_addr[0]}:{self.switch_addr[1]} "
                                                          f"is gone: {gone}")

    def close(self) -> None:
        self._spare = []
        self.sock.close()
        if self.msock is not None:
            self.msock.close()
        if self._ctl is not None:
            self._ctl.close()

