"""The switch contract: what a worker needs from an aggregating network element.

A *round* is a list of :class:`Stream` objects, each an int32 word vector tagged with the way a
switch combines it (:class:`CombineOp`).  Every worker of a job hands its round to its
:class:`SwitchPort`; ``combine`` returns, to every worker, the element-wise combination over all
workers of each stream:

* ``ADD`` — two's complement addition modulo 2**32 (wraps, like P4 ``bit<32>`` arithmetic),
* ``OR``  — bitwise or,
* ``MAX`` — signed int32 maximum.

Invariants every implementation keeps: streams of one round have equal names, ops and lengths on
every worker (else :class:`~homagg.ProtocolError`); the result is identical on every worker and
independent of arrival order.  The codec never knows how words travel; transports never know what
they mean.  :class:`InProcessSwitch` is the reference implementation (tests, ``local_allreduce``);
the UDP transport to the emulator or BMv2 implements the same :class:`SwitchPort`.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._errors import ConfigError, ProtocolError, SwitchTimeoutError
from .wire import CombineOp

__all__ = ["CombineOp", "Stream", "SwitchPort", "InProcessSwitch", "combine_words"]


@dataclass(frozen=True)
class Stream:
    """One int32 word vector of a round, with its combine op and a name for statistics."""

    name: str
    op: CombineOp
    words: torch.Tensor

    def __post_init__(self) -> None:
        w = self.words
        if w.dtype != torch.int32 or w.dim() != 1:
            raise ProtocolError(f"stream {self.name!r} must be a 1-D int32 tensor, got {w.dtype} {tuple(w.shape)}")


def combine_words(op: CombineOp, vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Combine equal-length int32 vectors with ``op`` exactly as a switch does (ADD wraps mod 2**32)."""
    if not vectors:
        raise ProtocolError("nothing to combine")
    if op == CombineOp.ADD:
        acc = torch.zeros_like(vectors[0], dtype=torch.int64)
        for v in vectors:
            acc += v
        return wrap_int32(acc)
    acc = vectors[0].clone()
    for v in vectors[1:]:
        if op == CombineOp.OR:
            acc |= v
        elif op == CombineOp.MAX:
            torch.maximum(acc, v, out=acc)
        else:  # pragma: no cover - enum is closed
            raise ProtocolError(f"unknown combine op {op!r}")
    return acc


def wrap_int32(x: torch.Tensor) -> torch.Tensor:
    """Reduce an int64 tensor modulo 2**32 into two's complement int32 (no overflow, any device)."""
    return (((x + 2**31) & 0xFFFFFFFF) - 2**31).to(torch.int32)


class SwitchPort(abc.ABC):
    """One worker's access to the switch.  Implementations: in-process, UDP emulator, BMv2."""

    rank: int
    world_size: int

    @abc.abstractmethod
    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        """Send this worker's round; return the combined words of every stream (same order, int32,
        on the device of that stream's words)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources held by this port."""


class InProcessSwitch:
    """A switch for ``world_size`` workers living in one process (threads).

    ``port(rank)`` gives each worker its :class:`SwitchPort`; a round completes when every worker
    has called ``combine``.  Waits are bounded by ``timeout`` seconds and name the missing ranks.
    """

    def __init__(self, world_size: int, timeout: float = 60.0) -> None:
        if world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout = timeout
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
                    self._results = _combine_rounds(rounds)
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


def _combine_rounds(rounds: list[Sequence[Stream]]) -> list[torch.Tensor]:
    first = rounds[0]
    for r, streams in enumerate(rounds):
        sig = [(s.name, s.op, s.words.numel()) for s in streams]
        ref = [(s.name, s.op, s.words.numel()) for s in first]
        if sig != ref:
            raise ProtocolError(f"rank {r} sent streams {sig}, rank 0 sent {ref}")
    return [combine_words(s.op, [rd[i].words for rd in rounds]) for i, s in enumerate(first)]


class _InProcessPort(SwitchPort):
    def __init__(self, switch: InProcessSwitch, rank: int) -> None:
        self._switch = switch
        self.rank = rank
        self.world_size = switch.world_size

    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        return self._switch._combine(self.rank, streams)
