"""What one rank of ``homagg bench allreduce`` does (started by :mod:`homagg.bench._allreduce`).

A rank joins the default group of one backend (``gloo``, or ``homagg`` with one scheme through
``pg_options``) and, for every (numel, density) it is given, times one warm-up and ``repeats``
calls of ``dist.all_reduce`` and prints one JSON line per configuration.  Each call runs between
two barriers: no rank checks or digests a result while another is still in the call.
Backend ``gloo-sparse`` is gloo's all_reduce of the same data as a torch sparse COO tensor (what
torch offers for sparse gradients: gloo all-gathers every rank's indices and values and sums
locally); the input is converted to COO before the clock starts, as an ``nn.Embedding(sparse=True)``
gradient already is COO, and the (coalesced) result is densified after it stops for the check.

Inputs are generated deterministically from seeds (:func:`make_tensor`): ``density * numel``
standard-normal nonzeros, half at positions shared by all ranks, the rest rank-specific; density 1
is a fully dense ``randn``.  So rank 0 regenerates every rank's tensor and checks each result
against the float64 sum with the documented bound (``homagg/codec/_fixedpoint.py``): per element
``|result - exact| <= W * 2**-22 * M``, ``M`` = max|x| over the element's block and all ranks.
Every rank reports a digest of every result, so the launcher can check that all ranks got rank 0's
result bit for bit without shipping tensors.

CPU per timed call: every rank its own user and system seconds (``getrusage``, every thread);
rank 0 also the switch emulator's (:func:`switch_pid`: ``/proc/<pid>/stat``, every thread, read
before the call's first barrier and after its second, when the emulator has nothing else to do:
homagg's barriers run on gloo), ``None`` where the emulator's process is not known or not its own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ._cpu import SWITCH_PID_ENV, process_cpu
from ._ranks import RECORD_MARK, die_with_launcher
from ._report import RETX_KEYS

__all__ = ["make_tensor", "oracle", "check_result", "rank_main", "sparse_allgather_bytes", "switch_pid"]


def _seed(*parts: object) -> int:
    """A 63-bit seed from a tuple of values (stable across processes and runs)."""
    digest = hashlib.sha256("/".join(map(repr, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _distinct(numel: int, k: int, gen: torch.Generator, taken: torch.Tensor | None = None) -> torch.Tensor:
    """``k`` distinct positions in ``[0, numel)`` not marked in ``taken`` (deterministic in ``gen``)."""
    found = torch.empty(0, dtype=torch.int64)
    while found.numel() < k:
        want = k - found.numel()
        cand = torch.randint(0, numel, (want + want // 4 + 64,), generator=gen)
        if taken is not None:
            cand = cand[~taken[cand]]
        found = torch.unique(torch.cat([found, cand]))
    return found[torch.randperm(found.numel(), generator=gen)[:k]]


def make_tensor(numel: int, density: float, rank: int, seed: int) -> torch.Tensor:
    """Rank ``rank``'s fp32 input: ``round(density * numel)`` nonzeros, half of them shared."""
    gen = torch.Generator().manual_seed(_seed(seed, numel, density, "rank", rank))
    if density >= 1.0:
        return torch.randn(numel, generator=gen)
    k = min(numel, round(density * numel))
    k_shared = k // 2
    shared = _distinct(numel, k_shared, torch.Generator().manual_seed(_seed(seed, numel, density, "shared")))
    taken = torch.zeros(numel, dtype=torch.bool)
    taken[shared] = True
    own = _distinct(numel, k - k_shared, gen, taken)
    x = torch.zeros(numel)
    x[shared] = torch.randn(k_shared, generator=gen)
    x[own] = torch.randn(k - k_shared, generator=gen)
    return x


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` zero-padded to whole blocks, as a (blocks, block) view."""
    pad = -x.numel() % block
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.view(-1, block)


def oracle(numel: int, density: float, world: int, seed: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64 exact sum of all ranks' inputs, per-block error bound ``W * 2**-22 * M``)."""
    exact = torch.zeros(numel, dtype=torch.float64)
    block_max = torch.zeros(-(-numel // block), dtype=torch.float64)
    for r in range(world):
        x = make_tensor(numel, density, r, seed)
        exact.add_(x)
        block_max = torch.maximum(block_max, _blocks(x.abs(), block).amax(dim=1).double())
    return exact, world * 2.0**-22 * block_max


def check_result(result: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor, block: int) -> tuple[bool, float]:
    """(every element within its block's bound, max |result - exact|)."""
    err = (result.double() - exact).abs()
    ok = bool((_blocks(err, block) <= bound.unsqueeze(1)).all())
    return ok, float(err.max()) if err.numel() else 0.0


#: (rounds, bytes sent, the port's :data:`RETX_KEYS` counters or None, pipelined segments)
Counters = tuple[int, int, dict[str, int] | None, int]


def _counters(pg: Any) -> Counters | None:
    """(rounds, bytes sent, the port's :data:`RETX_KEYS` counters or None, pipelined segments) of a
    homagg group so far; None for other backends."""
    stats = getattr(pg, "stats", None)
    if stats is None:
        return None
    port_stats = getattr(pg.switch.port, "stats", None)
    retrans = {k: int(port_stats.get(k, 0)) for k in RETX_KEYS} if isinstance(port_stats, dict) else None
    return int(stats.rounds), int(stats.bytes_sent), retrans, int(stats.segments)


def _increase(before: Counters, after: Counters) -> Counters:
    """How much each counter grew from ``before`` to ``after``."""
    retx = None if before[2] is None or after[2] is None else {k: after[2][k] - before[2][k] for k in RETX_KEYS}
    return after[0] - before[0], after[1] - before[1], retx, after[3] - before[3]


def _total(moved: list[Counters]) -> Counters:
    """The sum of counter increases (None retransmission counters where any is None)."""
    retx = None if any(m[2] is None for m in moved) else {k: sum(m[2][k] for m in moved) for k in RETX_KEYS}  # type: ignore[index]
    return sum(m[0] for m in moved), sum(m[1] for m in moved), retx, sum(m[3] for m in moved)


def switch_pid(pg: Any) -> int | None:
    """The pid of the switch emulator process a homagg group aggregates through, where the
    benchmark started it: :data:`~homagg.bench._cpu.SWITCH_PID_ENV` (``bench net``: the emulator
    on the switch host), else the embedded emulator this process's group started (group rank 0,
    ``bench allreduce`` on loopback).  ``None`` for other backends, an external switch, or an
    emulator running in this process (its CPU then is this rank's: not separable)."""
    if getattr(pg, "stats", None) is None:
        return None
    if os.environ.get(SWITCH_PID_ENV, "").isdigit():
        return int(os.environ[SWITCH_PID_ENV])
    emulator = getattr(getattr(pg, "switch", None), "emulator", None)
    pid = getattr(getattr(emulator, "process", None), "pid", None)
    return pid if isinstance(pid, int) else None


def sparse_allgather_bytes(nnz: int, world: int, ndim: int = 1, elem_size: int = 4) -> int:
    """Bytes a rank sends in gloo's sparse all_reduce: a ring all-gather forwards the other
    ``world - 1`` ranks' (int64 indices, values) once each (``nnz`` per rank; sizes metadata
    not counted)."""
    return (world - 1) * nnz * (8 * ndim + elem_size)


def _reduce(buf: torch.Tensor) -> torch.Tensor:
    """``dist.all_reduce(buf)``'s result: ``buf`` itself, or for a sparse COO input the new
    (coalesced) tensor gloo hands back through the work object."""
    import torch.distributed as dist

    if buf.layout == torch.strided:
        dist.all_reduce(buf)
        return buf
    work = dist.all_reduce(buf, async_op=True)
    work.wait()
    return work.result()[0]


def _one_config(pg: Any, numel: int, density: float, repeats: int, seed: int, block: int,
                sparse: bool = False, *, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
                counters: Callable[[], Counters | None] | None = None, switch_pids: list[int] | None = None,
                traffic: Callable[[], dict[str, int]] | None = None) -> dict[str, Any]:
    """One configuration's warm-up and timed calls (the record line of this rank).

    By default a call is ``dist.all_reduce`` through ``pg``, its counters the homagg group's and the
    switch's CPU :func:`switch_pid`'s; ``bench net --racks`` passes its own ``reduce`` (ports at the
    switches of a tree or a star), ``counters``, ``switch_pids`` (every emulator of the arrangement:
    their CPU summed) and ``traffic`` (byte counters read by rank 0 just before the first timed call
    and after the last: their increase per call is the line's ``traffic``)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    load = os.getloadavg()
    x = make_tensor(numel, density, rank, seed)
    if sparse:
        x = x.to_sparse()
    exact, bound = oracle(numel, density, world, seed, block) if rank == 0 else (None, None)
    times: list[float] = []
    cpu: list[float] = []  # this process's user + system CPU seconds in each timed call (every thread)
    cpu_user: list[float] = []  # of them, user
    cpu_sys: list[float] = []  # and system (kernel)
    faults: list[int] = []  # its minor page faults in each timed call
    if switch_pids is None:
        pid = switch_pid(pg)
        switch_pids = [] if pid is None else [pid]
    switches = switch_pids if rank == 0 and switch_pids else None
    switch_cpu: list[float] | None = [] if switches is not None else None  # the emulators' CPU seconds per call
    digests: list[str] = []
    ok, max_err = True, 0.0
    read_counters = counters if counters is not None else lambda: _counters(pg)
    call_once = reduce if reduce is not None else _reduce
    moved_counters: list[Counters] = []  # each timed call's own (not the barriers' around it: switch rounds)
    bytes_before: dict[str, int] = {}
    for call in range(1 + repeats):
        buf = x.clone()
        sw0 = _cpu_of(switches) if switches is not None else None
        if call == 1 and traffic is not None and rank == 0:
            bytes_before = traffic()
        dist.barrier()
        c0 = read_counters() if call else None  # stats of the timed calls only (the warm-up is call 0)
        use0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        buf = call_once(buf)
        elapsed = time.perf_counter() - t0
        use1 = resource.getrusage(resource.RUSAGE_SELF)
        c1 = read_counters() if call else None
        if c0 is not None and c1 is not None:
            moved_counters.append(_increase(c0, c1))
        # Every rank has finished the timed call before any rank checks or digests its result: on a
        # shared host a fast rank's checking would otherwise steal CPU from a rank still in the call.
        dist.barrier()
        sw1 = _cpu_of(switches) if switches is not None else None
        if call:
            times.append(elapsed)
            user, system = use1.ru_utime - use0.ru_utime, use1.ru_stime - use0.ru_stime
            cpu.append(user + system)
            cpu_user.append(user)
            cpu_sys.append(system)
            faults.append(use1.ru_minflt - use0.ru_minflt)
            if switch_cpu is not None:
                if sw0 is None or sw1 is None:  # the emulator went away: no figure
                    switch_cpu = None
                else:
                    switch_cpu.append(sw1 - sw0)
        if sparse:
            buf = buf.to_dense()
        digests.append(hashlib.blake2b(buf.numpy()).hexdigest())
        if exact is not None and bound is not None:
            call_ok, call_err = check_result(buf, exact, bound, block)
            ok, max_err = ok and call_ok, max(max_err, call_err)
        del buf
        # progress: every stdout line resets the launcher's stall timer (a slow configuration is no hang)
        print(f"call {call} of {repeats} done ({numel} elements, density {density})", flush=True)
    moved = {k: (v - bytes_before[k]) / max(1, repeats) for k, v in traffic().items()} \
        if traffic is not None and rank == 0 else None
    total = _total(moved_counters) if len(moved_counters) == repeats else None
    out: dict[str, Any] = {"numel": numel, "density": density, "times": times, "cpu": cpu, "cpu_user": cpu_user,
                           "cpu_sys": cpu_sys, "faults": faults, "switch_cpu": switch_cpu,
                           "digests": digests, "traffic": moved,
                           "load_avg": list(load), "rounds": None, "bytes": None, "segments": None,
                           **dict.fromkeys(RETX_KEYS)}
    if sparse:
        out["bytes"] = repeats * sparse_allgather_bytes(int(x._nnz()), world)
    if total is not None:
        out.update(rounds=total[0], bytes=total[1], segments=total[3],
                   **{k: None if total[2] is None else total[2][k] for k in RETX_KEYS})
    stats = getattr(pg, "stats", None)
    if stats is not None:  # the group's calls per path so far (switch / host after a switch failure)
        out.update(paths=dict(stats.paths), path_transitions=sum(1 for t in stats.transitions if t["from"] != t["to"]))
    if rank == 0:
        out.update(within_bound=ok, max_abs_err=max_err)
    return out


def _cpu_of(pids: list[int]) -> float | None:
    """User + system CPU seconds so far of every process in ``pids``; None if one cannot be read."""
    total = 0.0
    for pid in pids:
        cpu = process_cpu(pid)
        if cpu is None:
            return None
        total += sum(cpu)
    return total


def rank_main(args: argparse.Namespace) -> int:
    """Entry point of a rank (hidden ``--_worker``): one JSON line per configuration on stdout."""
    die_with_launcher()
    import torch.distributed as dist

    import homagg
    import homagg.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    backend = args._backend
    options = {"scheme": args._scheme, "codec": json.loads(args._codec)} if backend == "homagg" else None
    sparse = backend == "gloo-sparse"
    dist.init_process_group("gloo" if sparse else backend, timeout=timedelta(seconds=args.timeout),
                            pg_options=options)
    try:
        pg = dist.distributed_c10d._get_default_group()
        block = homagg.CodecConfig().block_size
        for numel in args._numels:
            for density in args._densities:
                line = _one_config(pg, numel, density, args.repeats, args.seed, block, sparse=sparse)
                print(f"\n{RECORD_MARK}{json.dumps(line)}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0
