"""Stage 3, worker bitmap check (P4: ``WorkerBitmap``): duplicate and retransmission detection.

A (slot, bank) index ``i`` holds one *use* at a time: its key ``(tag, op, word_count)``, its
offset, and the workers marked in it (``bitmap``, ``count`` of them).  The use is *done* when every
worker of the job is marked (``count == world_size``), or when the index was never used
(``count == 0``).  A packet of worker ``w`` with ``(tag, offset, op, word_count)`` is the use's
(*same*) when its ``(tag, op, word_count)`` equal the use's; it is *ok* when it is the same and its
offset equals the use's (the offset :data:`POISON` never does).  Verdicts:

* ``FIRST``   — not the same, the index done: the first contribution of a new use;
* ``ADD``     — ok, ``w`` not yet marked: a further contribution to the use in progress;
* ``ANSWER``  — ok, the use complete, ``FLAG_RETRANSMIT`` set: unicast the stored result;
* ``STALE``   — ok, the use complete, no ``FLAG_RETRANSMIT``: a late copy, drop;
* ``DUPLICATE`` — ``w`` marked already (or the same key with another offset in a complete use): drop;
* ``CONFLICT`` — ``w`` not marked, and another key while the use is in progress, or the same key
  with another offset: drop.

:func:`update` changes the state, as a function of the state and the packet alone (not of the
verdict: on Tofino the marking register is read and written before the offset is known, see
docs/p4-tofino.md): the same key marks ``w``; not the same key on a done index starts the new use;
the same key with another offset while the use is in progress *poisons* it (offset := POISON), so
that it never completes with an ok packet nor answers: a worker marked by a CONFLICT is never
counted, and its words are not in the cells.  The two banks of a slot are independent.
"""

from __future__ import annotations

from .state import JobState

__all__ = ["FIRST", "ADD", "ANSWER", "DUPLICATE", "STALE", "CONFLICT", "POISON", "check", "update"]

FIRST, ADD, ANSWER, DUPLICATE, STALE, CONFLICT = range(6)

#: the offset of a poisoned use; a packet's offset 0xFFFFFFFF is never ok
POISON = 0xFFFFFFFF


def check(job: JobState, i: int, worker_id: int, key: tuple[int, int, int, int], retransmit: bool) -> int:
    """The verdict for ``key = (tag, offset, op, word_count)`` at index ``i`` (state unchanged)."""
    use = job.key[i]
    cnt = job.count[i]
    seen = job.bitmap[i] >> worker_id & 1
    if use is None or (use[0], use[2], use[3]) != (key[0], key[2], key[3]):
        if cnt == 0 or cnt == job.spec.world_size:
            return FIRST
        return DUPLICATE if seen else CONFLICT
    ok = key[1] == use[1] != POISON
    if seen:
        if cnt == job.spec.world_size and ok:
            return ANSWER if retransmit else STALE
        return DUPLICATE
    return ADD if ok else CONFLICT


def update(job: JobState, i: int, worker_id: int, key: tuple[int, int, int, int]) -> None:
    """The state change for the packet: mark, start a new use, or poison (see the module)."""
    use = job.key[i]
    cnt = job.count[i]
    bit = 1 << worker_id
    done = cnt == 0 or cnt == job.spec.world_size
    if use is None or (use[0], use[2], use[3]) != (key[0], key[2], key[3]):
        if done:
            job.bitmap[i] = bit
            job.count[i] = 1
            job.key[i] = key
        return
    if not job.bitmap[i] & bit:
        job.bitmap[i] |= bit
        job.count[i] = cnt + 1
    if not done and key[1] != use[1]:
        job.key[i] = (use[0], POISON, use[2], use[3])
