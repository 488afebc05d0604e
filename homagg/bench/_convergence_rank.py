"""One rank of ``homagg bench compress``: DDP training of a student MLP on a teacher's labels.

Task (identical on every rank and run, a pure function of ``--seed``): inputs ``x ~ N(0, I_32)``,
labels ``argmax(teacher(x))`` of a fixed random 2-layer teacher; each rank draws its own batches
from a shared training pool; rank 0 evaluates the cross-entropy on a fixed held-out set every
``--eval-every`` steps.  SGD with momentum (DGC: momentum 0, it keeps its own) and a cosine
learning-rate decay to 0, so the final loss is where training converged rather than step noise.  Methods: ``gloo`` (plain DDP), ``homagg`` (exact, comm hook),
``hom:<spec>`` (homagg hook with compression), ``own:<spec>`` (own-scale quantiser over gloo),
``powersgd`` (torch's hook over gloo).  Prints progress lines ``@step N`` and one record line.
"""

# No ``from __future__ import annotations``: DDP checks a comm hook's annotations at run time.
import argparse
import json
import math
import statistics
import time
from typing import Any

from ._ranks import RECORD_MARK, die_with_launcher

__all__ = ["rank_main", "make_task"]

DIM, HIDDEN, CLASSES = 32, 512, 10


def make_task(seed: int, pool: int, held_out: int) -> tuple[Any, Any, Any, Any]:
    """(train x, train y, eval x, eval y) labelled by a fixed random teacher network."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    teacher = [torch.randn(DIM, 64, generator=gen), torch.randn(64, CLASSES, generator=gen)]
    x = torch.randn(pool + held_out, DIM, generator=gen)
    y = (torch.tanh(x @ teacher[0]) @ teacher[1]).argmax(dim=1)
    return x[:pool], y[:pool], x[pool:], y[pool:]


def _hook(method: str, ddp: Any, world: int, counters: dict[str, int]) -> Any:
    """Register the method's comm hook; return the object whose state counts bytes (if any)."""
    import torch
    import torch.distributed as dist

    def counting_allreduce(_state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buf = bucket.buffer()
        counters["bytes"] += int(buf.numel() * buf.element_size() * 2 * (world - 1) / world)  # ring all-reduce
        return dist.all_reduce(buf.div_(world), async_op=True).get_future().then(lambda f: f.value()[0])

    if method == "gloo":
        ddp.register_comm_hook(None, counting_allreduce)
        return None
    if method == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        original = dist.all_reduce

        def counted(tensor: Any, *a: Any, **k: Any) -> Any:  # PowerSGD's P/Q matrices and 1-D tensors
            counters["bytes"] += int(tensor.numel() * tensor.element_size() * 2 * (world - 1) / world)
            return original(tensor, *a, **k)

        ps.dist.all_reduce = counted  # type: ignore[attr-defined]
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                 min_compression_rate=1.5, random_seed=0)
        ddp.register_comm_hook(state, ps.powerSGD_hook)
        return None
    if method.startswith("own:"):
        from ..compress.baselines import OwnScaleState, own_scale_hook

        state = OwnScaleState(method[4:])
        ddp.register_comm_hook(state, own_scale_hook)
        return state
    import homagg.torch.hooks as hh

    spec = None if method == "homagg" else method.partition(":")[2]
    state = hh.State(compress=spec) if spec else hh.State()
    ddp.register_comm_hook(state, hh.allreduce_hook)
    return state


def rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    die_with_launcher()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    xs, ys, ex, ey = make_task(args.seed, args.pool, args.held_out)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES))
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    counters = {"bytes": 0}
    state = _hook(args.method, ddp, world, counters)
    dgc = args.method.startswith("hom:dgc")
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.0 if dgc else args.momentum)
    # cosine decay to 0: the final loss measures where training converged, not the last step's noise
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    curve: list[tuple[int, float]] = []
    times: list[float] = []

    def evaluate() -> float:
        with torch.no_grad():
            return float(nn.functional.cross_entropy(model(ex), ey))

    for step in range(args.steps):
        if rank == 0 and step % args.eval_every == 0:
            curve.append((step, evaluate()))
        idx = torch.randint(0, xs.shape[0], (args.batch,), generator=gen)
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(ddp(xs[idx]), ys[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        times.append(time.perf_counter() - t0)
        if (step + 1) % max(1, args.steps // 50) == 0:
            print(f"@step {step + 1}", flush=True)
    final = evaluate()
    curve.append((args.steps, final))
    sent = counters["bytes"]
    if state is not None and hasattr(state, "bytes_sent"):
        sent = state.bytes_sent
    elif state is not None:  # homagg hook: what this rank's codec sent to the switch
        sent = state.group.stats.bytes_sent
    params = sum(p.numel() for p in model.parameters())
    digest = float(sum(p.double().sum() for p in model.parameters()))
    record = {"method": args.method, "rank": rank, "world": world, "final_loss": final, "curve": curve,
              "bytes_per_step": sent / args.steps, "step_ms": 1e3 * statistics.median(times[len(times) // 10:]),
              "params": params, "param_digest": digest}
    if dist.get_backend() == "gloo":
        dist.barrier()
    dist.destroy_process_group()
    print(RECORD_MARK + json.dumps(record), flush=True)
    return 0
