"""The worker port's per-datagram work, pluggable: build and send chunks, receive and match results.

:class:`UdpSwitchPort` (:mod:`._udp`) keeps the protocol -- windows, timers, fast retransmit --
and calls a datapath once per batch:

* ``send(ids)``: build chunk ``c``'s datagram for every ``c`` in ``ids`` into its slot's buffer
  (``s = (seq0 + c) % n_slots``) and send it; returns how many went out, a prefix of ``ids`` (the
  rest found the socket's send buffer full: the protocol sends them again once it has room);
* ``recv(fd, recv_into, events, late)``: drain one socket; every result that matches the chunk
  outstanding in its slot (``cur[s]``: tag, bank, offset, word count) has its words copied into the
  round's output, ``completed[c] = 1``, ``cur[s] = -1`` and ``c`` appended to ``events``; a valid
  result of this job for no outstanding chunk goes to ``late`` as ``(s, tag, bank)``.

:class:`PyDatapath` does this one datagram at a time in Python: the readable reference.
:class:`homagg.transport._fastpath.NativeDatapath` does it in C with ``sendmmsg``/``recvmmsg``
(``homagg/transport/_fastpath.c``), where the library was built.  Both write the same bytes and
the same results (tests/test_transport_fastpath.py).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from ..wire import FLAG_RESULT, HEADER_LEN, TAG_MASK, VERSION, datagram_len, pack_header_into, payload_view, unpack_header
from .._errors import ProtocolError
from ._sockets import PROBE_PREFIX

__all__ = ["Round", "PyDatapath"]


class Round:
    """What one round's datapath works on: the job's constants, the chunk table, the slot buffers,
    the inputs and outputs, and the per-slot / per-chunk state the protocol shares with it."""

    def __init__(self, *, job: Any, rank: int, seq0: int, table: np.ndarray,
                 srcs: list[np.ndarray], outs: list[np.ndarray], bufs: np.ndarray, stride: int,
                 fills: list[tuple[int, int] | None] | None = None) -> None:
        self.job, self.rank, self.seq0 = job, rank, seq0
        #: per stream, the native ``(function, context)`` that writes its payloads (its ``srcs`` entry
        #: is then empty), or None: only the native datapath takes them
        self._no_fills: list[tuple[int, int] | None] = [None] * len(srcs)
        self.fills = fills if fills is not None else self._no_fills
        self.nslot, self.base, self.jid, self.token = job.n_slots, job.slot_base, job.job_id, job.token
        self.table, self.srcs, self.outs = table, srcs, outs  # table rows: (stream, offset, word_count, op)
        self._chunks: list[tuple[int, int, int, int]] | None = None
        self.bufs, self.stride = bufs, stride  # slot s's datagram: bufs[s * stride : ...]
        self.total = len(table)
        self.n0 = int(np.count_nonzero(table[:, 0] == 0)) if self.total else 0  # stream 0's chunks: the first
        self.cur = array("q", [-1]) * self.nslot  # chunk outstanding in each slot, -1 if none
        self.tries = array("i", [0]) * self.nslot  # ... its retransmissions
        self.sent_at = array("d", [0.0]) * self.nslot  # ... its first send (monotonic s)
        self.deadline = array("d", [0.0]) * self.nslot  # ... when its timer expires
        self.completed = bytearray(self.total)
        self.ignored = 0  # datagrams that are no result of this job
        self.probes = 0  # the result group's probes among them
        self.refused = 0  # ICMP port unreachable reported by a receive
        self._free, self._none = array("q", self.cur), bytes(self.total)

    def start(self, seq0: int, srcs: list[np.ndarray], outs: list[np.ndarray],
              fills: list[tuple[int, int] | None] | None = None) -> None:
        """Make this (a port's cached round of this table, :mod:`._roundplan`) the next round:
        its first global chunk ``seq0``, inputs and outputs; every slot free, no chunk completed
        (also after an abandoned round).  The per-slot arrays and ``completed`` keep their
        addresses (the native datapath holds them)."""
        self.seq0, self.srcs, self.outs = seq0, srcs, outs
        self.fills = fills if fills is not None else self._no_fills
        self.cur[:] = self._free
        self.completed[:] = self._none
        self.ignored = self.probes = self.refused = 0

    @property
    def chunks(self) -> list[tuple[int, int, int, int]]:
        """The table as tuples ``(stream, offset, word_count, op)`` (made on first use)."""
        if self._chunks is None:
            self._chunks = [tuple(row) for row in self.table.tolist()]  # type: ignore[misc]
        return self._chunks

    def slot_view(self, s: int, c: int) -> memoryview:
        """Slot ``s``'s datagram as built for chunk ``c``."""
        start = s * self.stride
        return memoryview(self.bufs)[start: start + datagram_len(int(self.table[c, 2]))]


class PyDatapath:
    """The reference datapath: Python, one datagram at a time (see the module docstring)."""

    def __init__(self, rnd: Round, send: Callable[[memoryview], None]) -> None:
        if any(f is not None for f in rnd.fills):
            raise ProtocolError("the Python datapath sends materialised words, not a native word source's")
        self.r = rnd
        self._send = send
        self._rbuf = bytearray(datagram_len(16000) + 64)

    def send(self, ids: list[int]) -> int:
        r = self.r
        for c in ids:
            g = r.seq0 + c
            s = g % r.nslot
            j, off, wc, op = r.chunks[c]
            view = r.slot_view(s, c)
            pack_header_into(view, op, 0, r.jid, r.rank, wc, (g // r.nslot) & 1, r.base + s, g & TAG_MASK, off,
                             r.token)
            payload_view(view, wc)[:] = r.srcs[j][off:off + wc]
            self._send(view)
        return len(ids)

    def recv(self, fd: int, recv_into: Callable[[bytearray], int], events: list[int],
             late: list[tuple[int, int, int]]) -> None:
        """Drain one socket (raises BlockingIOError when empty, as the socket does)."""
        r = self.r
        rbuf = self._rbuf
        cur, chunks, seq0, nslot = r.cur, r.chunks, r.seq0, r.nslot
        while True:
            n = recv_into(rbuf)
            if n < HEADER_LEN:
                self._discard()
                continue
            ver, _op, flags, rjob, _w, wc, bank, slot, tag, off, _r, rtok = unpack_header(rbuf)
            s = slot - r.base
            if not (flags & FLAG_RESULT and rjob == r.jid and 0 <= s < nslot and n == datagram_len(wc)
                    and ver == VERSION and rtok == r.token):
                self._discard()
                continue
            c = cur[s]
            g = seq0 + c
            j, coff, cwc, _op = chunks[c]
            if c < 0 or tag != g & TAG_MASK or bank != (g // nslot) & 1 or off != coff or wc != cwc:
                late.append((s, tag, bank))
                continue
            r.outs[j][off:off + wc] = payload_view(rbuf, wc)
            r.completed[c] = 1
            cur[s] = -1
            events.append(c)

    def _discard(self) -> None:
        if self._rbuf.startswith(PROBE_PREFIX):
            self.r.probes += 1
        else:
            self.r.ignored += 1
