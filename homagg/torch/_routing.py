"""Where an allreduce of the ``homagg`` process group runs: the codec or gloo, the caller's thread or
the group's worker.

* :func:`codec_takes`: float SUM/AVG and int32/int64 SUM of dense and sparse COO tensors go through
  the homagg codec; every other allreduce runs on the group's private gloo group.
* :func:`runs_inline`: a *small synchronous* codec allreduce issued outside backward may run in the
  caller's thread (:meth:`~homagg.torch._work.FifoWorker.run_inline`, only while the worker is
  idle).  Small: at most :data:`INLINE_MAX_BYTES` over all its tensors.  Synchronous:
  ``opts.asyncOp`` is false (``dist.all_reduce(t)`` sets it; ``async_op=True``, DDP's reducer, comm
  hooks and a direct ``group.allreduce`` without options leave it true), so the caller would block
  in ``wait()`` anyway and nothing it does can overlap the call.  Outside backward: DDP's buckets
  (and everything else issued while autograd runs) keep the worker, so they overlap the rest of
  backward.
* :func:`extremum_call`: a small synchronous MAX or MIN allreduce of one dense tensor goes through
  the switch's MAX (:mod:`homagg.codec._extremum`: one round, two for some int64 calls) in the
  caller's thread, and on to gloo where a NaN or a negative zero makes gloo's operand order matter.
* :func:`small_call` and :class:`SmallCalls`: the commonest small call (one dense tensor, SUM or
  AVG, synchronous) goes from the group's ``allreduce`` straight to the codec's small-call path,
  with both tests above answered at once (``tests/test_small_call_routing.py``) and the codec's own
  test for that path kept per size; the same call, less the general dispatch's work.

Invariant: running inline changes when a call runs in this process, never the order of calls on
any rank: it happens only when no queued or running task exists, and the worker starts no task
while it runs (see :class:`~homagg.torch._work.FifoWorker`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CODEC_FLOAT_DTYPES", "CODEC_INT_DTYPES", "INLINE_MAX_BYTES", "SmallCalls", "codec_takes",
           "extremum_call", "runs_inline", "small_call", "sync_outside_backward"]

CODEC_FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
CODEC_INT_DTYPES = frozenset({torch.int32, torch.int64})

#: the largest synchronous codec allreduce (bytes, all its tensors together; a sparse tensor counts
#: its dense size) that runs in the caller's thread when the worker is idle: 1 MiB, where a call's
#: hand-off to the worker and the wake-up (0.1-1.2 ms on a loaded 2-core host) still weigh against
#: its few rounds; larger calls gain nothing measurable from skipping them
INLINE_MAX_BYTES = 1 << 20
_SUM, _AVG = dist.ReduceOp.SUM.value, dist.ReduceOp.AVG.value
_MAX, _MIN = dist.ReduceOp.MAX.value, dist.ReduceOp.MIN.value
_LAYOUTS = (torch.strided, torch.sparse_coo)


def codec_takes(tensors: list[torch.Tensor], op: Any) -> bool:
    """Whether the homagg codec reduces ``tensors`` with ``op`` (a ``RedOpType``)."""
    code = getattr(op, "value", None)  # RedOpType's int (cheaper to compare than the enum)
    if code != _SUM and code != _AVG:
        return False
    for t in tensors:
        if t.layout not in _LAYOUTS:
            return False
        if t.dtype in CODEC_INT_DTYPES:
            if code != _SUM:
                return False
        elif t.dtype not in CODEC_FLOAT_DTYPES:
            return False
    return True


def runs_inline(tensors: list[torch.Tensor], opts: Any) -> bool:
    """Whether a codec allreduce of ``tensors`` may run in the caller's thread (see the module
    docstring): synchronous, outside backward, at most :data:`INLINE_MAX_BYTES`."""
    if not isinstance(opts, dist.AllreduceOptions) or getattr(opts, "asyncOp", True):
        return False
    if torch._C._current_graph_task_id() != -1:
        return False
    size = 0
    for t in tensors:
        size += t.numel() * t.element_size()
    return size <= INLINE_MAX_BYTES


def small_call(tensors: list[torch.Tensor], opts: Any) -> bool | None:
    """:func:`codec_takes` and :func:`runs_inline` at once for the commonest small call (one dense
    tensor, ``AllreduceOptions`` with SUM or AVG): whether it averages; None where either says no
    or the call is another kind (then ask them).  The process group sends it straight to the
    small-call path where that takes it (:meth:`~homagg.torch.ProcessGroupHomagg.allreduce`)."""
    if len(tensors) != 1 or type(opts) is not dist.AllreduceOptions or opts.asyncOp:
        return None
    t = tensors[0]
    if t.layout is not torch.strided or torch._C._current_graph_task_id() != -1:
        return None
    code = opts.reduceOp.op.value
    dtype = t.dtype
    if not (code == _SUM or (code == _AVG and dtype in CODEC_FLOAT_DTYPES)):
        return None
    if dtype not in CODEC_FLOAT_DTYPES and dtype not in CODEC_INT_DTYPES:
        return None
    return code == _AVG if t.numel() * t.element_size() <= INLINE_MAX_BYTES else None


class SmallCalls:
    """A group's straight route to the codec's small-call path (:mod:`homagg.codec._small`) for a
    call :func:`small_call` takes: ``homagg.allreduce``'s test for that path (its options, scheme
    and world are the group's, fixed for its life) kept per numel and dtype, and the call itself,
    as ``homagg.allreduce`` makes it (in place, counted, the group's history under key None)."""

    def __init__(self, scheme: str, config: Any, world: int) -> None:
        from ..codec import _small  # here, not at module import (entry-point safety)

        self._module, self.scheme, self.config, self.world = _small, scheme, config, world
        self._takes: dict[tuple[int, torch.dtype], bool] = {}

    def takes(self, t: torch.Tensor) -> bool:
        """Whether the small-call path takes ``t`` (dense; :func:`small_call` took it)."""
        key = (t.numel(), t.dtype)
        takes = self._takes.get(key)
        if takes is None:
            if len(self._takes) >= 4096:
                self._takes.clear()
            takes = self._takes[key] = self._module.takes(t, self.scheme, self.config, self.world)
        return takes

    def allreduce(self, t: torch.Tensor, port: Any, stats: Any, history: Any) -> None:
        """``homagg.allreduce(t, port, inplace=True, ...)`` for a ``t`` it :meth:`takes`."""
        stats.calls += 1
        self._module.allreduce(t, port, self.scheme, self.config, stats, True, history, None)


def extremum_call(tensors: list[torch.Tensor], opts: Any, takes: Callable[[torch.Tensor], bool]) -> str | None:
    """``"max"`` or ``"min"`` where a synchronous allreduce outside backward of one tensor with
    ReduceOp.MAX or MIN goes through the switch's MAX (:mod:`homagg.codec._extremum`: ``takes``,
    its test of the tensor), else None (gloo runs it)."""
    if len(tensors) != 1 or not isinstance(opts, dist.AllreduceOptions) or opts.asyncOp:
        return None
    code = opts.reduceOp.op.value
    if code != _MAX and code != _MIN or torch._C._current_graph_task_id() != -1:
        return None
    return ("max" if code == _MAX else "min") if takes(tensors[0]) else None


def sync_outside_backward(opts: Any) -> bool:
    """Whether an operation the group runs on its private gloo group (broadcast, allgather, barrier,
    an allreduce the codec does not take) may run in the caller's thread: synchronous
    (``opts.asyncOp`` false, as ``dist.barrier()`` and ``dist.broadcast(t, src)`` set it) and outside
    backward.  Any size: gloo does the work either way, and the caller waits for it either way; what
    is saved is the hand-off to the worker and the wake-up back (which, for a barrier, also skews
    when the ranks leave it)."""
    return (opts is not None and getattr(opts, "asyncOp", True) is False
            and torch._C._current_graph_task_id() == -1)
