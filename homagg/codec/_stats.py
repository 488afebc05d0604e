"""Per-worker statistics of one or more allreduces."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["WorkerStats"]


@dataclass
class WorkerStats:
    """What one worker sent.  Accumulates over calls when the same object is reused.

    bytes_per_stream  payload bytes sent per stream name ("exponents", "bitmap", "values", ...)
    rounds            combine rounds (each costs one round trip through the switch)
    calls             allreduces run (``rounds / calls`` is the mean rounds per allreduce)
    segments          pipelined segments run (a large tensor's segments each take their own
                      rounds, overlapped; ``rounds / segments`` is then the rounds per segment)
    redos             rounds spent redoing blocks whose exponent moved since the guessed (previous) call
    redone            elements carried by those redo rounds
    repaired          elements recovered by the 2-core repair round (sketch)
    schemes           how many tensors each concrete scheme carried (auto resolves to one)
    sketch_cells      cells of the last sketch sent (0 if none)
    paths             process-group allreduces per path that completed them: ``switch`` or
                      ``host`` (the group's gloo; a call that lost the switch midway counts as host)
    transitions       the group's path changes, in order: dicts with ``at_call``, ``from``, ``to``,
                      ``cause`` and measured seconds (``detect_s``, ``agree_s``; ``readmit_s``)
    """

    bytes_per_stream: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    calls: int = 0
    segments: int = 0
    redos: int = 0
    redone: int = 0
    repaired: int = 0
    schemes: Counter[str] = field(default_factory=Counter)
    sketch_cells: int = 0
    paths: Counter[str] = field(default_factory=Counter)
    transitions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def bytes_sent(self) -> int:
        return sum(self.bytes_per_stream.values())
