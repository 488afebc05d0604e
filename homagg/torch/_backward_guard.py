"""Typed errors from collectives issued during backward: :class:`BackwardGuard`.

DDP waits on its buckets' futures from C++, where a Python exception turns into a RuntimeError.
The guard queues one final autograd callback per backward that issued a collective of the group;
it runs before DDP's own finalize callback, waits (bounded) for that backward's collectives and
their chained callbacks, and raises the original typed error, which ``loss.backward()`` then
raises unchanged.

Invariant: the guard holds works only until their backward ends; it never holds the group (the
group's check is handed to each backward's callback), so it adds no reference cycle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from ._work import HomaggWork

__all__ = ["BackwardGuard"]


class BackwardGuard:
    """The works issued during each running backward (keyed by autograd's graph task id)."""

    def __init__(self, wait_s: float) -> None:
        self._wait_s = wait_s
        self._works: dict[int, list[HomaggWork]] = {}
        self._lock = threading.Lock()

    def add(self, work: HomaggWork, check: Callable[[], None]) -> None:
        """Check ``work`` at the end of the current backward; then run ``check`` (which raises the
        group's sticky error, e.g. one of a nested collective issued by a comm hook's callback)."""
        gid = torch._C._current_graph_task_id()
        with self._lock:
            works = self._works.get(gid)
            if works is None:
                works = self._works[gid] = []
                torch.autograd.Variable._execution_engine.queue_callback(lambda: self._finish(gid, check))
            works.append(work)

    def _finish(self, gid: int, check: Callable[[], None]) -> None:
        with self._lock:
            works = self._works.pop(gid, [])
        for work in works:
            work.wait_settled(self._wait_s)
        check()

    def clear(self) -> None:
        with self._lock:
            self._works.clear()
