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
answering ICMP port unreachable), or that holds the job but accepts none of its datagrams, raises
within about a second (:mod:`._liveness`).  When no result
arrived for a whole RTO, an expiry resends only the oldest chunk and restarts the others.
Duplicated, reordered and stale results are ignored (matched on slot, bank, tag, offset), and so
are results without the job's token (wire v2; a forged result from an off-path host).

``stats``: ``packets`` sent (first copies), ``retransmits`` (``fast_retransmits`` of them early),
``spurious_retransmits`` (a second result copy of the chunk arrived: the switch had counted the
first), ``results``, ``ignored`` (no result of this job), ``group_probes`` (other workers' probes
of the result group), ``rounds``, ``rtt_samples``, ``rto_backoffs``, ``srtt_us``, ``rto_us``,
``cwnd``, ``window_cuts``, ``window_undos``, ``send_stalls`` (sends that found the send buffer
full: the rest waited for room), ``gso`` (native: runs of chunks leave as UDP GSO messages),
``loss_probes`` (copies of a stalled round's oldest datagram the liveness probe sent to see whether
the switch counts them: :mod:`._liveness`).

Where the native datapath was built, the per-result part of this protocol runs in C
(:mod:`._roundloop`: ``homagg/transport/_fastround.c``), the timer scan, liveness and errors in
Python; ``native=False`` (or ``HOMAGG_NATIVE=0``) runs all of it in Python, the reference.

A stream with a :class:`~homagg.transport.WordSource` that has a native fill function has its
datagrams' payloads written by that function when the native datapath builds them (the dense
scheme's words quantised straight into the datagrams); the Python datapath sends its
materialised words, the reference.

:meth:`UdpSwitchPort.combine`'s result arrays are reused once unreferenced (the caller owns the
returned tensors: an array is handed out again only when no tensor, view or array made from it is
alive): a round of at most :data:`._roundplan.KEPT_WORDS` words takes them from its plan (2 per
stream and their addresses: :class:`homagg._buffers.KeptResults`, no scan), a larger one from the
result arrays of the last rounds (:data:`SPARE_ARRAYS` arrays: the rounds of the pipeline's three
segments in flight and one more; :func:`homagg._buffers.spare_int32`).

A round's set-up (chunk table, per-slot state, the native datapath's and C loop's structures) is
made once per round shape (the streams' lengths and ops) and kept (:mod:`._roundplan`; a round then
refills its sequence number and addresses).  :meth:`UdpSwitchPort.combine_arrays`, the small-call
path, runs the same rounds on host int32 arrays: no tensor, and a small round's words copied
through the plan's own arrays; it and :meth:`UdpSwitchPort.combine` interleave freely on a port.

Never hangs: when no chunk completes for ``timeout`` seconds, :class:`~homagg.SwitchTimeoutError`
is raised naming the job, the oldest pending slot/bank/offset and the workers the switch has not
heard from for it (asked over the control port when ``control`` is given).  The error object has
attributes ``job_id``, ``slot``, ``bank``, ``offset``, ``stream``, ``missing`` (list or None).
Inside :meth:`UdpSwitchPort.patient` (a barrier) that timeout is the caller's, and a peer rank
known dead (:attr:`UdpSwitchPort.peers`: :mod:`._peers`) ends a stalled round within about a
second with :class:`~homagg.RankTimeoutError` naming it.

Usage (one process per worker; job admitted once by anyone, e.g. rank 0)::

    from homagg.transport import ControlClient, UdpSwitchPort
    job = ControlClient(ctl_addr).admit(world_size=4, n_slots=64, words_per_packet=2048)  # rank 0
    port = UdpSwitchPort(data_addr, job=job, rank=r, control=ctl_addr)   # registers its address
    out = homagg.allreduce(tensor, port)          # or port.combine([Stream(...), ...]), port.combine_arrays(...)
    port.close()
"""

from __future__ import annotations

import contextlib
import socket
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .._errors import ConfigError
from ..jobs import JobSpec
from ..wire import CombineOp, datagram_len
from ._base import CheckOnce, OwnRound, Stream, SwitchPort, array_lengths
from ._control import ControlClient, parse_addr
from . import _fastpath as fastpath
from .._buffers import spare_int32
from ._sockets import join_results_group, send_datagram, set_buffers
from ._liveness import Liveness, job_sighting
from ._peers import PeerWatch
from ._rto import INITIAL_RTO_S, MAX_RTO_S, MIN_RTO_S, RtoEstimator
from ._roundloop import DUPTHRESH
from ._stall import patient_wait
from ._roundplan import OWN_WORDS, PLANS, SMALL_WORDS, RoundPlan
from ._window import INITIAL_WINDOW, CongestionWindow

__all__ = ["UdpSwitchPort", "DUPTHRESH", "SPARE_ARRAYS"]

#: result arrays kept for reuse: a round has up to 4 streams (descriptor, exponents, guesses,
#: values) and up to 3 segments' rounds are in flight (``homagg.codec._pipeline.DEPTH``); with only
#: the last two rounds' arrays kept, 2 of a 25M call's 3 segments found none of their size and
#: page-faulted a fresh 32 MB array every call
SPARE_ARRAYS = 16
#: the source array of a stream whose datagrams a native fill function writes
_NO_WORDS = np.zeros(0, dtype=np.int32)
_NO_WORDS_AT = _NO_WORDS.ctypes.data


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
    ``gso``: native sends as UDP GSO messages (default :func:`._sockets.gso_default`: loopback and physical NICs).
    ``total_world_size``: the ranks of the whole job when ``switch`` is a leaf of a tree (docs/trees.md;
    ``rank`` is then this worker's id at the leaf): :attr:`world_size`, which sets the codec's
    headroom, is the whole job's (default: the job's ``world_size`` at this switch).
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
        total_world_size: int | None = None,
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
        if total_world_size is not None and total_world_size < job.world_size:
            raise ConfigError(f"total_world_size {total_world_size} < the leaf's {job.world_size} workers")
        self.rank = rank
        self.world_size = job.world_size if total_world_size is None else total_world_size
        self.switch_addr = parse_addr(switch)
        self.timeout, self.max_rto = timeout, max_rto
        self.rtt = RtoEstimator(rto, min_rto, max_rto)
        self.window = CongestionWindow(job.n_slots, window)
        self._ctl = ControlClient(control, timeout=min(timeout, 10.0), secret=secret) if control is not None else None
        self._liveness = Liveness(parse_addr(control) if control is not None else None,
                                  job_known=(lambda: job_sighting(self._ctl, self.job)) if self._ctl is not None else None)
        #: the process group's peers' presence (:mod:`._peers`): a stalled round names a dead rank
        #: within about a second; None: not watched (the progress timeout decides)
        self.peers: PeerWatch | None = None
        self.patient_wait = False  #: inside :meth:`patient`
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
        self._plans: dict[tuple[tuple[int, ...], tuple[int, ...]], RoundPlan] = {}  # round shape -> set-up
        #: a large shape's own rounds: two plans taken in turn, the one in use first (_twin_round)
        self._twins: dict[tuple[tuple[int, ...], tuple[int, ...]], list[RoundPlan]] = {}
        self._last_g = array("q", [-1]) * n  # per slot: global sequence number of the last chunk completed there
        self._last_retx = array("B", [0]) * n  # ... whether it was retransmitted (a second result copy = spurious)
        self.stats: dict[str, int] = dict.fromkeys(
            ("packets", "retransmits", "fast_retransmits", "spurious_retransmits", "results", "ignored", "group_probes",
             "rounds", "rtt_samples", "rto_backoffs", "srtt_us", "rto_us", "agreements"), 0)
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
        native = self.native
        srcs: list[np.ndarray] = []
        lengths: list[int] = []
        ops: list[int] = []
        moved: list[int] = []  # streams whose words are not on the CPU (results go back to their device)
        fills: list[tuple[int, int] | None] | None = None  # None: no stream has a native fill
        # the native datapath takes the words' addresses from the tensors (data_ptr: no numpy ctypes object)
        src_at: list[int] | None = [] if native else None
        for j, s in enumerate(streams):
            w = s.words
            if w is None:
                source = s.source
                fill = source.native_fill() if native else None  # type: ignore[union-attr]
                if fill is not None:  # the native datapath fills its datagrams straight from it (no words array)
                    if fills is None:
                        fills = [None] * len(streams)
                    fills[j] = fill
                    srcs.append(_NO_WORDS)
                    src_at.append(_NO_WORDS_AT)  # type: ignore[union-attr]
                    lengths.append(source.length)  # type: ignore[union-attr]
                    ops.append(s.op)
                    if source.device.type != "cpu":  # type: ignore[union-attr]
                        moved.append(j)
                    continue
                w = source.materialize()  # type: ignore[union-attr]
            if not w.is_cpu:
                moved.append(j)
                w = w.detach().cpu().contiguous()
            elif not w.is_contiguous():  # (int32 words never require grad: numpy() reads them)
                w = w.detach().contiguous()
            if src_at is not None:  # the native datapath binds the address; the round holds the tensor
                srcs.append(w)  # type: ignore[arg-type]
                src_at.append(w.data_ptr())
            else:
                srcs.append(w.numpy())
            lengths.append(w.numel())
            ops.append(s.op)
        plan = self._plans.get(key := (tuple(lengths), tuple(ops))) or self._plan(key[0], tuple(map(int, ops)))
        self.stats["rounds"] += 1
        kept = plan.kept
        if kept is not None:  # a small round shape: its own result arrays, reused once unreferenced
            outs, out_at = kept.take()
        else:  # result arrays of the last rounds, reused once unreferenced
            spare = self._spare
            outs = [spare_int32(spare, n) for n in lengths]
            out_at = [o.ctypes.data for o in outs] if native else []
            self._spare = (spare + outs)[-SPARE_ARRAYS:]
        results = [torch.from_numpy(o) for o in outs]  # the outputs as tensors (CPU: moved back below)
        if plan.total:
            check = streams[0].verify  # a CheckOnce takes the host words as they are (no tensor)
            plan.run(self, srcs, outs, [s.name for s in streams],
                     check if check is None or isinstance(check, CheckOnce)
                     else lambda words: check(torch.from_numpy(words)), fills,
                     None if src_at is None else (src_at, out_at))
        # results go back to the device the words came from (only compressed words cross to the host)
        for j in moved:
            results[j] = results[j].to(streams[j].device)
        return results

    def combine_arrays(self, ops: Sequence[CombineOp], words: Sequence[np.ndarray],
                       verify: Callable[[np.ndarray], None] | None = None) -> list[np.ndarray]:
        """:meth:`SwitchPort.combine_arrays`: the same round as :meth:`combine` of the equivalent
        Streams (the same chunks, sequence numbers, protocol and errors; the two interleave freely),
        with no tensor and no per-round set-up: the round shape's :class:`._roundplan.RoundPlan`
        (kept per port), and for at most ``SMALL_WORDS`` words a copy through its own arrays."""
        lengths = array_lengths(ops, words)
        key = (lengths, tuple(ops))
        plan = self._plans.get(key) or self._plan(*key)
        self.stats["rounds"] += 1
        ins, outs = plan.own_in, plan.own_out
        if ins is None or outs is None:  # a large round: the caller's words, new result arrays
            ins, outs = [np.ascontiguousarray(w) for w in words], [np.empty(n, dtype=np.int32) for n in lengths]
            if plan.total:
                self._run(plan, ins, outs, plan.names, verify)
            if verify is not None and lengths and not lengths[0]:
                verify(outs[0].copy())  # stream 0 has no chunk, so the round did not verify it
            return outs
        for own, w in zip(ins, words):
            np.copyto(own, w)
        if not plan.total:
            pass
        elif self.native:
            plan.run_small(self, verify)
        else:
            self._run(plan, ins, outs, plan.names, verify)
        if verify is not None and lengths and not lengths[0]:
            verify(outs[0].copy())  # stream 0 has no chunk, so the round did not verify it
        return [o.copy() for o in outs]

    def own_round(self, ops: tuple[CombineOp, ...], lengths: tuple[int, ...]) -> OwnRound | None:
        """:meth:`SwitchPort.own_round`: on the native datapath, a shape of at most ``OWN_WORDS``
        words whose streams all hold words has its :class:`RoundPlan`'s own arrays."""
        if not self.native:
            return None
        key = (lengths, ops)
        if sum(lengths) > SMALL_WORDS:
            return self._twin_round(key) if all(lengths) and sum(lengths) <= OWN_WORDS else None
        plan = self._plans.get(key)
        if plan is None:
            if not all(lengths):  # no own arrays: make no plan for it
                return None
            plan = self._plan(*key)
        return plan.own_round(self, ops)

    def _twin_round(self, key: tuple[tuple[int, ...], tuple[CombineOp, ...]]) -> OwnRound | None:
        """A large shape's own round: two plans of its own (not ``combine``'s), handed out in turn,
        so that one round's results stay in their arrays while the shape's next round runs
        (:attr:`OwnRound.stable`: a caller may keep them without a copy, as the process group's
        path port keeps a round's results for a recovery)."""
        twins = self._twins.get(key) or self._kept(self._twins, key, lambda: [RoundPlan(self, *key, twin=True)
                                                                                for _ in range(2)])
        twins.reverse()  # the other one's turn
        return twins[0].own_round(self, key[1])

    def _plan(self, lengths: tuple[int, ...], ops: tuple[int, ...]) -> RoundPlan:
        """The cached set-up of rounds of this shape (made on first use; at most ``PLANS`` kept)."""
        return self._plans.get((lengths, ops)) or self._kept(self._plans, (lengths, ops),
                                                               lambda: RoundPlan(self, lengths, ops))

    def _kept(self, store: dict[Any, Any], key: Any, make: Callable[[], Any]) -> Any:
        """``store[key] = make()`` (the native datapath's scratch made first), the oldest entry
        evicted where ``store`` holds ``PLANS``."""
        if self.native and self._scratch is None:
            self._scratch = fastpath.Scratch.for_port(self.sock, self.msock, self._gso)
        if len(store) >= PLANS:
            del store[next(iter(store))]
        made = store[key] = make()
        return made

    def _run(self, plan: RoundPlan, srcs: list[np.ndarray], outs: list[np.ndarray], names: Sequence[str],
             verify: Callable[[np.ndarray], None] | None, fills: list[tuple[int, int] | None] | None = None,
             at: tuple[list[int], list[int]] | None = None) -> None:
        plan.run(self, srcs, outs, names, verify, fills, at)

    def patient(self, timeout_s: float) -> contextlib.AbstractContextManager[None]:
        """:meth:`SwitchPort.patient`, as :func:`._stall.patient_wait` keeps it."""
        return patient_wait(self, timeout_s)

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

    def _send_to_switch(self, dgram: memoryview) -> None:
        """The Python datapath's send: one datagram on the unicast socket."""
        self._send(self.sock.send, dgram)

    def close(self) -> None:
        self._spare, self._plans, self._twins = [], {}, {}
        self.sock.close()
        if self.msock is not None:
            self.msock.close()
        if self._ctl is not None:
            self._ctl.close()

