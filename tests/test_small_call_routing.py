"""The process group's straight route for small calls (:func:`homagg.torch._routing.small_call`)
against the two tests it fuses (:func:`~homagg.torch._routing.codec_takes` and
:func:`~homagg.torch._routing.runs_inline`): over every combination of tensor kind, op and options
it takes a call only where both take it (and says AVG exactly where the op is AVG), and it takes
every one-tensor dense call with ``AllreduceOptions`` that both take."""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from homagg.torch._routing import INLINE_MAX_BYTES, codec_takes, runs_inline, small_call

TENSORS = {
    "f32": lambda: torch.ones(3), "f64 2-D": lambda: torch.ones(2, 2, dtype=torch.float64),
    "bf16": lambda: torch.ones(4, dtype=torch.bfloat16), "f16 scalar": lambda: torch.tensor(1.0, dtype=torch.float16),
    "i32": lambda: torch.ones(3, dtype=torch.int32), "i64": lambda: torch.ones(3, dtype=torch.int64),
    "i8": lambda: torch.ones(3, dtype=torch.int8), "bool": lambda: torch.ones(3, dtype=torch.bool),
    "sparse": lambda: torch.ones(3).to_sparse(), "strided view": lambda: torch.ones(6)[::2],
    "big": lambda: torch.ones(INLINE_MAX_BYTES // 4 + 1), "at the limit": lambda: torch.ones(INLINE_MAX_BYTES // 4),
    "requires grad": lambda: torch.ones(3, requires_grad=True),
}
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]


def _options(op: dist.ReduceOp, async_op: bool) -> dist.AllreduceOptions:
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    opts.asyncOp = async_op
    return opts


def test_small_call_takes_exactly_what_codec_takes_and_runs_inline_take() -> None:
    taken = 0
    for (name, make), op, async_op, count in itertools.product(TENSORS.items(), OPS, (False, True), (1, 2)):
        tensors = [make() for _ in range(count)]
        opts = _options(op, async_op)
        both = codec_takes(tensors, op) and runs_inline(tensors, opts)
        got = small_call(tensors, opts)
        if got is not None:
            assert both, (name, op, async_op, count)
            assert got == (op == dist.ReduceOp.AVG), (name, op)
            taken += 1
        elif count == 1 and tensors[0].layout == torch.strided:
            assert not both, (name, op, async_op)  # the straight route misses no one-tensor call both take
    assert taken == 7 * 2 + 2  # 7 float kinds with SUM and AVG, int32 and int64 with SUM (by kind below)


def test_small_call_counts_by_kind() -> None:
    sync_sum, sync_avg = _options(dist.ReduceOp.SUM, False), _options(dist.ReduceOp.AVG, False)
    for name in ("f32", "f64 2-D", "bf16", "f16 scalar", "strided view", "at the limit", "requires grad"):
        assert small_call([TENSORS[name]()], sync_sum) is False and small_call([TENSORS[name]()], sync_avg) is True
    for name in ("i32", "i64"):  # integers: SUM only
        assert small_call([TENSORS[name]()], sync_sum) is False and small_call([TENSORS[name]()], sync_avg) is None
    for name in ("i8", "bool", "sparse", "big"):
        assert small_call([TENSORS[name]()], sync_sum) is None
    assert small_call([torch.ones(3)], _options(dist.ReduceOp.SUM, True)) is None  # async: the worker's
    assert small_call([torch.ones(3)], dist.ReduceOp.SUM) is None  # not AllreduceOptions: the general route
    assert small_call([torch.ones(3), torch.ones(3)], sync_sum) is None
