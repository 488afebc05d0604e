"""A barrier as one switch round: every rank's call descriptor, combined with MAX.

The round completes at a rank only when every rank of the job sent its words (the switch answers a
slot once all workers' datagrams are in), so no rank leaves :func:`barrier` before every rank
entered it: SHARP's in-network barrier, one round trip where gloo's takes messages between ranks.
The words are the call descriptor (:mod:`._descriptor`, scheme field "barrier"), so a rank in a
barrier and one in an ``all_reduce`` meet in the same first chunk and both raise
:class:`~homagg.RankMismatchError` instead of waiting for each other.

Waiting: a barrier may wait for a rank that comes minutes late (rank 0 writing a checkpoint), so the
caller runs it inside :meth:`~homagg.transport.SwitchPort.patient` with the group's timeout; a dead
switch (:mod:`homagg.transport._liveness`) or a dead rank (:mod:`homagg.transport._peers`) still ends
the wait within about a second.

Invariant: :func:`barrier` returns on a rank only after every rank of the port's job called it
(on the switch, in-process or on the gloo host path alike).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ..transport import CombineOp, SwitchPort
from . import _descriptor
from ._fixedpoint import EMPTY_EXPONENT
from ._stats import WorkerStats

__all__ = ["barrier"]

_OPS = (CombineOp.MAX,)
_LENGTHS = (_descriptor.LENGTH,)


@lru_cache(maxsize=64)
def _words(world: int) -> np.ndarray:
    """The barrier's descriptor stream (never handed out: copied into the round)."""
    head = _descriptor.words(0, torch.int32, _descriptor.BARRIER, world, 0)
    return np.array(head + (EMPTY_EXPONENT,) * _descriptor.SPARE, dtype=np.int32)


def barrier(port: SwitchPort, stats: WorkerStats | None = None) -> None:
    """Return once every worker behind ``port`` called it (one round; see the module docstring)."""
    words = _words(port.world_size)
    own = port.own_round(_OPS, _LENGTHS)
    if own is None:
        port.combine_arrays(_OPS, [words], _descriptor.AGREEMENT)
    else:  # copied every time: other rounds of this shape (a 64-bit MAX's second) share the arrays
        np.copyto(own.ins[0], words)
        own.run(_descriptor.AGREEMENT)
    if stats is not None:
        stats.rounds += 1
