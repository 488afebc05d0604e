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

Invariant: running inline changes when a call runs in this process, never the order of calls on
any rank: it happens only when no queued or running task exists, and the worker starts no task
while it runs (see :class:`~homagg.torch._work.FifoWorker`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CODEC_FLOAT_DTYPES", "CODEC_INT_DTYPES", "INLINE_MAX_BYTES", "codec_takes", "runs_inline", "sync_outside_backward"]

CODEC_FLOAT_DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
CODEC_INT_DTYPES = frozenset({torch.int32, torch.int64})

#: the largest synchronous codec allreduce (bytes, all its tensors together; a sparse tensor counts
#: its dense size) that runs in the caller's thread when the worker is idle: 1 MiB, where a call's
#: hand-off to the worker and the wake-up (0.1-1.2 ms on a loaded 2-core host) still weigh against
#: its few rounds; larger calls gain nothing measurable from skipping them
INLINE_MAX_BYTES = 1 << 20


def codec_takes(tensors: list[torch.Tensor], op: Any) -> bool:
    """Whether the homagg codec reduces ``tensors`` with ``op`` (a ``RedOpType``)."""
    if not (op == dist.ReduceOp.SUM or op == dist.ReduceOp.AVG):
        return False
    for t in tensors:
        if t.layout not in (torch.strided, torch.sparse_coo):
            return False
        if t.dtype in CODEC_INT_DTYPES:
            if op != dist.ReduceOp.SUM:
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


def sync_outside_backward(opts: Any) -> bool:
    """Whether an operation the group runs on its private gloo group (broadcast, allgather, barrier,
    an allreduce the codec does not take) may run in the caller's thread: synchronous
    (``opts.asyncOp`` false, as ``dist.barrier()`` and ``dist.broadcast(t, src)`` set it) and outside
    backward.  Any size: gloo does the work either way, and the caller waits for it either way; what
    is saved is the hand-off to the worker and the wake-up back (which, for a barrier, also skews
    when the ranks leave it)."""
    return (opts is not None and getattr(opts, "asyncOp", True) is False
            and torch._C._current_graph_task_id() == -1)
