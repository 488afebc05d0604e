"""``homagg bench ddp``: DDP step time of a sparse-gradient model, homagg vs gloo, on loopback.

Model: ``nn.Embedding(vocab, dim)`` + a 2-layer MLP; each step touches ``batch * fields`` rows of
the embedding, so most of its (dense-layout) gradient is zero — the case homagg compresses.
For every backend and run, ``world`` rank processes are started on 127.0.0.1 (homagg: embedded
emulator started by rank 0, nothing else); rank 0 reports the median of its timed steps (after
warm-up).  The JSON output lists each run's median and the median over runs per backend, and the
retransmissions of each run summed over the ranks (``retransmits``, ``fast_retransmits``,
``spurious_retransmits`` of the ranks' switch ports; 0 for backends without a switch), with the
host's load average.
Every wait is bounded (``--timeout`` per run); a failed run raises :class:`~homagg.HomAggError`.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from .. import _options as opt
from .._errors import HomAggError
from ..wire import MAX_WORKERS
from ._report import RETX_KEYS

__all__ = ["configure_parser", "run", "BACKENDS"]

#: the backends ``--backends`` may name
BACKENDS = ("homagg", "gloo")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world", type=int, default=2, help="rank processes (default 2)")
    parser.add_argument("--backends", default="homagg,gloo", help="comma-separated (default homagg,gloo)")
    parser.add_argument("--runs", type=int, default=5, help="runs per backend (default 5)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument("--vocab", type=int, default=200_000, help="embedding rows (default 200000)")
    parser.add_argument("--dim", type=int, default=32, help="embedding width (default 32)")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step (default 64)")
    parser.add_argument("--fields", type=int, default=8, help="embedding lookups per sample (default 8)")
    parser.add_argument("--scheme", default=None, help="HOMAGG_SCHEME for the homagg runs")
    parser.add_argument("--sparse", action="store_true",
                        help="nn.Embedding(sparse=True): sparse COO gradients (gloo: its sparse all_reduce)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run (default 300)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_backend", default="gloo", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args._worker:
        return _worker(args)
    backends = _checked(args)
    report: dict[str, Any] = {
        "benchmark": "ddp_step_time",
        "model": {"vocab": args.vocab, "dim": args.dim, "fields": args.fields, "batch_per_rank": args.batch,
                  "sparse": args.sparse},
        "world": args.world, "steps": args.steps, "warmup": args.warmup, "runs": args.runs,
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform}, "results": {},
    }
    for backend in backends:
        load = round(os.getloadavg()[0], 2)
        runs = [_one_run(args, backend) for _ in range(args.runs)]
        medians = [m for m, _ in runs]
        report["results"][backend] = {"run_median_ms": [round(m * 1e3, 3) for m in medians],
                                      "median_ms": round(statistics.median(medians) * 1e3, 3),
                                      "load_1min": load,
                                      **{k: [r[k] for _, r in runs] for k in RETX_KEYS}}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return 0


def _checked(args: argparse.Namespace) -> list[str]:
    """The backends to run; :class:`~homagg.ConfigError` naming the first option out of range."""
    backends = opt.names("--backends", [b.strip() for b in args.backends.split(",") if b.strip()], BACKENDS,
                         args.backends)
    opt.count("--world", args.world, 1, MAX_WORKERS if "homagg" in backends else None,
              why="homagg's worker bitmap" if "homagg" in backends else "")
    for option in ("--runs", "--steps", "--vocab", "--dim", "--batch", "--fields"):
        opt.count(option, getattr(args, option[2:]))
    opt.count("--warmup", args.warmup, 0)
    opt.seconds("--timeout", args.timeout)
    return backends


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_run(args: argparse.Namespace, backend: str) -> tuple[float, dict[str, int]]:
    """Start ``world`` ranks; return rank 0's median step time in seconds and the ranks' summed
    retransmission counts."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(args.world))
    if args.scheme and backend == "homagg":
        env["HOMAGG_SCHEME"] = args.scheme
    forward = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--vocab", str(args.vocab),
               "--dim", str(args.dim), "--batch", str(args.batch), "--fields", str(args.fields)]
    forward += ["--sparse"] if args.sparse else []
    cmd = [sys.executable, "-m", "homagg", "bench", "ddp", "--_worker", "--_backend", backend, *forward]
    procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(args.world)]
    deadline = time.monotonic() + args.timeout
    outs: list[tuple[str, str]] = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        raise HomAggError(f"bench ddp: {backend} run did not finish within {args.timeout}s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise HomAggError(f"bench ddp: {backend} ranks failed {bad}: {outs[bad[0][0]][1][-2000:]}")
    lines = [json.loads(out.strip().splitlines()[-1]) for out, _err in outs]
    return float(lines[0]["median_s"]), {k: sum(int(x["port"].get(k, 0)) for x in lines) for k in RETX_KEYS}


def _worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import homagg.torch  # noqa: F401 - registers the backend

    torch.set_num_threads(1)
    dist.init_process_group(args._backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(args.vocab, args.dim, sparse=args.sparse), nn.Flatten(),
                          nn.Linear(args.dim * args.fields, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randint(0, args.vocab, (args.batch, args.fields), generator=gen)
        y = torch.randn(args.batch, 1, generator=gen)
        t0 = time.perf_counter()
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    port = getattr(getattr(dist.group.WORLD, "_link", None), "port", None)  # homagg: the rank's switch port
    port_stats = dict(getattr(port, "stats", {}))
    dist.destroy_process_group()
    print(json.dumps({"median_s": statistics.median(times), "port": port_stats}), flush=True)
    return 0
