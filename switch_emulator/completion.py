"""Stage 5, completion (P4: ``Completion``).

``count[i]`` is the number of workers marked in the current use (:func:`switch_emulator.bitmap.update`
keeps it); a FIRST or ADD packet completes the (slot, bank) when it leaves no worker of the job
unmarked (the result is then replicated).  A poisoned use never gets there with a FIRST or ADD.
"""

from __future__ import annotations

from .state import JobState

__all__ = ["complete"]


def complete(job: JobState, i: int) -> bool:
    """True when every worker of the job is marked in the (slot, bank)'s current use."""
    return job.count[i] == job.spec.world_size
