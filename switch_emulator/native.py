"""The native engine: ``switch_emulator/_dataplane.c`` serves the UDP socket, Python the rest.

:class:`NativeEngine` runs in the UDP backend's serve thread.  It hands the C loop (``hg_serve``)
tables built from the :class:`~switch_emulator.admission.AdmissionTable`: one row per admitted
source and one struct per job pointing at that job's state arrays (registers, bitmaps, counts,
keys, worker addresses), all numpy arrays owned here.  Between calls (at most every 50 ms; at
once when the control plane changed the tables: :meth:`NativeEngine.changed`) it moves the C
counters into :class:`~switch_emulator.counters.Counters`, notes each job's activity
(``last_seen``) and rebuilds the tables.

Datagram batching in the kernel (``homagg/_udpseg.h``): while the C loop serves, the socket has
UDP_GRO set (a coalesced buffer is split into its datagrams, each counted and processed as if it
came alone), and the results of a batch leave as GSO messages (datagrams to one destination of
one length, up to 64 and 64 KB a message; the kernel cuts them back into the same datagrams).
Where the kernel refuses GSO the loop sends one datagram per message from then on.

A job served natively keeps its cell state in numpy arrays (``JobState.bitmap``, ``count``,
``down`` and a :class:`KeyView` as ``key``), so :meth:`JobState.slot_status` reads them unchanged;
a child's parent address and ``child_id`` (docs/trees.md) go into its job struct.  The engine is
chosen once, at start: the Python pipeline (the readable reference) serves fault injection; the
native one everything else, where the library was built (``pip install`` compiles it when a C
compiler is there).  :data:`AVAILABLE` says whether it was.

Invariant: at any time exactly one engine runs a switch's pipeline; the C loop only sees tables
rebuilt after the latest control change it was told of (a control request that changes the
tables returns once the serve thread applied it, so a worker's first datagram after its
``register`` is admitted).
"""

from __future__ import annotations

import ctypes
import logging
import socket
import struct
import threading
import time
from typing import Any

import numpy as np

from homagg._cext import load_library
from homagg.transport._sockets import set_udp_gro

from .counters import DROP_REASONS
from .state import JobState

__all__ = ["AVAILABLE", "NativeEngine", "KeyView", "COUNTER_NAMES"]

log = logging.getLogger("homagg.switch")

#: the C counters, in the order of _dataplane.c's enum (the library says its own: hg_counter_names;
#: a build whose list differs is stale, and the python engine serves, with a warning)
COUNTER_NAMES = ("rx", "tx", "accepted", "completed", "retransmit_answered", "up", "retransmit_up",
                 "result_down") + tuple("drop_" + r for r in DROP_REASONS if r != "injected")
_BATCH, _STRIDE = 64, 65536 + 64


class _Src(ctypes.Structure):
    _fields_ = [("ip", ctypes.c_uint32), ("port", ctypes.c_uint32), ("job", ctypes.c_int32),
                ("worker_id", ctypes.c_int32)]


class _Job(ctypes.Structure):
    _fields_ = [("job_id", ctypes.c_int32), ("world", ctypes.c_int32), ("slot_base", ctypes.c_int32),
                ("n_slots", ctypes.c_int32), ("k", ctypes.c_int32), ("token", ctypes.c_uint32),
                ("regs", ctypes.c_void_p), ("bitmap", ctypes.c_void_p), ("count", ctypes.c_void_p),
                ("key", ctypes.c_void_p), ("down", ctypes.c_void_p), ("addr_ip", ctypes.c_void_p),
                ("addr_port", ctypes.c_void_p), ("subscribed", ctypes.c_uint32), ("group_ip", ctypes.c_uint32),
                ("group_port", ctypes.c_uint32), ("parent_ip", ctypes.c_uint32), ("parent_port", ctypes.c_uint32),
                ("child_id", ctypes.c_int32), ("packets", ctypes.c_int64), ("completed", ctypes.c_int64),
                ("results", ctypes.c_int64)]


def _load() -> ctypes.CDLL | None:
    lib = load_library(__file__, "_dataplane", honour_env=False)
    if lib is None:
        return None
    vp = ctypes.c_void_p
    lib.hg_serve.argtypes = [ctypes.c_int, vp, ctypes.c_int32, vp, ctypes.c_int32, vp, ctypes.c_double,
                             ctypes.c_double, vp, vp, vp, vp]
    lib.hg_serve.restype = ctypes.c_int64
    lib.hg_scratch_size.restype = ctypes.c_int64
    lib.hg_n_counters.restype = ctypes.c_int32
    built = _built_counters(lib)
    if built != COUNTER_NAMES:
        log.warning("native engine: the built library (%s) counts %s, this version %s: a stale build "
                    "(rebuild: pip install -e .); the python engine serves", lib._name, ",".join(built) or "?",
                    ",".join(COUNTER_NAMES))
        return None
    return lib


def _built_counters(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The counter names the built library keeps, in its order (empty: a build older than the names)."""
    try:
        names = lib.hg_counter_names
    except AttributeError:
        return ()
    names.restype = ctypes.c_char_p
    return tuple(names().decode().split(","))


_LIB = _load()
AVAILABLE = _LIB is not None


class KeyView:
    """``JobState.key`` of a natively served job: ``key[i]`` is None or ``(tag, offset, op, wc)``."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr  # [2 * n_slots, 5]: set, tag, offset, op, word_count

    def __getitem__(self, i: int) -> tuple[int, int, int, int] | None:
        row = self.arr[i]
        return None if not row[0] else (int(row[1]), int(row[2]) & 0xFFFFFFFF, int(row[3]), int(row[4]))

    def __len__(self) -> int:
        return len(self.arr)


def _to_native(job: JobState) -> None:
    """Move ``job``'s cell state into numpy arrays (once; the C loop writes them in place)."""
    if isinstance(job.key, KeyView):
        return
    n = len(job.bitmap)
    job.down = np.array(job.down, dtype=np.uint8)  # type: ignore[assignment]
    keys = np.zeros((n, 5), dtype=np.int32)
    for i, k in enumerate(job.key):
        if k is not None:
            keys[i] = (1, k[0], k[1] - (1 << 32) if k[1] >= 1 << 31 else k[1], k[2], k[3])  # offset as int32
    job.bitmap = np.array(job.bitmap, dtype=np.uint32)  # type: ignore[assignment]
    job.count = np.array(job.count, dtype=np.int32)  # type: ignore[assignment]
    job.key = KeyView(keys)  # type: ignore[assignment]
    job.regs = np.ascontiguousarray(job.regs, dtype=np.int32)


def _ip(addr: str) -> int:
    """An IPv4 address as the C code compares it (network order, read as a host integer)."""
    return struct.unpack("=I", socket.inet_aton(addr))[0]


def _port(port: int) -> int:
    return struct.unpack("=H", struct.pack("!H", port))[0]


def _signature(switch: Any) -> tuple[Any, ...]:
    """What the tables were built from, cheaply: jobs, sources, groups, subscriptions."""
    adm = switch.admission
    return (len(adm.by_src), tuple((id(j), j.group, j.subscribed, tuple(j.addrs)) for j in adm.jobs.values()))


class NativeEngine:
    """Serves one switch on one UDP socket with the C loop (see the module docstring)."""

    def __init__(self) -> None:
        assert _LIB is not None
        self.counters = np.zeros(len(COUNTER_NAMES), dtype=np.int64)
        self.dirty = np.zeros(1, dtype=np.int32)
        self._rbuf = np.empty(_BATCH * _STRIDE, dtype=np.uint8)
        self._payloads = np.empty(_BATCH * _STRIDE, dtype=np.uint8)
        self._scratch = np.empty(int(_LIB.hg_scratch_size()), dtype=np.uint8)
        self._applied = threading.Condition()
        self._version = 0  # tables changes announced / applied
        self._seen = 0
        self._jobs: list[JobState] = []
        self._structs: Any = None
        self._srcs: Any = None
        self._keep: list[np.ndarray] = []

    def changed(self, timeout: float = 2.0) -> None:
        """The control plane changed the tables: return once the serve loop applied the change."""
        with self._applied:
            self._version += 1
            want = self._version
            self.dirty[0] = 1
            self._applied.wait_for(lambda: self._seen >= want, timeout)

    def _rebuild(self, switch: Any) -> None:
        with self._applied:
            want = self._version
            self.dirty[0] = 0
        self._sync_jobs()
        jobs = list(switch.admission.jobs.values())
        index = {id(j): n for n, j in enumerate(jobs)}
        structs = (_Job * max(1, len(jobs)))()
        keep = []
        for n, job in enumerate(jobs):
            _to_native(job)
            s = job.spec
            ips = np.array([_ip(a[0]) if a else 0 for a in job.addrs], dtype=np.uint32)
            ports = np.array([_port(a[1]) if a else 0 for a in job.addrs], dtype=np.uint32)
            keep += [ips, ports]
            g, up = job.group, s.parent
            structs[n] = _Job(s.job_id, s.world_size, s.slot_base, s.n_slots, s.words_per_packet, s.token,
                              job.regs.ctypes.data, job.bitmap.ctypes.data, job.count.ctypes.data,  # type: ignore[attr-defined]
                              job.key.arr.ctypes.data, job.down.ctypes.data,  # type: ignore[attr-defined]
                              ips.ctypes.data, ports.ctypes.data, job.subscribed, _ip(g[0]) if g else 0,
                              _port(g[1]) if g else 0, _ip(up[0]) if up else 0, _port(up[1]) if up else 0,
                              s.child_id, 0, 0, 0)
        by_src = list(switch.admission.by_src.items())
        srcs = (_Src * max(1, len(by_src)))()
        for n, ((ip, port), (job, wid)) in enumerate(by_src):
            srcs[n] = _Src(_ip(ip), _port(port), index[id(job)], wid)
        self._jobs, self._structs, self._srcs, self._nsrc, self._keep = jobs, structs, srcs, len(by_src), keep
        with self._applied:
            self._seen = want
            self._applied.notify_all()

    def _sync_jobs(self) -> None:
        """Per-job activity since the last call: packets, completions, ``last_seen``."""
        if self._structs is None:
            return
        now = time.monotonic()
        for n, job in enumerate(self._jobs):
            st = self._structs[n]
            if st.packets or st.results:
                job.packets += st.packets
                job.completed += st.completed
                job.last_seen = now
                st.packets = st.completed = st.results = 0

    def _sync_counters(self, switch: Any) -> None:
        c = self.counters
        if c.any():
            for name, v in zip(COUNTER_NAMES, c.tolist()):
                if v:
                    switch.counters[name] += v
            c[:] = 0

    def serve(self, switch: Any, sock: socket.socket, stop: threading.Event) -> None:
        """Serve until ``stop`` is set (the UDP backend's serve thread)."""
        assert _LIB is not None
        switch.on_tables_changed = self.changed
        fd = sock.fileno()
        gro = set_udp_gro(sock, True)
        self._rebuild(switch)
        next_house = time.monotonic() + 0.5
        try:
            sig = _signature(switch)
            while not stop.is_set():
                now_sig = _signature(switch)
                if self.dirty[0] or now_sig != sig:  # announced, or made in-process (not via control)
                    self._rebuild(switch)
                    sig = now_sig
                got = _LIB.hg_serve(fd, ctypes.addressof(self._srcs), self._nsrc, ctypes.addressof(self._structs),
                                    len(self._jobs), self.counters.ctypes.data, 0.05, 0.02, self.dirty.ctypes.data,
                                    self._rbuf.ctypes.data, self._payloads.ctypes.data, self._scratch.ctypes.data)
                self._sync_counters(switch)
                self._sync_jobs()
                if got < 0:  # the socket was closed under the loop (close() without stop())
                    log.warning("native engine: the data socket is closed; serving stops")
                    break
                now = time.monotonic()
                if now >= next_house:
                    before = len(switch.admission.jobs)
                    switch.housekeeping()
                    if len(switch.admission.jobs) != before:
                        self._rebuild(switch)
                    next_house = now + 0.5
        finally:
            if gro:
                set_udp_gro(sock, False)  # the Python engine cannot split coalesced buffers
            switch.on_tables_changed = None
            self._sync_counters(switch)
            self._sync_jobs()
            with self._applied:  # nobody waits for a loop that is gone
                self._seen = self._version
                self._applied.notify_all()
