"""Stage 2, slot/bank selection (P4: ``SlotSelect``).

The header's absolute ``slot`` must lie in the job's range; the (slot, bank) pair becomes the
register index ``i = 2 * (slot - slot_base) + bank`` (see :mod:`switch_emulator.state`).
Returns ``-1`` for a slot outside the range (``drop_slot_range``).
"""

from __future__ import annotations

from .state import JobState

__all__ = ["select"]


def select(job: JobState, slot: int, bank: int) -> int:
    rel = slot - job.spec.slot_base
    if 0 <= rel < job.spec.n_slots:
        return 2 * rel + bank
    return -1
