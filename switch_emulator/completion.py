"""Stage 5, completion counter (P4: ``Completion``).

``count[i]`` is 1 after a first write and grows by one per accepted contribution; the use is
complete when it reaches the job's ``world_size`` (the result is then replicated).
"""

from __future__ import annotations

from .state import JobState

__all__ = ["count"]


def count(job: JobState, i: int, first: bool) -> bool:
    """Count one contribution; True when it completes the (slot, bank)."""
    c = 1 if first else job.count[i] + 1
    job.count[i] = c
    return c == job.spec.world_size
