"""Switch counters: packets in/out and drops by reason, readable through the control ``status`` command.

Invariant: ``rx == sum(drop_*) + accepted + retransmit_answered + retransmit_up + result_down`` for
every ingress packet the pipeline saw: ``accepted`` counts new contributions, ``retransmit_answered``
retransmissions answered from a completed slot; in trees (docs/trees.md) ``retransmit_up`` counts
retransmissions a child answered by re-sending its use to its parent, ``result_down`` results from
the parent passed to the child's workers, and ``up`` (not an ingress event) the completed uses a
child sent to its parent.
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
    "result_flag",  # a result packet arriving at the switch, not from the job's parent
    "stale_result",  # a result from the parent for a use not waiting for it (already down, or another use)
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
        out = {"rx": 0, "tx": 0, "accepted": 0, "completed": 0, "retransmit_answered": 0, "up": 0,
               "retransmit_up": 0, "result_down": 0}
        out.update({"drop_" + r: 0 for r in DROP_REASONS})
        out.update(self)
        out["dropped"] = sum(v for k, v in out.items() if k.startswith("drop_"))
        return out
