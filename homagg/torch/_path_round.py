"""A :class:`~homagg.torch._fallback.PathPort`'s :class:`~homagg.transport.OwnRound`: the switch
port's own arrays for a round shape, run through the path port's rounds.

The steady small call (:mod:`homagg.codec._small`) writes its words into the UDP port's own arrays
and reads the combined words from them (no copy in, no checks, no new arrays: a
:class:`~homagg.transport._roundplan.PlanRound`); the process group's port wraps that round as it
wraps every other one (:meth:`PathPort._round <homagg.torch._fallback.PathPort>`): it counts the
round, keeps a copy of its results as ``last`` (the port's own arrays are overwritten by its next
round; a recovery may broadcast them), and falls back to the host path on a transport error, with
the words this rank was sending (copies of :attr:`ins`).

Invariant: :meth:`PathRound.run` is the path port's ``combine_arrays`` of ``ops`` and copies of
:attr:`ins`: the same paths, bookkeeping, fallback and ``verify`` contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..transport import CombineOp, OwnRound, VerifyOnce, array_streams

__all__ = ["PathRound", "PathRounds", "arrays_round"]


def arrays_round(path: Any, run: Callable[[Any, VerifyOnce | None], list[np.ndarray]], ops: Sequence[CombineOp],
                 words: Callable[[], Sequence[np.ndarray]], verify: Callable[[np.ndarray], None] | None,
                 keep: Callable[[list[np.ndarray]], list[Any]]) -> list[np.ndarray]:
    """One round of host arrays through ``path`` (a ``PathPort``'s ``_round``): ``run(port, once)``
    on the path in use; on a transport error the fallback with ``words()`` (the words this rank was
    sending); ``keep(results)`` becomes ``last``.  Returns numpy arrays (a fallback's tensors
    converted); ``verify`` runs exactly once, also where a fallback's recovery did not verify."""
    once = None if verify is None else VerifyOnce(verify)
    out = path._round(lambda port: run(port, once), lambda: array_streams(ops, words(), once), keep)
    out = [a if isinstance(a, np.ndarray) else a.numpy() for a in out]  # a fallback's are tensors
    return out if once is None else once.ensure(out)


def _copies(out: list[np.ndarray]) -> list[np.ndarray]:
    return [a.copy() for a in out]


class PathRound(OwnRound):
    """``inner`` (the switch port's own round) as a round of ``path`` (a ``PathPort``)."""

    def __init__(self, path: Any, inner: OwnRound) -> None:
        self.path, self.inner = path, inner
        self.ops = inner.ops
        self.ins = inner.ins
        self.kept = inner.kept  # the same arrays: the same entries

    def run(self, verify: Callable[[np.ndarray], None] | None = None,
            on_results: tuple[int, int] | None = None) -> list[np.ndarray]:
        inner, path = self.inner, self.path
        if path.path == "host":  # the switch failed since this round was handed out: the host path's round
            return path.combine_arrays(self.ops, [w.copy() for w in self.ins], verify)
        # ``last`` keeps copies: the own arrays are overwritten by the port's next round (by the
        # shape's round after next where they are stable: then ``last`` holds them as they are);
        # the results hook serves the switch's round only (a fallback's round is the host path's)
        return arrays_round(path, lambda port, once: inner.run(once, on_results), self.ops,
                            lambda: [w.copy() for w in self.ins], verify, list if inner.stable else _copies)


class PathRounds:
    """A path port's :class:`PathRound` wrappers of the last two inner rounds it was handed (a
    steady call's shape repeats; a large shape's arrays come in turns: ``OwnRound.stable``)."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self._last: PathRound | None = None
        self._before: PathRound | None = None

    def of(self, inner: OwnRound) -> PathRound:
        held = self._last
        if held is None or held.inner is not inner:
            other, self._before = self._before, held
            held = self._last = other if other is not None and other.inner is inner else PathRound(self.path, inner)
        return held
