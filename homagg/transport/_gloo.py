"""``HOMAGG_SWITCH=gloo``: a :class:`~homagg.SwitchPort` that emulates the switch with gloo.

No network element is involved: each round's streams are combined with at most three gloo
allreduces over a *private* gloo group (never the one the process group delegates to), grouped by
combine op.  ADD wraps modulo 2**32 exactly like the switch (int64 SUM, then wrap; exact for fewer
than 2**31 workers), OR uses ``ReduceOp.BOR``, MAX uses ``ReduceOp.MAX`` on int32.  Useful where
UDP to an emulator is unavailable, and as a reference in tests; it is *not* in-network aggregation.

Invariant: the caller owns the gloo group and calls :meth:`combine` from one thread only (the
process group's FIFO worker), so every rank issues the same gloo calls in the same order.
Failures map through :func:`~homagg.transport.transport_error`: a gloo call that fails after
waiting ``timeout_s`` (the gloo group's own timeout) is a :class:`~homagg.SwitchTimeoutError`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from .._errors import ProtocolError, TransportError
from ._base import CombineOp, Stream, SwitchPort, wrap_int32
from ._errmap import transport_error

__all__ = ["GlooSwitchPort"]

_REDUCE = {CombineOp.ADD: dist.ReduceOp.SUM, CombineOp.OR: dist.ReduceOp.BOR, CombineOp.MAX: dist.ReduceOp.MAX}


class GlooSwitchPort(SwitchPort):
    """Switch contract over a private gloo group (``rank``/``world_size`` are the group's;
    ``timeout_s`` is the timeout the gloo group was created with)."""

    def __init__(self, gloo: dist.ProcessGroup, rank: int, world_size: int, timeout_s: float | None = None) -> None:
        self._gloo: dist.ProcessGroup | None = gloo
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s

    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        gloo = self._gloo
        if gloo is None:
            raise TransportError("gloo switch port is closed")
        if len(streams) > 1 and streams[0].verify is not None:
            # a verified head (the call descriptor) alone first: out-of-step ranks fail on it here,
            # not inside a gloo allreduce of mismatched sizes
            head = self.combine([streams[0]])[0]
            streams[0].verify(head)
            return [head, *self.combine(streams[1:])]
        results: list[torch.Tensor | None] = [None] * len(streams)
        for op in (CombineOp.ADD, CombineOp.OR, CombineOp.MAX):
            idx = [i for i, s in enumerate(streams) if s.op == op]
            if not idx:
                continue
            parts = [streams[i].materialize().detach().to("cpu") for i in idx]
            flat = torch.cat(parts).to(torch.int64 if op == CombineOp.ADD else torch.int32)
            opts = dist.AllreduceOptions()
            opts.reduceOp = _REDUCE[op]
            t0 = time.monotonic()
            try:
                gloo.allreduce([flat], opts).wait()
            except RuntimeError as exc:
                raise transport_error(exc, f"gloo switch emulation ({op.name} of {flat.numel()} words)",
                                      timeout_s=self.timeout_s, waited_s=time.monotonic() - t0) from exc
            if op == CombineOp.ADD:
                flat = wrap_int32(flat)
            for i, chunk in zip(idx, torch.split(flat, [p.numel() for p in parts])):
                results[i] = chunk.to(streams[i].device)
        out = [r for r in results if r is not None]
        if len(out) != len(streams):  # pragma: no cover - every op is handled above
            raise ProtocolError("gloo switch emulation lost a stream")
        return out

    def close(self) -> None:
        self._gloo = None
