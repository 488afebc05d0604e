"""A homagg process group's calls on its switch port: the codec's SUM/AVG, the switch's MAX/MIN,
the barrier, each as one call of the group's path port (:class:`~homagg.torch._fallback.PathPort`).

:class:`SwitchCalls` is a mixin of :class:`~homagg.torch.ProcessGroupHomagg`, which routes each
allreduce (:mod:`._routing`) and runs these methods as tasks (on its worker, or inline in the
caller's thread); they use the group's state (its path port, switch link, codec options, history,
statistics and gloo task), declared below.

Invariant: every call on the switch port passes the path port's call boundary before it and is
counted after it (:meth:`SwitchCalls._on_port`); a codec error that is no transport error aborts
the path port, so that ranks waiting for this one's words do not fall back (see ``_fallback``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._errors import HomAggError, TransportError
from ._ops import as_options
from ._work import TaskResult

__all__ = ["SwitchCalls"]


class SwitchCalls:
    """The allreduce tasks of :class:`~homagg.torch.ProcessGroupHomagg` that use its switch port."""

    if TYPE_CHECKING:  # the group's (ProcessGroupHomagg's and torch's ProcessGroup's), never shadowed here
        _path: Any
        _small: Any
        _codec: Any
        _allreduce_fn: Any
        _extremum_fn: Any
        compressor: Any
        config: Any
        stats: Any
        history: Any
        switch: Any

        def size(self) -> int: ...

        _barrier_fn: Any
        _timeout: Any

        def _gloo_task(self, op: str, call: Any, result: list[torch.Tensor]) -> Any: ...

    def _extremum_allreduce(self, tensors: list[torch.Tensor], reduction: str, opts: Any) -> TaskResult:
        """MAX or MIN through the switch's MAX (:mod:`homagg.codec._extremum`); on gloo where a NaN
        or a negative zero makes gloo's operand order matter (every rank sees the same flag)."""
        if self._on_port(lambda port: self._extremum_fn(tensors[0], port, reduction, self.stats)):
            return tensors
        gloo_opts = as_options(opts)
        return self._gloo_task("allreduce", lambda g: g.allreduce(tensors, gloo_opts), tensors)()

    def _codec_allreduce(self, tensors: list[torch.Tensor], avg: bool, compress: bool = False,
                         small: bool = False) -> TaskResult:
        """The codec's SUM of each tensor, divided by the world size where ``avg`` (``small``: one
        that :class:`._routing.SmallCalls` takes, on the small-call path without
        ``homagg.allreduce``'s dispatch)."""

        def reduce(port: Any) -> list[torch.Tensor]:
            for t in tensors:
                if small:
                    self._small.allreduce(t, port, self.stats, self.history)
                elif compress and self.compressor is not None and self.compressor.takes(t):
                    self.compressor.allreduce(t, port, scheme=self.config.scheme, config=self._codec,
                                              stats=self.stats, history=self.history)
                else:
                    self._allreduce_fn(t, port, scheme=self.config.scheme, config=self._codec, inplace=True,
                                       stats=self.stats, history=self.history)
                if avg:
                    t.div_(self.size())
            return tensors

        return self._on_port(reduce)

    def _switch_barrier(self) -> TaskResult:
        """The group's barrier as one round of its path port (:mod:`homagg.codec._barrier`), waiting
        up to the group timeout for a late rank (:meth:`~homagg.transport.SwitchPort.patient`)."""

        def wait(port: Any) -> list[torch.Tensor]:
            with port.patient(self._timeout.total_seconds()):
                self._barrier_fn(port)  # not in ``stats``: those count the codec's allreduces
            return []

        return self._on_port(wait)

    def _on_port(self, call: Any) -> Any:
        """``call(port)`` as one call of the group's switch port: the path port's call boundary
        before it and its count after it; a codec error that is no transport error aborts the
        path port (ranks waiting for this one's words must not fall back: see _fallback)."""
        path = self._path
        port = path if path is not None else self.switch.port
        if path is not None:
            path.at_call_boundary()
        try:
            result = call(port)
        except HomAggError as exc:
            if path is not None and not isinstance(exc, TransportError):
                path.abort(exc)
            raise
        if path is not None:
            path.end_call()
        return result
