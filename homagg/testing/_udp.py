"""Jobs through a real switch (part of :mod:`homagg.testing`): W worker processes over UDP, checked.

A job is described by a :class:`UdpJobConfig` (a plain, picklable dict).  :func:`udp_worker` is
one worker process: it builds its :func:`~homagg.testing.gradients`, runs ``homagg.allreduce``
over a :class:`~homagg.transport.UdpSwitchPort` for every scheme and reports timings, bytes and a
:func:`~homagg.testing.digest` of its results.  :func:`run_udp_job` starts the processes;
:func:`verify_udp_results` checks what they report against oracles rebuilt in the caller's process;
:func:`run_on_switch` does all of it (admit, run, remove, verify) and raises on any problem.

Invariants checked by :func:`verify_udp_results`, per scheme: every worker's digest is equal;
rank 0's results are within :func:`~homagg.testing.error_bound` of the exact sum (integers equal);
every scheme is bit-identical to the first one; with ``reference=True`` also bit-identical to
:func:`~homagg.testing.local_allreduce` (in-process switch) of the same inputs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, Protocol, TypedDict

import torch

from ._oracle import ResultMismatchError, WorkerFailedError, digest, within_bound
from ._tensors import gradients

__all__ = ["UdpJobConfig", "SchemeVerdict", "SwitchAddresses", "udp_worker", "run_udp_job",
           "verify_udp_results", "run_on_switch"]

ALL_SCHEMES = ("auto", "sketch", "compact", "dense")


class UdpJobConfig(TypedDict):
    """What every worker process of a job needs (JSON-compatible; addresses as ``[host, port]``)."""

    numel: int  #: elements per worker (all of :func:`gradients` together)
    density: float
    seed: int
    data: list[Any]  #: the switch's data address
    control: list[Any]  #: the switch's control address
    job: dict[str, Any]  #: ``JobSpec.to_dict()`` of the admitted job
    timeout: float  #: seconds without progress before a worker raises ``SwitchTimeoutError``
    schemes: list[str]
    return_all: NotRequired[bool]  #: every rank returns its results (default: rank 0 only)
    secret: NotRequired[str]  #: the switch's control secret (workers register with it)


class SwitchAddresses(Protocol):
    """A running switch (e.g. ``switch_emulator.RunningSwitch``): where its data and control ports are."""

    data_addr: tuple[str, int]
    control_addr: tuple[str, int]
    #: (optional attribute) the control secret, passed to the worker processes


def udp_worker(rank: int, cfg: UdpJobConfig, barrier: Any = None, progress: Any = None) -> dict[str, Any]:
    """One worker process: allreduce each of its :func:`gradients` with every scheme of ``cfg``.

    Returns ``{scheme: {"time", "bytes", "digest", "schemes", "results"}, "port_stats": {...}}``;
    ``results`` (numpy arrays) only on rank 0 unless ``cfg["return_all"]``.  ``barrier`` (shared by
    the ranks) starts every scheme together; ``progress`` (a queue) receives ``(rank, scheme)``.
    """
    from ..codec import WorkerStats, allreduce
    from ..jobs import JobSpec
    from ..transport import UdpSwitchPort

    torch.set_num_threads(1)
    tensors = gradients(rank, cfg["numel"], cfg["density"], cfg["seed"])
    port = UdpSwitchPort(tuple(cfg["data"]), job=JobSpec.from_dict(cfg["job"]), rank=rank,
                         control=tuple(cfg["control"]), timeout=cfg["timeout"], secret=cfg.get("secret"))
    out: dict[str, Any] = {}
    try:
        for scheme in cfg["schemes"]:
            if barrier is not None:
                barrier.wait(cfg["timeout"])
            st = WorkerStats()
            t0 = time.perf_counter()
            res = [allreduce(t, port, scheme=scheme, stats=st) for t in tensors]
            dt = time.perf_counter() - t0
            out[scheme] = {"time": dt, "bytes": st.bytes_sent, "digest": digest(res), "schemes": dict(st.schemes),
                           "results": [r.numpy() for r in res] if rank == 0 or cfg.get("return_all") else None}
            if progress is not None:
                progress.put((rank, scheme))
        out["port_stats"] = dict(port.stats)
    finally:
        port.close()
    return out


def run_udp_job(cfg: UdpJobConfig, world: int, on_progress: Callable[[int, str], None] | None = None,
                timeout: float = 600.0) -> list[Any]:
    """Run :func:`udp_worker` on ``world`` processes; per rank its result or a ``RankFailure``.

    Progress events go to ``on_progress(rank, scheme)`` (called in a thread of this process).
    """
    from ..transport._procs import Workers, context

    ctx = context()
    barrier = ctx.Barrier(world)
    progress = ctx.Queue()
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            try:
                ev = progress.get(timeout=0.1)
            except Exception:  # noqa: BLE001 - queue.Empty
                continue
            if on_progress is not None:
                on_progress(*ev)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        return Workers(udp_worker, world, cfg, barrier, progress).join(timeout)
    finally:
        time.sleep(0.15)
        stop.set()
        t.join(1)


@dataclass
class SchemeVerdict:
    """What :func:`verify_udp_results` found for one scheme (``ok`` iff nothing is in ``problems``)."""

    scheme: str
    time: float  #: slowest worker's seconds
    bytes: int  #: most bytes one worker sent
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_udp_results(results: Sequence[Any], cfg: UdpJobConfig, world: int,
                       reference: bool = False) -> list[SchemeVerdict]:
    """Check the workers' reports of a job against oracles rebuilt here (see the module invariants).

    Raises :class:`WorkerFailedError` if any rank failed; otherwise returns one verdict per scheme.
    """
    from ._local import local_allreduce

    failed = [r for r in results if not isinstance(r, dict)]
    if failed:
        raise WorkerFailedError(failed)
    inputs = [gradients(r, cfg["numel"], cfg["density"], cfg["seed"]) for r in range(world)]
    columns = [[inp[i] for inp in inputs] for i in range(len(inputs[0]))]
    ref = [local_allreduce(col, scheme="dense")[0] for col in columns] if reference else None
    verdicts, first = [], None
    for scheme in cfg["schemes"]:
        per = [r[scheme] for r in results]
        v = SchemeVerdict(scheme, max(p["time"] for p in per), max(p["bytes"] for p in per))
        if len({p["digest"] for p in per}) != 1:
            v.problems.append("workers disagree")
        got = [torch.from_numpy(a) for a in per[0]["results"]]
        if digest(got) != per[0]["digest"]:
            v.problems.append("rank 0's results do not match its digest")
        bad = [i for i, (g, col) in enumerate(zip(got, columns)) if not within_bound(g, col)]
        if bad:
            v.problems.append(f"tensors {bad} outside the bound of the exact sum")
        if ref is not None and digest(got) != digest(ref):
            v.problems.append("differs from the in-process reference (local_allreduce)")
        first = first or per[0]["digest"]
        if per[0]["digest"] != first:
            v.problems.append(f"differs from scheme {cfg['schemes'][0]}")
        verdicts.append(v)
    return verdicts


def run_on_switch(switch: SwitchAddresses, world: int, *, numel: int = 20000, density: float = 0.02, k: int = 64,
                  slots: int = 16, schemes: Sequence[str] = ALL_SCHEMES, seed: int = 0,
                  timeout: float = 30.0) -> list[dict[str, Any]]:
    """Admit a job on ``switch``, run every scheme on ``world`` processes, remove the job, verify.

    Raises :class:`WorkerFailedError` or :class:`ResultMismatchError` (naming each scheme's problems);
    returns the workers' reports (see :func:`udp_worker`).
    """
    from ..transport import ControlClient

    with ControlClient(switch.control_addr) as ctl:
        job = ctl.admit(world, n_slots=slots, words_per_packet=k)
        cfg = UdpJobConfig(numel=numel, density=density, seed=seed, data=list(switch.data_addr),
                           control=list(switch.control_addr), job=job.to_dict(), timeout=timeout,
                           schemes=list(schemes))
        if getattr(switch, "secret", None):
            cfg["secret"] = switch.secret  # type: ignore[attr-defined]
        try:
            results = run_udp_job(cfg, world, timeout=timeout * 4 * len(schemes))
        finally:
            ctl.remove(job.job_id)
    bad = [v for v in verify_udp_results(results, cfg, world, reference=True) if not v.ok]
    if bad:
        raise ResultMismatchError("; ".join(f"{v.scheme}: {', '.join(v.problems)}" for v in bad))
    return results
