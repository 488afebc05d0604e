"""Switch counters: packets in/out and drops by reason, readable through the control ``status`` command.

Invariant: ``rx == sum(drop_*) + accepted`` for every ingress packet the pipeline saw (``accepted``
counts new contributions, duplicates answered from a completed slot count as ``retransmit_answered``).
"""

from __future__ import annotations

from collections import Counter

__all__ = ["Counters", "DROP_REASONS"]

#: every reason the pipeline may drop a datagram for (the P4 program keeps the same counter names)
DROP_REASONS = (
    "short",  # shorter than the header
    "version",  # wrong version
    "op",  # unknown combine op
    "length",  # datagram length != header + 4 * word_count, or word_count == 0
    "result_flag",  # a result packet arriving at the switch
    "unknown_source",  # source address not admitted
    "admission_mismatch",  # header job/worker differ from the admitted source's
    "token",  # right source, job and worker, but not the job's admission token (forged)
    "word_count",  # more words than the job's K
    "slot_range",  # slot outside the job's range
    "duplicate",  # worker already counted in an incomplete slot
    "stale",  # copy of an already completed use from a worker that moved on
    "conflict",  # new contribution disagrees with the slot's (tag, offset, op, word_count)
    "injected",  # fault injection
)


class Counters(Counter):
    """A :class:`collections.Counter` of event names (``rx``, ``tx``, ``drop_<reason>``, ...)."""

    def drop(self, reason: str) -> None:
        self["drop_" + reason] += 1

    def snapshot(self) -> dict[str, int]:
        out = {"rx": 0, "tx": 0, "accepted": 0, "completed": 0, "retransmit_answered": 0}
        out.update({"drop_" + r: 0 for r in DROP_REASONS})
        out.update(self)
        out["dropped"] = sum(v for k, v in out.items() if k.startswith("drop_"))
        return out
