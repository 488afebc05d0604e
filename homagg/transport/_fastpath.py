"""The native worker datapath: ``homagg/transport/_fastpath.c`` (sendmmsg/recvmmsg) via ctypes.

Same interface and the same bytes and results as :class:`._datapath.PyDatapath` (the reference);
built into ``homagg.transport._fastpath_kernels`` by ``pip install`` where a C compiler is there.
:data:`AVAILABLE` says whether it was; ``HOMAGG_NATIVE=0`` disables it (as every native kernel).

Kernel batching (``homagg/_udpseg.h``), per port (:class:`Scratch`): the port's sockets take
UDP_GRO (a coalesced buffer of results is split in C), and with GSO on, runs of equal-length
chunks leave as one GSO message each.  GSO is on by default where the switch is reached over
loopback or a physical NIC (:func:`._sockets.gso_default`): on a veth or bridge the merged packet would reach a software
switch that reads the link with AF_PACKET (BMv2 through libpcap, the emulator's raw backend) as
one 64 KB frame.  ``HOMAGG_UDP_GSO=1`` (or ``0``) overrides that, e.g. for the UDP emulator behind
veths (``homagg bench net``).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import socket
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._cext import load_library
from ..wire import VERSION
from ._datapath import Round
from ._errmap import transport_error
from ._sockets import PROBE_PREFIX, gso_default, set_udp_gro

__all__ = ["AVAILABLE", "NativeDatapath", "NativeRound", "Scratch"]

_BATCH = 64
_STRIDE = 65536 + 64
_SEGMENTS = 64  #: HG_GSO_MAX_SEGMENTS: results one coalesced buffer may hold
_i64p = ctypes.POINTER(ctypes.c_int64)


class _Job(ctypes.Structure):
    _fields_ = [("seq0", ctypes.c_int64), ("nslot", ctypes.c_int32), ("slot_base", ctypes.c_int32),
                ("job_id", ctypes.c_int32), ("rank", ctypes.c_int32), ("version", ctypes.c_int32),
                ("token", ctypes.c_uint32)]


class _Chunks(ctypes.Structure):
    _fields_ = [("stream", ctypes.c_void_p), ("off", ctypes.c_void_p), ("wc", ctypes.c_void_p),
                ("op", ctypes.c_void_p), ("src", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("fill", ctypes.c_void_p), ("fill_ctx", ctypes.c_void_p),
                ("on_results", ctypes.c_void_p), ("results_ctx", ctypes.c_void_p)]


class _Counts(ctypes.Structure):
    _fields_ = [("ignored", ctypes.c_int64), ("probes", ctypes.c_int64), ("late", ctypes.c_int64),
                ("err", ctypes.c_int64), ("drained", ctypes.c_int64), ("overflow", ctypes.c_int64)]


class _Slots(ctypes.Structure):  # hg_slots (_fastround.c)
    _fields_ = [(name, ctypes.c_void_p) for name in ("cur", "tries", "sent_at", "deadline", "last_g", "last_retx")]


_D, _I = ctypes.c_double, ctypes.c_int64
#: the round loop's counts, as they are added to the port's ``stats``
_ROUND_COUNTS = {"packets": "packets", "retransmits": "retransmits", "fast_retransmits": "fast_retransmits",
                 "spurious": "spurious_retransmits", "results": "results", "send_stalls": "send_stalls",
                 "refused": "refused", "late": "ignored"}


class _RoundState(ctypes.Structure):  # hg_round (_fastround.c)
    _fields_ = ([(n, _D) for n in ("cwnd", "ssthresh", "floor", "limit", "before_cwnd", "before_ssthresh")]
                + [(n, _I) for n in ("has_before", "recover", "reductions", "undos")]
                + [("rto", _D), ("max_rto", _D)]
                + [(n, _I) for n in ("total", "low", "fr_next", "nsent", "done", "n0", "verify_left", "backlog")]
                + [("last_progress", _D)]
                + [(n, _I) for n in ("packets", "retransmits", "fast_retransmits", "spurious", "results",
                                     "send_stalls", "refused", "late", "nsamples")]
                + [("samples", _D * 64), ("next_scan", _D), ("win_changed", _I), ("rare", _I),
                   ("agree_words", _I), ("agreed", _I)])


_FIELDS = [name for name, _ in _RoundState._fields_]
assert _FIELDS[_FIELDS.index("packets"):][:len(_ROUND_COUNTS)] == list(_ROUND_COUNTS)  # NativeRound._counts' view


class _Bufs(ctypes.Structure):  # hg_bufs (_fastround.c)
    _fields_ = [("bufs", ctypes.c_void_p), ("stride", _I), ("rbuf", ctypes.c_void_p), ("rstride", _I),
                ("events", ctypes.c_void_p), ("max_events", _I), ("late", ctypes.c_void_p), ("ids", ctypes.c_void_p),
                ("probe", ctypes.c_void_p), ("probe_len", _I), ("gso", ctypes.c_void_p)]


class _Call(ctypes.Structure):  # hg_call (_fastround.c): homagg_fp_round's arguments
    _fields_ = [("fd", _I), ("mfd", _I)] + [(n, ctypes.c_void_p) for n in (
        "job", "chunks", "round", "slots", "completed", "bufs", "counts")] + [("slice", _D)]


def _library() -> ctypes.CDLL | None:
    """The built library next to this file (:func:`homagg._cext.load_library`)."""
    return load_library(__file__, "_fastpath_kernels")


#: what this version calls in the library: a build without one of them is stale
REQUIRED = ("homagg_fp_send", "homagg_fp_recv", "homagg_fp_run", "homagg_fp_round")


def _load(lib: ctypes.CDLL | None = None) -> ctypes.CDLL | None:
    """The library with its signatures declared, or None (not built, ``HOMAGG_NATIVE=0``, or a
    stale build: one made before an entry this version calls existed, which warns, as the
    emulator's engine does, instead of running the Python datapath silently)."""
    lib = _library() if lib is None else lib
    if lib is None:
        return None
    missing = [name for name in REQUIRED if not hasattr(lib, name)]
    if missing:
        warnings.warn(f"homagg: the native datapath library {lib._name} is stale (it lacks {', '.join(missing)}): "
                      "the worker runs the Python datapath; rebuild it with `pip install -e .`", RuntimeWarning,
                      stacklevel=2)
        return None
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.homagg_fp_send.argtypes = [ctypes.c_int, vp, vp, vp, i64, vp, i64, vp]
    lib.homagg_fp_send.restype = i64
    lib.homagg_fp_recv.argtypes = [ctypes.c_int, vp, vp, i64, vp, vp, vp, i64, vp, vp, vp, i64, vp, i64, vp]
    lib.homagg_fp_recv.restype = i64
    lib.homagg_fp_run.argtypes = [ctypes.c_int, ctypes.c_int, vp, vp, vp, vp, vp, vp, vp, ctypes.c_double]
    lib.homagg_fp_run.restype = i64
    lib.homagg_fp_round.argtypes = [vp, i64]
    lib.homagg_fp_round.restype = i64
    return lib


_LIB = _load()
AVAILABLE = _LIB is not None


class Scratch:
    """The native datapath's state that outlives a round: receive buffers and event arrays (a
    round allocating 4 MB afresh costs page faults), whether GSO is on (cleared for good when the
    kernel refuses it) and whether the sockets took UDP_GRO."""

    def __init__(self, socks: Sequence[socket.socket], gso: bool) -> None:
        self.rbuf = np.empty(_BATCH * _STRIDE, dtype=np.uint8)
        self.room = _BATCH * _SEGMENTS  # results one receive call may report (a batch of full GRO buffers)
        self.events = np.empty(2 * self.room, dtype=np.int64)  # the round loop: a room per socket
        self.late = np.empty(3 * self.room, dtype=np.int64)
        self.gso = ctypes.c_int32(int(gso))
        self.gro = all([set_udp_gro(s) for s in socks])
        self.overflow = 0

    @classmethod
    def for_port(cls, sock: socket.socket, msock: socket.socket | None, gso: bool | None) -> Scratch:
        """A port's: its unicast socket ``sock`` (connected to the switch), its result group's
        ``msock`` if any; ``gso`` None: :func:`gso_default`."""
        return cls([s for s in (sock, msock) if s is not None], gso_default(sock) if gso is None else gso)


def _addr(buf: object) -> int:
    return ctypes.addressof((ctypes.c_char * 1).from_buffer(buf))  # type: ignore[arg-type]


class NativeDatapath:
    """The datapath in C (see the module docstring and :mod:`._datapath`)."""

    def __init__(self, rnd: Round, fd: int, scratch: Scratch) -> None:
        assert _LIB is not None
        self.r, self.fd, self.scratch = rnd, fd, scratch
        job = rnd.job
        self._job = _Job(rnd.seq0, job.n_slots, job.slot_base, job.job_id, rnd.rank, VERSION, job.token)
        self._cols = [np.ascontiguousarray(rnd.table[:, i]) for i in range(4)]  # stream, off, wc, op
        n = len(rnd.srcs)
        # per stream: its words, its output, a word source's fill function and its context (NULL:
        # copy ``src``'s words); written by start(bind=True)
        self._src, self._out = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)()
        self._fill, self._fill_ctx = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)()
        self._run: NativeRound | None = None
        self.start()
        self._chunks = _Chunks(*[c.ctypes.data for c in self._cols], ctypes.addressof(self._src),
                               ctypes.addressof(self._out), ctypes.addressof(self._fill),
                               ctypes.addressof(self._fill_ctx))
        self._ids = np.empty(max(1, job.n_slots), dtype=np.int64)
        self._events, self._late, self._rbuf = scratch.events, scratch.late, scratch.rbuf
        self._nlate = ctypes.c_int64(0)
        self._counts = _Counts()
        #: its fields (ignored, probes, late, err, drained, overflow) read at once
        self._counts_view = np.frombuffer(self._counts, dtype=np.int64)
        self._cur = _addr(rnd.cur)
        self._completed = _addr(rnd.completed) if rnd.total else None
        self._probe = ctypes.create_string_buffer(PROBE_PREFIX, len(PROBE_PREFIX))

    def start(self, bind: bool = True, at: tuple[list[int], list[int]] | None = None) -> None:
        """Take the round's ``seq0`` and, with ``bind``, the addresses of its inputs, outputs and
        fills (:meth:`._datapath.Round.start`; without: the same arrays as the last bound round):
        a cached datapath serves every round of its table (:mod:`._roundplan`).  ``at``: the
        inputs' and outputs' addresses, where the caller has them (else numpy's)."""
        r = self.r
        self._job.seq0 = r.seq0
        if bind:
            if at is None:
                self._src[:] = [a.ctypes.data for a in r.srcs]
                self._out[:] = [a.ctypes.data for a in r.outs]
            else:
                self._src[:], self._out[:] = at
            fills = r.fills
            if fills is r._no_fills:
                self._fill[:] = self._fill_ctx[:] = fills
            else:
                self._fill[:] = [f[0] if f else None for f in fills]
                self._fill_ctx[:] = [f[1] if f else None for f in fills]

    def on_results(self, hook: tuple[int, int] | None) -> None:
        """Install (or with None remove) the results hook of the rounds the C loop runs: the
        address of an ``hg_results_fn`` (``_fastpath.h``) and of its context."""
        ch = self._chunks
        ch.on_results, ch.results_ctx = hook if hook is not None else (None, None)

    def send(self, ids: list[int]) -> int:
        n = len(ids)
        if n > self._ids.size:
            self._ids = np.empty(n, dtype=np.int64)
        self._ids[:n] = ids
        sent = _LIB.homagg_fp_send(self.fd, ctypes.byref(self._job), ctypes.byref(self._chunks),  # type: ignore[union-attr]
                                   self._ids.ctypes.data, n, self.r.bufs.ctypes.data, self.r.stride,
                                   ctypes.byref(self.scratch.gso))
        if sent < 0:
            if -sent == errno.ECONNREFUSED:
                self.r.refused += 1
                return 0
            raise OSError(-sent, "sendmmsg failed")
        return int(sent)

    def recv(self, fd: int, recv_into: Callable[[bytearray], int], events: list[int],
             late: list[tuple[int, int, int]]) -> None:
        """Drain ``fd`` (``recv_into`` is unused: the C code reads the descriptor)."""
        r, c = self.r, self._counts
        while True:
            self._nlate.value = 0
            n = _LIB.homagg_fp_recv(fd, ctypes.byref(self._job), ctypes.byref(self._chunks), r.total,  # type: ignore[union-attr]
                                    self._cur, self._completed, self._events.ctypes.data, self.scratch.room,
                                    self._late.ctypes.data, ctypes.byref(self._nlate), self._rbuf.ctypes.data,
                                    _STRIDE, self._probe, len(PROBE_PREFIX), ctypes.byref(c))
            r.ignored += c.ignored
            r.probes += c.probes
            self.scratch.overflow += c.overflow
            c.ignored = c.probes = c.late = c.overflow = 0
            if n:
                events.extend(self._events[:n].tolist())
            k = self._nlate.value
            if k:
                late.extend(map(tuple, self._late[: 3 * k].reshape(k, 3).tolist()))
            if c.err:
                err, c.err = c.err, 0
                if err == errno.ECONNREFUSED:
                    raise ConnectionRefusedError(err, "ICMP port unreachable")
                raise OSError(err, "recvmmsg failed")
            if c.drained:
                raise BlockingIOError  # drained, as a non-blocking socket says

    def native_round(self, port: Any, mfd: int) -> NativeRound:
        """The C round loop over this datapath for ``port``'s rounds: made once per datapath (its
        structures then serve every round)."""
        run = self._run
        if run is None or run.window is not port.window or run.mfd != mfd or run.ids is not self._ids:
            run = self._run = NativeRound(self, port, mfd)
        return run

    def round_run(self, loop: Any, mfd: int) -> NativeRound:
        """:meth:`native_round`, restarted for ``loop`` (a :class:`._roundloop.RoundLoop`)."""
        run = self.native_round(loop.port, mfd)
        run.restart(loop)
        return run


class NativeRound:
    """``homagg_fp_run`` (``_fastround.c``) for one round: :meth:`step` runs it until the round is
    done, stream 0 is back (``VERIFY``) or ``until``, mirroring the state both ways each time;
    :meth:`call` (``homagg_fp_round``, its arguments in one struct) is the entry of both: the
    small-round path's (:mod:`._roundplan`) and each step's."""

    DONE, VERIFY, SCAN = 0, 1, 2

    def __init__(self, dp: NativeDatapath, port: Any, mfd: int) -> None:
        from ._roundloop import SCAN_SLICE_S
        r, window = dp.r, port.window
        self.dp, self.loop, self.window, self.mfd = dp, None, window, mfd
        self._st = _RoundState(total=r.total, n0=r.n0, max_rto=port.max_rto, floor=window.floor,
                               limit=float(window.limit))
        self._slots = _Slots(*[_addr(a) for a in (r.cur, r.tries, r.sent_at, r.deadline, port._last_g,
                                                   port._last_retx)])
        sc = dp.scratch
        ids = self.ids = dp._ids  # a window's chunk ids: at most n_slots, its size (send() is not called meanwhile)
        self._bufs = _Bufs(r.bufs.ctypes.data, r.stride, sc.rbuf.ctypes.data, _STRIDE, sc.events.ctypes.data,
                           sc.room, sc.late.ctypes.data, ids.ctypes.data, ctypes.addressof(dp._probe),
                           len(PROBE_PREFIX), ctypes.addressof(sc.gso))
        self._args = (dp.fd, mfd, *map(ctypes.addressof, (dp._job, dp._chunks, self._st, self._slots)), dp._completed,
                      *map(ctypes.addressof, (self._bufs, dp._counts)))  # held by this object: addresses stay valid
        #: the round's counts (``_ROUND_COUNTS``' fields, consecutive int64 in ``_RoundState``)
        self._counts = np.frombuffer(self._st, dtype=np.int64, count=len(_ROUND_COUNTS),
                                     offset=_RoundState.packets.offset)  # type: ignore[attr-defined]
        self.st = self._st
        self._call = _Call(dp.fd, mfd, *self._args[2:6], dp._completed, *self._args[7:9], SCAN_SLICE_S)
        #: ``call(start)``: one ``homagg_fp_round`` (start: begin the round first); an int, the step's codes or -errno
        self.call = functools.partial(_LIB.homagg_fp_round, ctypes.addressof(self._call))  # type: ignore[union-attr]

    def restart(self, loop: Any) -> None:
        """Begin the next round (of the same table) for ``loop``: nothing sent, nothing done; the
        counts were moved to the port's stats by the last step."""
        st = self._st
        self.loop = loop
        st.low = st.fr_next = st.nsent = st.done = 0
        st.verify_left = loop.verify_left
        st.agree_words = st.agreed = 0  # the general loop verifies in Python
        st.backlog = 1  # the first step fills the window

    def push(self, est: Any) -> None:
        """Python's window and RTO into the C state (before a call)."""
        st, win = self._st, self.window
        st.cwnd, st.ssthresh, st.recover, st.reductions, st.undos = win.cwnd, win.ssthresh, win.recover, \
            win.reductions, win.undos
        before = win._before_cut
        st.has_before = before is not None
        if before is not None:
            st.before_cwnd, st.before_ssthresh = before
        st.rto = est.rto

    def step(self, est: Any, until: float) -> int:
        """``homagg_fp_run`` until ``until`` (at most the slice from now): called as
        ``homagg_fp_round(call, 0)``, one ctypes argument instead of ten.  That entry first zeroes
        the step's counts, which every :meth:`pull` left at zero already, and runs until
        ``min(next_scan, now + slice)``, which is ``until`` (the caller's ``now`` came first)."""
        self.push(est)
        st = self._st
        st.last_progress = self.loop.last_progress  # type: ignore[union-attr]
        st.next_scan = until
        return self.pull(est, self.call(0))

    def pull(self, est: Any, rc: int) -> int:
        """After a call that returned ``rc``: its RTT samples into ``est``, the C state into the
        window and the loop, its counts into the stats; ``rc`` (raises for an error)."""
        st, loop, win = self._st, self.loop, self.window
        assert loop is not None
        for i in range(st.nsamples):
            est.sample(st.samples[i])
        st.nsamples = 0  # taken (homagg_fp_round's caller may have taken them already)
        if st.win_changed:  # else the C state still holds what push() wrote (homagg_fp_round's calls
            # before this one changed no window either: each that did was ``rare`` and returned here)
            win.cwnd, win.ssthresh, win.recover, win.reductions, win.undos = st.cwnd, st.ssthresh, st.recover, \
                st.reductions, st.undos
            win._before_cut = (st.before_cwnd, st.before_ssthresh) if st.has_before else None
        loop.last_progress, loop.done, loop.low, loop.nsent = st.last_progress, st.done, st.low, st.nsent
        loop.verify_left = st.verify_left
        self._pull_counts()
        if rc < 0:
            err = -rc
            if err == errno.ECONNREFUSED:  # counted in C; never returned
                return self.SCAN
            port = loop.port
            raise transport_error(OSError(err, os.strerror(err)), f"job {port.job.job_id} worker {port.rank}: "
                                  f"exchanging datagrams with {port.switch_addr}")
        return int(rc)

    def _pull_counts(self) -> None:
        counts = self._counts.tolist()
        if any(counts):
            stats = self.loop.stats  # type: ignore[union-attr]
            self._counts.fill(0)
            for key, v in zip(_ROUND_COUNTS.values(), counts):
                if v:
                    stats[key] = stats.get(key, 0) + v
        dp = self.dp
        ignored, probes, late, _err, _drained, overflow = dp._counts_view.tolist()
        if ignored or probes or late or overflow:  # usually none: four ctypes reads and writes saved
            c, r = dp._counts, dp.r
            r.ignored += ignored
            r.probes += probes
            dp.scratch.overflow += overflow
            c.ignored = c.probes = c.late = c.overflow = 0
