"""The public test harness: inputs, jobs and oracles shared by homagg's tests, its demo and yours.

Running a job:

* ``local_allreduce(tensors, scheme="auto", **options)`` is a stable contract: worker ``r`` holds
  ``tensors[r]``; every worker runs the real worker-side protocol against an
  :class:`~homagg._switch.InProcessSwitch`; the returned list holds each worker's result (identical,
  same shape/dtype as the inputs).  :func:`run_local` also returns each worker's ``WorkerStats``.
* ``run_on_switch(switch, world, ...)``: a job on a real switch (emulator or BMv2) with ``world``
  worker processes over UDP, every scheme, verified; the parts: :func:`udp_worker`,
  :func:`run_udp_job`, :func:`verify_udp_results` (module ``homagg._testing_udp``).

Making inputs (pure functions of their arguments, module ``homagg._testing_tensors``):
:func:`sparse_tensor` / :func:`sparse_tensors` (density, a part shared by every worker, value
spread, integer grid) and :func:`gradients` (a realistic per-worker gradient set).

Oracles (module ``homagg._testing_oracle``): :func:`exact_sum` (float64 / int64, unrounded),
:func:`block_max`, :func:`error_bound` (README's documented bound, per element),
:func:`within_bound` (bool) and :func:`check_within_bound` (raises :class:`BoundExceededError`),
:func:`digest` (bit identity).  Every failed check raises a :class:`HarnessError`, a
:class:`homagg.HomAggError`, never a bare ``AssertionError``.
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
from ._testing_oracle import (
    BoundExceededError,
    HarnessError,
    ResultMismatchError,
    WorkerFailedError,
    block_max,
    check_within_bound,
    digest,
    error_bound,
    exact_sum,
    within_bound,
)
from ._testing_tensors import gradients, sparse_tensor, sparse_tensors
from ._testing_udp import (
    SchemeVerdict,
    SwitchAddresses,
    UdpJobConfig,
    run_on_switch,
    run_udp_job,
    udp_worker,
    verify_udp_results,
)

__all__ = [
    # running a job
    "local_allreduce",
    "run_local",
    "LocalRun",
    "run_on_switch",
    "run_udp_job",
    "udp_worker",
    "verify_udp_results",
    "UdpJobConfig",
    "SchemeVerdict",
    "SwitchAddresses",
    # inputs
    "sparse_tensor",
    "sparse_tensors",
    "gradients",
    # oracles
    "exact_sum",
    "block_max",
    "error_bound",
    "within_bound",
    "check_within_bound",
    "digest",
    "HarnessError",
    "BoundExceededError",
    "ResultMismatchError",
    "WorkerFailedError",
]


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
