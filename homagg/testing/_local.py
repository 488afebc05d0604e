"""In-process jobs of the test harness: W workers in threads of this process, the real protocol.

Public through :mod:`homagg.testing` (``local_allreduce``, ``run_local``, ``LocalRun``,
``on_threads``, ``check_combine``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from .._errors import InputError
from ..codec._protocol import allreduce
from ..codec._stats import WorkerStats
from ..transport import InProcessSwitch, Stream, SwitchPort, combine_words
from ..wire import CombineOp
from ._oracle import ResultMismatchError

__all__ = ["LocalRun", "run_local", "local_allreduce", "on_threads", "check_combine"]

T = TypeVar("T")


@dataclass
class LocalRun:
    """Results and statistics of one in-process allreduce, indexed by worker."""

    results: list[torch.Tensor]
    stats: list[WorkerStats]


def run_local(tensors: Sequence[torch.Tensor], scheme: str = "auto", timeout: float = 120.0, *,
              switch: InProcessSwitch | None = None, **options: Any) -> LocalRun:
    """Like :func:`local_allreduce`, also returning each worker's :class:`WorkerStats`; ``switch``
    (default: a fresh :class:`~homagg.transport.InProcessSwitch`) combines the rounds."""
    world = len(tensors)
    if world == 0:
        raise InputError("need at least one tensor (one per worker)")
    shapes = {tuple(t.shape) for t in tensors}
    dtypes = {t.dtype for t in tensors}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise InputError(f"all workers need equal shape and dtype, got shapes {shapes} and dtypes {dtypes}")
    if switch is None:
        switch = InProcessSwitch(world, timeout=timeout)
    elif switch.world_size != world:
        raise InputError(f"switch for {switch.world_size} workers, {world} tensors given")
    results: list[torch.Tensor | None] = [None] * world
    stats = [WorkerStats() for _ in range(world)]
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            results[rank] = allreduce(tensors[rank], switch.port(rank), scheme=scheme, stats=stats[rank], **options)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
            switch.fail(exc)

    threads = [threading.Thread(target=work, args=(r,), name=f"homagg-local-{r}") for r in range(1, world)]
    for t in threads:
        t.start()
    work(0)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return LocalRun([r for r in results if r is not None], stats)


def local_allreduce(tensors: Sequence[torch.Tensor], scheme: str = "auto", **options: Any) -> list[torch.Tensor]:
    """Each worker's result of the SUM allreduce of ``tensors`` (one tensor per worker)."""
    return run_local(tensors, scheme, **options).results


def on_threads(fn: Callable[[int], T], world: int, timeout: float = 60.0) -> list[T]:
    """``[fn(0), ..., fn(world - 1)]``, each call on its own thread (as workers run).

    The first exception of any call is re-raised; a call still running after ``timeout`` seconds
    raises :class:`ResultMismatchError` naming the ranks (nothing waits unbounded).
    """
    out: list[Any] = [None] * world
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,), name=f"homagg-on-threads-{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    hung = [r for r, t in enumerate(threads) if t.is_alive()]
    if hung:
        raise ResultMismatchError(f"ranks {hung} did not return within {timeout}s")
    return out


def check_combine(ports: Sequence[SwitchPort], data: Sequence[Sequence[torch.Tensor]],
                  ops: Sequence[CombineOp], timeout: float = 60.0) -> list[list[torch.Tensor]]:
    """One round through ``ports`` (worker r sends ``data[r][i]`` as stream i with ``ops[i]``),
    checked against the reference :func:`~homagg.transport.combine_words` on every worker.

    Returns each worker's results; raises :class:`ResultMismatchError` on any difference.
    """
    results = on_threads(lambda r: ports[r].combine([Stream(f"s{i}", op, data[r][i]) for i, op in enumerate(ops)]),
                         len(ports), timeout)
    for i, op in enumerate(ops):
        want = combine_words(op, [d[i] for d in data])
        bad = [r for r, res in enumerate(results) if not torch.equal(res[i], want)]
        if bad:
            raise ResultMismatchError(f"stream {i} ({op.name}): workers {bad} differ from the reference combine")
    return results
