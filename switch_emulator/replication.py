"""Stage 6, result replication (P4: ``Replicate``: multicast group per job, unicast for answers).

A completed (slot, bank) is sent to every worker of the job: one send to the job's IP multicast
group for the workers subscribed to it (the network replicates; such copies carry ``worker_id``
0, there is no per-copy rewrite), one unicast per other worker (recipient's ``worker_id``).  A
retransmission from a worker already counted in a completed bank is answered to that worker alone
by unicast from the stored registers (the shadow copy).  Results carry ``FLAG_RESULT``, the
echoed slot, bank, tag and offset, and the job's token.

Trees: a child sends a completed use to its parent (:meth:`Replicator.up`) as a contribution of
worker ``child_id``: the cell's words, no ``FLAG_RESULT``, ``FLAG_RETRANSMIT`` when it re-sends.
"""

from __future__ import annotations

from collections.abc import Callable

from homagg.wire import (
    FLAG_RESULT,
    FLAG_RETRANSMIT,
    MAX_WORDS_JUMBO,
    datagram_len,
    pack_header_into,
    payload_view,
    set_worker_id,
)

from .state import JobState

__all__ = ["Replicator", "SendFn"]

#: ``send(datagram, (ip, port)) -> None``; provided by the I/O backend
SendFn = Callable[[memoryview, tuple[str, int]], None]


class Replicator:
    """Builds result datagrams in one preallocated buffer and hands them to ``send``."""

    def __init__(self, send: SendFn, egress_drop: Callable[[int], bool] | None = None) -> None:
        self.send = send
        self.egress_drop = egress_drop
        #: workers that get no multicast copy (fault injection's ``mute``): while one of them is
        #: subscribed, every copy goes by unicast
        self.unicast_only = 0
        self._buf = bytearray(datagram_len(MAX_WORDS_JUMBO))
        self._mv = memoryview(self._buf)
        self._words = payload_view(self._buf, MAX_WORDS_JUMBO)
        self.sent = 0

    def _build(self, job: JobState, i: int) -> memoryview:
        tag, offset, op, wc = job.key[i]  # type: ignore[misc]
        slot = job.spec.slot_base + (i >> 1)
        pack_header_into(self._buf, op, FLAG_RESULT, job.job_id, 0, wc, i & 1, slot, tag, offset, job.spec.token)
        self._words[:wc] = job.regs[i, :wc]
        return self._mv[: datagram_len(wc)]

    def multicast(self, job: JobState, i: int) -> None:
        dgram = self._build(job, i)
        sub = 0 if job.subscribed & self.unicast_only else job.subscribed
        if sub and job.group is not None:
            self._out(dgram, 0, job.group)
        for wid, addr in enumerate(job.addrs):
            if addr is None or sub >> wid & 1:
                continue
            self._out(dgram, wid, addr)

    def up(self, job: JobState, i: int, retransmit: bool) -> None:
        """Send the cell's combined words to the job's parent as worker ``child_id``'s contribution."""
        tag, offset, op, wc = job.key[i]  # type: ignore[misc]
        slot = job.spec.slot_base + (i >> 1)
        pack_header_into(self._buf, op, FLAG_RETRANSMIT if retransmit else 0, job.job_id, job.spec.child_id, wc,
                         i & 1, slot, tag, offset, job.spec.token)
        self._words[:wc] = job.regs[i, :wc]
        if self.egress_drop is not None and self.egress_drop(-1):
            return  # counted by the fault injector (drop_injected_egress); never a muted worker
        self.send(self._mv[: datagram_len(wc)], job.spec.parent)  # type: ignore[arg-type]
        self.sent += 1

    def unicast(self, job: JobState, i: int, worker_id: int) -> None:
        addr = job.addrs[worker_id]
        if addr is not None:
            self._out(self._build(job, i), worker_id, addr)

    def _out(self, dgram: memoryview, wid: int, addr: tuple[str, int]) -> None:
        if self.egress_drop is not None and self.egress_drop(wid):
            return  # counted by the fault injector (drop_injected_egress)
        set_worker_id(self._buf, wid)
        self.send(dgram, addr)
        self.sent += 1
