"""What earlier allreduces of a tensor agreed: the state that lets steady-state calls skip rounds.

A call that finds an :class:`Agreed` entry for its key quantises each block under a *guess*: the
previous call's agreed block exponent raised by a little headroom (``CodecConfig.guess_window``),
and sends the fresh local exponents (MAX) and its guesses in the same round as its values; it
sizes a sketch from the previous call's exact union size.  Everything stored here comes from
combined words (identical on every worker), so every worker makes the same decisions — the one
requirement is that all workers use the same keys in the same call order, which collectives
guarantee.

Invariant (exactness): a guess never breaks a result.  A block's words stand only when every
contributor quantised it under the same exponent ``G`` with ``E <= G <= E + slack`` (``E`` the
fresh agreed exponent, ``slack`` the precision bits the error bound leaves unused), so its sums
are exact integer sums that fit int32 and decode within the documented bound, identically on
every worker; the other blocks are redone under ``E`` in one more round.  With
``guess_window=False`` the window is ``G == E``: results bit-identical to a call without history.

A guess pays only while the exponents stay inside the window: ``changed`` records the fraction of
blocks whose agreed exponent left it since the call before, and a call whose two predecessors
both moved more than an exponent round is worth agrees its exponents first instead (exponents
that keep jumping by more than the window; drift of a binary order or two per training step
stays inside it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import torch

from .._errors import ConfigError

__all__ = ["Agreed", "History"]


@dataclass(frozen=True)
class Agreed:
    """What one call agreed: block exponents (floats, else ``None``) and the union's size (and,
    for this worker only, how many nonzeros it held).

    ``union`` is exact for compact/sketch (popcount of the combined bitmap) and the number of
    nonzero sums for dense (a lower bound only when sums cancel to zero).  ``changed`` is computed
    from agreed exponents only, so every worker records the same.
    """

    exponents: torch.Tensor | None
    union: int
    #: fraction of the blocks holding a value in this call and the previous one whose agreed
    #: exponent differed (the blocks a guess would have redone); 0 where there was no previous call
    changed: float = 0.0
    #: this worker's own nonzeros in the call (0 where it listed none): not agreed, and no decision
    #: depends on it; it only sizes the next call's scan buffers (room for its listing)
    local_nnz: int = 0
    #: ``changed`` of the call before (the guess stops only while exponents keep moving)
    changed_before: float = 0.0


class History:
    """Per-key :class:`Agreed` of the latest call, least recently used keys dropped beyond ``max_keys``.

    Keys are ``(key, numel, dtype, world_size, block_size)``: a caller-chosen role (``None`` for
    "any tensor of this size and dtype", as a DDP bucket) plus what the stored state depends on.
    """

    def __init__(self, max_keys: int = 256) -> None:
        if max_keys < 1:
            raise ConfigError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self._entries: OrderedDict[Hashable, Agreed] = OrderedDict()

    def get(self, key: Hashable) -> Agreed | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: Hashable, agreed: Agreed) -> None:
        self._entries[key] = agreed
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
