"""The in-process switch: the reference :class:`~homagg.transport.SwitchPort` for threads of one process.

``InProcessSwitch(world_size).port(rank)`` gives each worker (thread) its port; a round completes
when every worker has called ``combine``; the result is :func:`~homagg.transport.combine_words`
of the round, a private copy per worker (as over a network).  Waits are bounded by ``timeout``
seconds and name the missing ranks.  Used by :func:`homagg.testing.local_allreduce` and tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from .._errors import ConfigError, ProtocolError, SwitchTimeoutError
from ._base import Stream, SwitchPort, combine_words

__all__ = ["InProcessSwitch"]


class InProcessSwitch:
    """A switch for ``world_size`` workers living in one process (threads).

    ``port(rank)`` gives each worker its :class:`SwitchPort`; a round completes when every worker
    has called ``combine``.  Waits are bounded by ``timeout`` seconds and name the missing ranks.
    """

    def __init__(self, world_size: int, timeout: float = 60.0,
                 combiner: Callable[[list[Sequence[Stream]]], list[torch.Tensor]] | None = None) -> None:
        if world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout = timeout
        #: combines a complete round (every rank's streams, checked alike): the reference
        #: ``combine_words`` by default; :class:`homagg.testing.TreeNetwork` passes real switch pipelines
        self._combiner = combiner
        self._cond = threading.Condition()
        self._pending: dict[int, Sequence[Stream]] = {}
        self._generation = 0
        self._results: list[torch.Tensor] | BaseException | None = None
        self._failed: BaseException | None = None

    def port(self, rank: int) -> SwitchPort:
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} outside [0, {self.world_size})")
        return _InProcessPort(self, rank)

    def fail(self, exc: BaseException) -> None:
        """Abort every waiting and future round with ``exc`` (a worker died)."""
        with self._cond:
            self._failed = exc
            self._cond.notify_all()

    def _combine(self, rank: int, streams: Sequence[Stream]) -> list[torch.Tensor]:
        with self._cond:
            if self._failed is not None:
                raise self._failed
            gen = self._generation
            if rank in self._pending:
                raise ProtocolError(f"rank {rank} sent twice in round {gen}")
            self._pending[rank] = streams
            if len(self._pending) == self.world_size:
                rounds = [self._pending[r] for r in range(self.world_size)]
                try:
                    self._results = _combine_rounds(rounds, self._combiner)
                except BaseException as exc:  # noqa: BLE001 - handed to every worker
                    self._results = exc
                self._pending = {}
                self._generation += 1
                self._cond.notify_all()
            elif not self._cond.wait_for(
                lambda: self._generation != gen or self._failed is not None, timeout=self.timeout
            ):
                missing = sorted(set(range(self.world_size)) - set(self._pending))
                raise SwitchTimeoutError(
                    f"in-process switch: round {gen} timed out after {self.timeout}s; no words from ranks {missing}"
                )
            if self._failed is not None and self._generation == gen:
                raise self._failed
            result = self._results
        if isinstance(result, BaseException):
            raise result
        assert result is not None
        return [t.clone() for t in result]  # each worker owns its copy, as over a network


def _combine_rounds(rounds: list[Sequence[Stream]],
                    combiner: Callable[[list[Sequence[Stream]]], list[torch.Tensor]] | None = None) -> list[torch.Tensor]:
    first = rounds[0]
    for r, streams in enumerate(rounds):
        sig = [(s.name, s.op, s.length) for s in streams]
        ref = [(s.name, s.op, s.length) for s in first]
        if sig != ref:
            heads = [rd[0] for rd in rounds if rd]
            # the heads' names may differ (combine_arrays names its streams): their words meet all the same
            if len(heads) == len(rounds) and first[0].verify is not None and len({(h.op, h.length)
                                                                                  for h in heads}) == 1:
                first[0].verify(combine_words(first[0].op, [h.materialize() for h in heads]))  # raises the typed error
            raise ProtocolError(f"rank {r} sent streams {sig}, rank 0 sent {ref}")
    if combiner is not None:
        return combiner(rounds)
    return [combine_words(s.op, [rd[i].materialize() for rd in rounds]) for i, s in enumerate(first)]


class _InProcessPort(SwitchPort):
    def __init__(self, switch: InProcessSwitch, rank: int) -> None:
        self._switch = switch
        self.rank = rank
        self.world_size = switch.world_size

    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        return self._switch._combine(self.rank, streams)
