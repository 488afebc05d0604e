"""The switch pipeline: parse -> admission -> slot/bank -> worker bitmap -> combine -> completion
-> replication, one call per datagram, in the order of the P4 control blocks.

Trees (docs/trees.md, the state table): at a switch whose job has a parent (a *child*), a use that
completes goes up to the parent (:meth:`Replicator.up`) instead of to the workers; a result from
the parent (``FLAG_RESULT``, from the job's ``parent`` address) for the complete use still waiting
is written into the cell (``down``) and sent to the workers; a worker's retransmission for a
complete use is answered from the cell once the result is down, else re-sent up, flagged.

:class:`Pipeline` is I/O-free: a backend calls :meth:`Pipeline.process` with the datagram bytes
and its source address and gives it a ``send`` function.  It never raises on bad input; every
datagram it does not accept is counted under ``drop_<reason>`` (see :mod:`.counters`).
"""

from __future__ import annotations

import time

from homagg.wire import FLAG_RESULT, FLAG_RETRANSMIT, HEADER_LEN, OPS, VERSION, datagram_len, payload_view, unpack_header

from . import bitmap, completion, slots
from .admission import AdmissionTable
from .combine import combine
from .counters import Counters
from .replication import Replicator, SendFn

__all__ = ["Pipeline"]


class Pipeline:
    def __init__(self, admission: AdmissionTable, send: SendFn, counters: Counters | None = None) -> None:
        self.admission = admission
        self.counters = counters if counters is not None else Counters()
        self.replicator = Replicator(send)

    def process(self, buf: bytes | bytearray | memoryview, n: int, src: tuple[str, int]) -> None:
        """Run one datagram (``buf[:n]``) from ``src`` through the pipeline."""
        c = self.counters
        c["rx"] += 1
        # parser
        if n < HEADER_LEN:
            c.drop("short")
            return
        version, op, flags, job_id, wid, wc, bank, slot, tag, offset, _res, token = unpack_header(buf)
        if version != VERSION:
            c.drop("version")
            return
        if op not in OPS:
            c.drop("op")
            return
        if wc == 0 or n != datagram_len(wc):
            c.drop("length")
            return
        if flags & FLAG_RESULT:
            self._result_down(buf, src, job_id, wc, bank, slot, (tag, offset, op, wc), token)
            return
        # admission
        entry = self.admission.by_src.get(src)
        if entry is None:
            c.drop("unknown_source")
            return
        job, worker_id = entry
        if job.spec.job_id != job_id or worker_id != wid:
            c.drop("admission_mismatch")
            return
        if token != job.spec.token:  # right source, wrong token: spoofed (or from an old admission)
            c.drop("token")
            return
        if wc > job.spec.words_per_packet:
            c.drop("word_count")
            return
        job.packets += 1
        job.last_seen = time.monotonic()
        # slot / bank selection
        i = slots.select(job, slot, bank)
        if i < 0:
            c.drop("slot_range")
            return
        # worker bitmap: the verdict, then the state change (a function of the state and the packet)
        key = (tag, offset, op, wc)
        verdict = bitmap.check(job, i, worker_id, key, bool(flags & FLAG_RETRANSMIT))
        bitmap.update(job, i, worker_id, key)
        if verdict > bitmap.ADD:
            if verdict == bitmap.ANSWER:
                if job.spec.parent is not None and not job.down[i]:
                    c["retransmit_up"] += 1  # the result has not come down: ask the parent again
                    self.replicator.up(job, i, retransmit=True)
                else:
                    c["retransmit_answered"] += 1
                    self.replicator.unicast(job, i, worker_id)
                c["tx"] += 1
            elif verdict == bitmap.DUPLICATE:
                c.drop("duplicate")
            elif verdict == bitmap.STALE:
                c.drop("stale")
            else:
                c.drop("conflict")
            return
        first = verdict == bitmap.FIRST
        c["accepted"] += 1
        if first:
            job.down[i] = 0
        # combine
        combine(job.regs[i, :wc], payload_view(buf, wc), op, first)
        # completion + replication
        if completion.complete(job, i):
            job.completed += 1
            c["completed"] += 1
            if job.spec.parent is not None:
                c["up"] += 1
                self.replicator.up(job, i, retransmit=False)
                c["tx"] += 1
                return
            before = self.replicator.sent
            self.replicator.multicast(job, i)
            c["tx"] += self.replicator.sent - before

    def _result_down(self, buf: bytes | bytearray | memoryview, src: tuple[str, int], job_id: int, wc: int,
                     bank: int, slot: int, key: tuple[int, int, int, int], token: int) -> None:
        """A result from the job's parent: the tree's result of a use this child sent up."""
        c = self.counters
        job = self.admission.by_parent.get((src, job_id))
        if job is None:
            c.drop("result_flag")
            return
        if token != job.spec.token:
            c.drop("token")
            return
        if wc > job.spec.words_per_packet:
            c.drop("word_count")
            return
        i = slots.select(job, slot, bank)
        if i < 0:
            c.drop("slot_range")
            return
        if job.key[i] != key or not completion.complete(job, i) or job.down[i]:
            c.drop("stale_result")  # another use, one still in progress here, or a second copy
            return
        job.last_seen = time.monotonic()
        job.down[i] = 1
        job.regs[i, :wc] = payload_view(buf, wc)
        c["result_down"] += 1
        before = self.replicator.sent
        self.replicator.multicast(job, i)
        c["tx"] += self.replicator.sent - before
