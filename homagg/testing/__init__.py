"""The public test harness: inputs, jobs and oracles shared by homagg's tests, its demo and yours.

Running a job:

* ``local_allreduce(tensors, scheme="auto", **options)`` is a stable contract: worker ``r`` holds
  ``tensors[r]``; every worker runs the real worker-side protocol against an
  :class:`~homagg.transport.InProcessSwitch` (module ``homagg.testing._local``); the returned list holds each worker's result (identical,
  same shape/dtype as the inputs).  :func:`run_local` also returns each worker's ``WorkerStats``.
* ``run_on_switch(switch, world, ...)``: a job on a real switch (emulator or BMv2) with ``world``
  worker processes over UDP, every scheme, verified; the parts: :func:`udp_worker`,
  :func:`run_udp_job`, :func:`verify_udp_results` (module ``homagg.testing._udp``).
* ``UdpTree(plan, ...)`` / ``run_tree_udp(tree, tensors, schemes)``: an aggregation tree of emulator
  processes (one per switch, the job admitted in each role) and the codec through it, one thread per
  rank (module ``homagg.testing._udp_tree``).

Making inputs (pure functions of their arguments, module ``homagg.testing._tensors``):
:func:`sparse_tensor` / :func:`sparse_tensors` (density, a part shared by every worker, value
spread, integer grid) and :func:`gradients` (a realistic per-worker gradient set).

Oracles (module ``homagg.testing._oracle``): :func:`exact_sum` (float64 / int64, unrounded),
:func:`block_max`, :func:`error_bound` (README's documented bound, per element),
:func:`within_bound` (bool) and :func:`check_within_bound` (raises :class:`BoundExceededError`),
:func:`digest` (bit identity).  Every failed check raises a :class:`HarnessError`, a
:class:`homagg.HomAggError`, never a bare ``AssertionError``.
"""

from __future__ import annotations

from . import _oracle
from ._local import LocalRun, check_combine, local_allreduce, on_threads, run_local
from ._oracle import (
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
from ._tensors import gradients, sparse_tensor, sparse_tensors
from ._tree import HOPS, HopFaults, TreeNetwork, local_tree_allreduce, run_tree_local
from ._udp_tree import UdpTree, run_tree_udp
from ._udp import (
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
    "on_threads",
    "check_combine",
    "run_on_switch",
    "run_udp_job",
    "udp_worker",
    "verify_udp_results",
    "UdpJobConfig",
    "SchemeVerdict",
    "SwitchAddresses",
    # trees of switches in-process (docs/trees.md)
    "local_tree_allreduce",
    "run_tree_local",
    "TreeNetwork",
    "HopFaults",
    "HOPS",
    # trees of emulator processes over UDP
    "UdpTree",
    "run_tree_udp",
    # inputs
    "sparse_tensor",
    "sparse_tensors",
    "gradients",
    # oracles (and their errors)
    *_oracle.__all__,
]
