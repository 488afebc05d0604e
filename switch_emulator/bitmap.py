"""Stage 3, worker bitmap check (P4: ``WorkerBitmap``): duplicate and retransmission detection.

Verdicts for a packet of worker ``w`` with key ``(tag, offset, op, word_count)`` at index ``i``:

* ``FIRST``   — first contribution of a new use of this bank: the bank is unused or complete and
  every worker has moved on (bitmap empty), and the key differs from the completed use's;
* ``ADD``     — a further contribution to the use in progress (same key);
* ``ANSWER``  — ``w`` already counted and the bank is complete: unicast the stored result;
* ``DUPLICATE`` — ``w`` already counted, bank not complete yet: drop;
* ``STALE``   — a late copy of a completed use from a worker that has moved on: drop;
* ``CONFLICT`` — a new contribution whose key disagrees with the use in progress: drop.

:func:`mark` sets ``w``'s bit in this bank and clears it in the other bank of the slot (``w``
sending here proves it has the other bank's previous result: SwitchML's shadow copy).
"""

from __future__ import annotations

from .state import JobState

__all__ = ["FIRST", "ADD", "ANSWER", "DUPLICATE", "STALE", "CONFLICT", "check", "mark"]

FIRST, ADD, ANSWER, DUPLICATE, STALE, CONFLICT = range(6)


def check(job: JobState, i: int, worker_id: int, key: tuple[int, int, int, int]) -> int:
    bm = job.bitmap[i]
    cnt = job.count[i]
    complete = cnt == job.spec.world_size
    if bm >> worker_id & 1:
        return ANSWER if complete and job.key[i] == key else DUPLICATE
    if cnt == 0 or complete:
        if bm or job.key[i] == key:
            return STALE
        return FIRST
    return ADD if job.key[i] == key else CONFLICT


def mark(job: JobState, i: int, worker_id: int, first: bool) -> None:
    bit = 1 << worker_id
    job.bitmap[i] = bit if first else job.bitmap[i] | bit
    job.bitmap[i ^ 1] &= ~bit
