"""In-process jobs of the test harness: W workers in threads of this process, the real protocol.

Public through :mod:`homagg.testing` (``local_allreduce``, ``run_local``, ``LocalRun``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ._errors import InputError
from ._protocol import allreduce
from ._stats import WorkerStats
from .transport import InProcessSwitch

__all__ = ["LocalRun", "run_local", "local_allreduce"]


@dataclass
class LocalRun:
    """Results and statistics of one in-process allreduce, indexed by worker."""

    results: list[torch.Tensor]
    stats: list[WorkerStats]


def run_local(tensors: Sequence[torch.Tensor], scheme: str = "auto", timeout: float = 120.0, **options: Any) -> LocalRun:
    """Like :func:`local_allreduce`, also returning each worker's :class:`WorkerStats`."""
    world = len(tensors)
    if world == 0:
        raise InputError("need at least one tensor (one per worker)")
    shapes = {tuple(t.shape) for t in tensors}
    dtypes = {t.dtype for t in tensors}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise InputError(f"all workers need equal shape and dtype, got shapes {shapes} and dtypes {dtypes}")
    switch = InProcessSwitch(world, timeout=timeout)
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
