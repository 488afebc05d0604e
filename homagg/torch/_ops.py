"""Reduce-op helpers of the ``homagg`` process group, and the ops it delegates to its second gloo
group (see :mod:`._process_group`: why every op is defined in Python)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = ["DELEGATED_OPS", "reduce_op", "as_options", "delegated"]

#: ops that run on the delegate gloo group, under the names torch's Python API and its C++
#: trampoline use (a name the subclass does not define is called by the trampoline with the GIL held)
DELEGATED_OPS = (
    "allreduce_coalesced", "allgather_coalesced", "allgather_into_tensor_coalesced", "all_gather_single_coalesced",
    "reduce", "gather", "scatter", "alltoall", "alltoall_base", "all_to_all_single", "send", "recv",
    "recv_anysource", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced",
)


def reduce_op(opts: Any) -> Any:
    """The ``RedOpType`` of ``opts`` (AllreduceOptions, ReduceOp, RedOpType or None for SUM).

    ``ReduceOp`` objects compare equal to ``RedOpType`` values one way only, so normalise first.
    """
    op = opts.reduceOp if isinstance(opts, dist.AllreduceOptions) else opts
    if op is None:
        return dist.ReduceOp.SUM
    return getattr(op, "op", op)


def as_options(opts: Any) -> dist.AllreduceOptions:
    """``opts`` as ``AllreduceOptions`` (what gloo's ``allreduce`` takes)."""
    if isinstance(opts, dist.AllreduceOptions):
        return opts
    out = dist.AllreduceOptions()
    out.reduceOp = dist.ReduceOp(reduce_op(opts))
    return out


def delegated(name: str) -> Any:
    """The method ``name`` of the process group: ``name`` on its delegate gloo group."""
    def op(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._delegated_group(name), name)(*args, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"``{name}`` on the delegate gloo group, in the caller's thread, GIL released."
    return op
