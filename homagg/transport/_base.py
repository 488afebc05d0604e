"""The switch contract: what a worker needs from an aggregating network element.

A *round* is a list of :class:`Stream` objects, each an int32 word vector tagged with the way a
switch combines it (:class:`~homagg.wire.CombineOp`, the wire encoding).  Every worker of a job
hands its round to its :class:`SwitchPort`; ``combine`` returns, to every worker, the
element-wise combination over all workers of each stream:

* ``ADD`` -- two's complement addition modulo 2**32 (wraps, like P4 ``bit<32>`` arithmetic),
* ``OR``  -- bitwise or,
* ``MAX`` -- signed int32 maximum.

Invariants every port keeps: streams of one round have equal names, ops and lengths on every
worker (else :class:`~homagg.ProtocolError`); the result is identical on every worker and
independent of arrival order; every wait is bounded and raises
:class:`~homagg.SwitchTimeoutError` naming what was missing.  The codec never knows how words
travel; transports never know what they mean.

:func:`combine_words` is the reference semantics in torch (the in-process switch and the tests'
oracle); the emulator's numpy stage (``switch_emulator/combine.py``) and the P4 program
(``p4/combine.p4``) are the other targets, checked against it by tests.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .._errors import ProtocolError
from ..wire import CombineOp

__all__ = ["CombineOp", "Stream", "SwitchPort", "combine_words", "wrap_int32"]


@dataclass(frozen=True)
class Stream:
    """One int32 word vector of a round, with its combine op and a name for statistics.

    ``verify``, if set, is called with the stream's combined words; it raises (a typed
    :class:`~homagg.HomAggError`) when they show the workers out of step.  A port calls it as soon
    as the stream's words are back (before waiting for the rest of the round, where it can) and
    then raises that error instead of waiting; the codec calls it again on the round's results.
    """

    name: str
    op: CombineOp
    words: torch.Tensor
    verify: Callable[[torch.Tensor], None] | None = field(default=None, compare=False, repr=False)

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
    """One worker's access to the switch; the base of every transport.

    Siblings to copy for a new transport: :class:`~homagg.transport.InProcessSwitch`'s port
    (threads of one process), :class:`~homagg.transport.UdpSwitchPort` (emulator or BMv2 over
    UDP), :class:`~homagg.transport.GlooSwitchPort` (a private gloo group, no network element).
    A port maps its own failures to the :class:`~homagg.HomAggError` tree with
    :func:`homagg.transport.transport_error` (the one mapping).
    """

    rank: int
    world_size: int

    @abc.abstractmethod
    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        """Send this worker's round; return the combined words of every stream (same order, int32,
        on the device of that stream's words)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources held by this port (idempotent)."""

    def __enter__(self) -> SwitchPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
