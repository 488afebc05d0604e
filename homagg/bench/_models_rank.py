"""One rank of ``homagg bench models``: DDP training iterations of each model with one method.

A rank joins the default group of the method's backend (``gloo``, or ``homagg`` with scheme
``auto``; for ``homagg-topk`` also the group option ``compress``, :data:`COMPRESS`) plus a side
gloo group (barriers and the exactness reference), then for every model:

1. builds it with ``torch.manual_seed(0)``, checks over the side group that every rank built the
   same parameters (a digest) and wraps it in DDP (default 25 MB buckets) without DDP's initial
   broadcast (``init_sync=False``: the LSTM's 220 MB from rank 0 take ~50 s at 100 Mbit/s), with
   a *recording* comm hook around the method's hook (``allreduce_hook`` for gloo and homagg,
   ``fp16_compress_hook``, ``powerSGD_hook`` rank 1);
2. ``warmup`` iterations, all but the first (after which DDP rebuilds its buckets) recording every
   bucket's local gradient density (PowerSGD compresses
   from the third iteration on, so the timed ones are compressed);
3. ``iterations`` timed iterations (zero_grad, forward, backward + communication, the optimiser's
   step: the spec's :attr:`~homagg.bench._models_zoo.ModelSpec.optimizer`, SGD unless it says),
   counting the bytes of every ``dist.all_reduce`` payload (gloo methods) or the homagg group's
   ``stats.bytes_sent`` (homagg);
4. ``iterations`` compute-only iterations: the same work under ``ddp.no_sync()`` (no
   communication at all; all ranks start each one together after a barrier, so the CPU
   contention is that of training); the parameters and the optimiser's state (Adam's moments)
   are restored afterwards;
5. one check iteration: every bucket's input (already divided by W, as DDP's hook does) and
   output are kept; the float64 sum of all ranks' inputs comes from a gloo all_reduce of float64
   copies, and every output element must lie within homagg's documented bound
   ``W * 2**-22 * M`` (``M``: max |input| over the element's codec block and all ranks; for sparse
   buckets, over the whole tensor, a looser bound); every rank reports digests of the outputs and
   of its parameters, so the launcher checks that ranks agree bit for bit.

Batches are drawn from generators seeded by (seed, model, rank, iteration).  One JSON line
(after :data:`~homagg.bench._ranks.RECORD_MARK`) per model.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._allreduce_rank import _blocks, _seed, check_result
from .._errors import HomAggError
from ._models_zoo import ModelSpec, density, spec
from ._ranks import RECORD_MARK, die_with_launcher

__all__ = ["METHODS", "LOSSY", "COMPRESS", "rank_main", "Recorder"]

#: method -> (backend, sparse embeddings); a method's comm hook is chosen in :func:`_inner_hook`
METHODS: dict[str, tuple[str, bool]] = {"gloo": ("gloo", False), "homagg": ("homagg", False),
                                        "homagg-sparse": ("homagg", True), "homagg-topk": ("homagg", False),
                                        "powersgd": ("gloo", False), "fp16": ("gloo", False)}
#: homagg methods with gradient compression in front of the exact codec: the group's ``compress``
#: option (:mod:`homagg.compress`; DDP's buckets only; top-k keeps exactly 1% per bucket, error feedback on)
COMPRESS: dict[str, str] = {"homagg-topk": "topk:0.01"}
#: lossy by design: never ``exact`` (their check is only that ranks agree)
LOSSY = frozenset({"powersgd", "fp16", *COMPRESS})


class _Bytes:
    """Counts the payload bytes of every ``dist.all_reduce`` while installed (gloo methods)."""

    def __init__(self) -> None:
        self.total = 0
        self._orig = dist.all_reduce

        def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not tensor.is_sparse:
                self.total += tensor.numel() * tensor.element_size()
            return self._orig(tensor, *args, **kwargs)

        dist.all_reduce = counting  # type: ignore[assignment]

    def close(self) -> None:
        dist.all_reduce = self._orig  # type: ignore[assignment]


class Recorder:
    """Comm-hook state: the method's hook plus, while ``record``, each bucket's density and I/O."""

    def __init__(self, inner: Any, inner_state: Any) -> None:
        self.inner, self.inner_state = inner, inner_state
        self.record = False
        self.keep = False
        #: finish each bucket before DDP hands over the next (PowerSGD on gloo: see :func:`_inner_hook`)
        self.serial = False
        self.densities: dict[int, list[float]] = {}
        self.numels: dict[int, int] = {}
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        #: while ``timing``: per bucket, (issued, done) seconds after :attr:`step_start` (perf_counter)
        self.timing = False
        self.step_start = 0.0
        self.spans: dict[int, list[tuple[float, float]]] = {}

    def note(self, index: int, buffer: torch.Tensor) -> None:
        self.densities.setdefault(index, []).append(density(buffer))
        self.numels[index] = buffer.numel()


def _hook(state: Recorder, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    index = bucket.index()
    if state.record:
        state.note(index, bucket.buffer())
    if not state.keep:
        issued = time.perf_counter()
        fut = state.inner(state.inner_state, bucket)
        if state.serial:
            fut.wait()  # bounded by the group's timeout
        if not state.timing:
            return fut

        def span(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            out = f.value()
            state.spans.setdefault(index, []).append((issued - state.step_start,
                                                      time.perf_counter() - state.step_start))
            return out

        return fut.then(span)
    # the hooks divide by W in place before reducing: keep the divided input, as the codec saw it
    world = dist.get_world_size()
    before = bucket.buffer().clone() / world
    fut = state.inner(state.inner_state, bucket)
    if state.serial:
        fut.wait()

    def keep(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        out = f.value()
        state.kept[index] = (before, out.clone())
        return out

    return fut.then(keep)


# DDP checks the hook's annotations at run time (classes, not the strings this module's
# ``from __future__ import annotations`` makes of them)
_hook.__annotations__ = {"state": Recorder, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def _inner_hook(method: str, group: Any) -> tuple[Any, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if method == "fp16":
        return default_hooks.fp16_compress_hook, group
    if method == "powersgd":
        # torch's PowerSGD hook starts collectives from inside future callbacks; with gloo, two
        # buckets in flight then issue them in different orders on different ranks and hang
        # (seen on torch 2.13): the caller sets Recorder.serial, one bucket at a time
        state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                            start_powerSGD_iter=2, min_compression_rate=2)
        return powerSGD_hook.powerSGD_hook, state
    return default_hooks.allreduce_hook, group


def _comm_counters(pg: Any) -> dict[str, int]:
    """homagg groups: the codec's counters (``scheme:<name>`` per tensor, rounds, redos...) and the
    switch port's (packets, retransmits...); empty for gloo.  Differences give one phase's."""
    stats = getattr(pg, "stats", None)
    if stats is None:
        return {}
    out = {"calls": stats.calls, "rounds": stats.rounds, "segments": stats.segments, "redos": stats.redos,
           "redone": stats.redone, "repaired": stats.repaired}
    out.update({f"scheme:{k}": v for k, v in stats.schemes.items()})
    out.update({f"bytes:{k}": v for k, v in stats.bytes_per_stream.items()})
    # calls per path (switch / host after a switch failure) and the path changes
    out.update({f"path:{k}": v for k, v in stats.paths.items()})
    out["path_transitions"] = sum(1 for t in stats.transitions if t["from"] != t["to"])
    port = getattr(getattr(pg, "switch", None), "port", None)
    out.update({f"port:{k}": v for k, v in getattr(port, "stats", {}).items()
                if k in ("packets", "retransmits", "fast_retransmits", "spurious_retransmits", "results", "ignored")})
    return out


def _same_start(model: nn.Module, side: Any) -> None:
    """Raise unless every rank's (seeded) parameters equal rank 0's: digests compared over ``side``."""
    mine = int.from_bytes(bytes.fromhex(_digest(list(model.parameters())))[:7], "little")
    both = torch.tensor([mine, -mine], dtype=torch.int64)
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=side)  # max and -min of the digests
    if int(both[0]) != mine or -int(both[1]) != mine:
        raise HomAggError("bench models: ranks built different initial parameters (seeded build not deterministic)")


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        t = t.detach()
        h.update((t.to_dense() if t.is_sparse else t).contiguous().numpy().tobytes())
    return h.hexdigest()


def _check(rec: Recorder, side: Any, world: int, block: int) -> dict[str, Any]:
    """Compare every kept bucket output with the float64 sum of all ranks' inputs (side gloo group)."""
    ok, worst_rel, worst_abs = True, 0.0, 0.0
    for index in sorted(rec.kept):
        before, out = rec.kept[index]
        sparse = before.is_sparse
        x = (before.to_dense() if sparse else before).flatten()
        y = (out.to_dense() if out.is_sparse else out).flatten()
        exact = x.double()
        dist.all_reduce(exact, group=side)
        blk = x.numel() if sparse else block
        bmax = _blocks(x.abs(), max(blk, 1)).amax(dim=1).double()
        dist.all_reduce(bmax, op=dist.ReduceOp.MAX, group=side)
        good, err = check_result(y, exact, world * 2.0**-22 * bmax, max(blk, 1))
        ok = ok and good
        worst_abs = max(worst_abs, err)
        scale = float(exact.abs().max()) if exact.numel() else 0.0
        worst_rel = max(worst_rel, err / scale if scale else 0.0)
    return {"within_bound": ok, "max_abs_err": worst_abs, "max_rel_err": worst_rel,
            "bucket_digest": _digest([rec.kept[i][1] for i in sorted(rec.kept)])}


def _iteration(ddp: nn.Module, model_spec: ModelSpec, opt: torch.optim.Optimizer, gen_seed: int,
               batch: int, rec: Recorder) -> float:
    data = model_spec.batch(torch.Generator().manual_seed(gen_seed), batch)
    t0 = rec.step_start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    model_spec.loss(ddp, data).backward()
    opt.step()
    return time.perf_counter() - t0


def run_model(name: str, method: str, args: argparse.Namespace, pg: Any, side: Any, block: int) -> dict[str, Any]:
    """Warm-up, timed, compute-only and check iterations of one model; rank's report."""
    from torch.nn.parallel import DistributedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    model_spec = spec(name, args.quick)
    batch = args.batch or model_spec.batch_size
    torch.manual_seed(0)
    model = model_spec.build(METHODS[method][1])
    _same_start(model, side)
    ddp = DistributedDataParallel(model, init_sync=False)  # the models have no buffers
    rec = Recorder(*_inner_hook(method, None))
    rec.serial = method == "powersgd"
    ddp.register_comm_hook(rec, _hook)
    opt = model_spec.optimizer(ddp.parameters())
    seeds = iter(range(10**6))

    def step() -> float:
        return _iteration(ddp, model_spec, opt, _seed(args.seed, name, rank, next(seeds)), batch, rec)

    for i in range(args.warmup):
        rec.record = i > 0  # DDP rebuilds its buckets after the first iteration: record the final ones
        step()
    rec.record = False
    print(f"{name}: warm-up done", flush=True)
    counter = _Bytes()
    stats = getattr(pg, "stats", None)
    sent0 = int(stats.bytes_sent) if stats is not None else 0
    before = _comm_counters(pg)
    dist.barrier(group=side)
    rec.timing = True
    try:
        times = [step() for _ in range(args.iterations)]
    finally:
        counter.close()
        rec.timing = False
    sent = (int(stats.bytes_sent) - sent0) if stats is not None else None
    comm = {k: v - before.get(k, 0) for k, v in _comm_counters(pg).items()}
    print(f"{name}: timed iterations done", flush=True)
    saved = [p.detach().clone() for p in model.parameters()]
    saved_opt = copy.deepcopy(opt.state_dict())  # local steps would leave each rank's moments different
    compute = []
    for _ in range(args.iterations):
        dist.barrier(group=side)
        with ddp.no_sync():
            compute.append(step())
    with torch.no_grad():
        for p, s in zip(model.parameters(), saved):
            p.copy_(s)
    opt.load_state_dict(saved_opt)
    del saved, saved_opt
    opt.zero_grad(set_to_none=True)
    rec.record = rec.keep = True
    step()
    rec.record = rec.keep = False
    check = _check(rec, side, world, block)
    rec.kept.clear()
    ring = 2 * (world - 1) / world
    report = {
        "model": name, "method": method, "summary": model_spec.summary, "batch": batch,
        "params": sum(p.numel() for p in model.parameters()), "times": times, "compute_times": compute,
        "bytes_per_iteration": sent / args.iterations if sent is not None else ring * counter.total / args.iterations,
        "bucket_numel": [rec.numels[i] for i in sorted(rec.numels)],
        "bucket_density": [statistics.fmean(rec.densities[i]) for i in sorted(rec.densities)],
        "param_digest": _digest(list(model.parameters())), "load_avg": list(os.getloadavg()), **check,
        # per bucket, medians over the timed iterations: hook called / result ready (s after the step began)
        "bucket_issued_s": [statistics.median(a for a, _ in rec.spans[i]) for i in sorted(rec.spans)],
        "bucket_done_s": [statistics.median(b for _, b in rec.spans[i]) for i in sorted(rec.spans)],
        "comm_counters": comm,
    }
    del ddp, model, opt
    return report


def rank_main(args: argparse.Namespace) -> int:
    """Entry point of a rank (hidden ``--_worker``): one JSON line per model on stdout."""
    die_with_launcher()
    import homagg
    import homagg.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    method = args._method
    backend = METHODS[method][0]
    options: dict[str, Any] | None = None
    if backend == "homagg":
        options = {"scheme": args._scheme, **({"compress": COMPRESS[method]} if method in COMPRESS else {}),
                   **({"codec": json.loads(args._codec)} if args._codec != "{}" else {})}
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout), pg_options=options)
    try:
        pg = dist.distributed_c10d._get_default_group()
        side = dist.new_group(backend="gloo")
        codec = getattr(pg, "_codec", None)
        block = int(getattr(codec, "block_size", 0) or homagg.CodecConfig().block_size)
        for name in args._models:
            line = run_model(name, method, args, pg, side, block)
            print(f"\n{RECORD_MARK}{json.dumps(line)}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0
