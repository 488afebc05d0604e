"""``homagg bench compress``: convergence of compressed DDP training vs exact aggregation.

A student MLP (32-512-512-10, ~286k parameters) learns a fixed random teacher's labels (see
:mod:`homagg.bench._convergence_rank`); every method trains the same model from the same
initialisation on the same per-rank batches for ``--steps`` steps with ``--world`` CPU ranks:

===============  ==========================================================================
method           aggregation
===============  ==========================================================================
gloo             plain DDP all-reduce (ring) — the reference
homagg           exact homagg (comm hook, embedded switch emulator)
topk-ef          homagg + top-1% with error feedback (``topk:0.01``)
dgc              homagg + Deep Gradient Compression (``dgc:0.01,...``; optimiser momentum 0)
onebit-ef        homagg + homomorphic 1-bit with error feedback (shared scale, codes ADDed)
terngrad, qsgd   homagg + homomorphic TernGrad / QSGD-16 (shared scale)
powersgd         torch's PowerSGD hook (rank 2) over gloo
*-own            the classic own-scale quantiser over gloo (all-gather of codes and scales)
===============  ==========================================================================

Per method: final held-out loss, bytes each worker sends per step (homagg: words to the switch;
gloo: 2(W-1)/W of the buffer, ring; all-gather: (W-1) x own message), median step time (host
load recorded).  Output folder: ``records.json``, ``table.md`` (also printed), ``loss.png``.
``--check`` exits 1 unless every error-feedback method (topk-ef, dgc, onebit-ef) ends within
``--tolerance`` of gloo's final loss: ``loss <= gloo * (1 + tol) + 0.02``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import _options as opt
from .._errors import HomAggError
from ..wire import MAX_WORKERS
from ._ranks import RECORD_MARK, launch_ranks

__all__ = ["configure_parser", "run", "METHODS", "EF_METHODS", "method_spec", "check_tolerance"]

METHODS = ("gloo", "homagg", "topk-ef", "dgc", "onebit-ef", "terngrad", "qsgd", "powersgd",
           "onebit-own", "terngrad-own", "qsgd-own")
EF_METHODS = ("topk-ef", "dgc", "onebit-ef")
QUICK_METHODS = ("gloo", "homagg", "topk-ef", "dgc", "onebit-ef", "terngrad", "qsgd", "powersgd")


def method_spec(name: str, steps: int) -> str:
    """The rank's ``--method`` string of a method name (specs spelled out)."""
    table = {
        "gloo": "gloo", "homagg": "homagg", "powersgd": "powersgd",
        "topk-ef": "hom:topk:0.01",
        "dgc": f"hom:dgc:0.01,momentum=0.9,clip=5,warmup={max(1, steps // 6)}",
        "onebit-ef": "hom:onebit", "terngrad": "hom:terngrad", "qsgd": "hom:qsgd:levels=16",
        "onebit-own": "own:onebit", "terngrad-own": "own:terngrad", "qsgd-own": "own:qsgd:levels=16",
    }
    if name not in table:
        raise HomAggError(f"bench compress: unknown method {name!r}; known: {', '.join(METHODS)}")
    return table[name]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", default=None, help=f"comma-separated (default: all: {','.join(METHODS)})")
    parser.add_argument("--world", type=int, default=None, help="DDP ranks (default 4; quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 400; quick 150)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step (default 32)")
    parser.add_argument("--lr", type=float, default=0.1, help="peak SGD learning rate, cosine-decayed (default 0.1)")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (DGC: 0, it has its own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 ranks, 150 steps, no own-scale baselines")
    parser.add_argument("--tolerance", type=float, default=0.25,
                        help="relative final-loss tolerance of the error-feedback methods vs gloo (default 0.25)")
    parser.add_argument("--check", action="store_true", help="exit 1 if an error-feedback method misses the tolerance")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds without rank output before failing")
    parser.add_argument("--out", default=None, help="output folder (default results/bench-compress-<time>)")
    parser.add_argument("--no-plot", action="store_true", help="skip loss.png")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    # one rank (started by this command itself)
    parser.add_argument("--_rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--method", default="gloo", help=argparse.SUPPRESS)
    parser.add_argument("--pool", type=int, default=8192, help=argparse.SUPPRESS)
    parser.add_argument("--held-out", type=int, default=2048, help=argparse.SUPPRESS)
    parser.add_argument("--eval-every", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help=argparse.SUPPRESS)


def _resolved(args: argparse.Namespace) -> argparse.Namespace:
    if args.world is None:
        args.world = 2 if args.quick else 4
    if args.steps is None:
        args.steps = 150 if args.quick else 400
    names = args.methods.split(",") if args.methods else list(QUICK_METHODS if args.quick else METHODS)
    args.method_names = opt.names("--methods", [m.strip() for m in names if m.strip()], METHODS, args.methods)
    homagg = any(method_spec(m, args.steps).startswith("hom") for m in args.method_names)
    opt.count("--world", args.world, 1, MAX_WORKERS if homagg else None, why="homagg's worker bitmap" if homagg else "")
    opt.count("--steps", args.steps, 10)
    opt.count("--batch", args.batch)
    opt.positive("--lr", args.lr)
    opt.within("--momentum", args.momentum, "[0, 1)")
    opt.within("--tolerance", args.tolerance, "[0, inf)")
    opt.seconds("--timeout", args.timeout)
    return args


def _one(args: argparse.Namespace, name: str, on_step: Any) -> dict[str, Any]:
    spec = method_spec(name, args.steps)
    cmd = [sys.executable, "-m", "homagg", "bench", "compress", "--_rank", "--method", spec,
           "--steps", str(args.steps), "--batch", str(args.batch), "--lr", str(args.lr),
           "--momentum", str(args.momentum), "--seed", str(args.seed)]
    load = os.getloadavg()[0]
    t0 = time.monotonic()

    def line(rank: int, text: str) -> None:
        if rank == 0 and text.startswith("@step "):
            on_step(int(text.split()[1]))

    outs = launch_ranks(cmd, args.world, label=f"bench compress {name}", stall_timeout=args.timeout, on_line=line)
    recs = [json.loads(ln[len(RECORD_MARK):]) for lines in outs for ln in lines if ln.startswith(RECORD_MARK)]
    if len(recs) != args.world:
        raise HomAggError(f"bench compress {name}: {len(recs)} of {args.world} ranks reported")
    digests = [r["param_digest"] for r in recs]
    spread = (max(digests) - min(digests)) / max(1e-12, abs(digests[0]))
    if spread > 1e-6:  # every method must keep the replicas in step (PowerSGD drifts at ~1e-9)
        raise HomAggError(f"bench compress {name}: ranks ended with different parameters {digests}")
    r0 = next(r for r in recs if r["rank"] == 0)
    return {"method": name, "spec": spec, "world": args.world, "steps": args.steps,
            "final_loss": r0["final_loss"], "curve": r0["curve"],
            "bytes_per_step": sum(r["bytes_per_step"] for r in recs) / len(recs),
            "step_ms": r0["step_ms"], "params": r0["params"], "load_1min": round(load, 2), "param_spread": spread,
            "wall_s": round(time.monotonic() - t0, 1)}


def _guarded(args: argparse.Namespace, name: str, on_step: Any) -> dict[str, Any]:
    """:func:`_one`, or a record holding the error (the other methods still run)."""
    try:
        return _one(args, name, on_step)
    except HomAggError as exc:
        print(f"bench compress: {name} failed: {exc}", file=sys.stderr)
        return {"method": name, "spec": method_spec(name, args.steps), "world": args.world, "steps": args.steps,
                "error": str(exc)[:2000], "final_loss": float("nan"), "curve": [], "bytes_per_step": float("nan"),
                "step_ms": float("nan"), "params": 0, "load_1min": round(os.getloadavg()[0], 2)}


def check_tolerance(records: Sequence[dict[str, Any]], tolerance: float) -> list[str]:
    """Error-feedback methods whose final loss exceeds ``gloo * (1 + tolerance) + 0.02`` (with reasons)."""
    by = {r["method"]: r for r in records}
    if "gloo" not in by:
        return []
    if "error" in by["gloo"]:
        return ["gloo: failed, no reference"]
    limit = by["gloo"]["final_loss"] * (1 + tolerance) + 0.02
    return [f"{m}: final loss {by[m]['final_loss']:.4f} > {limit:.4f} (gloo {by['gloo']['final_loss']:.4f})"
            for m in EF_METHODS if m in by and not by[m]["final_loss"] <= limit]


def _table(records: Sequence[dict[str, Any]]) -> str:
    by = {r["method"]: r for r in records}
    ref = by.get("gloo") if "error" not in by.get("gloo", {}) else None
    rows = ["| method | spec | final loss | vs gloo | bytes/step/worker | bytes vs gloo | step ms | load |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        rel = f"{r['final_loss'] / ref['final_loss']:.2f}x" if ref else "-"
        rb = f"{r['bytes_per_step'] / ref['bytes_per_step']:.3f}x" if ref and ref["bytes_per_step"] else "-"
        rows.append(f"| {r['method']} | `{r['spec']}` | {r['final_loss']:.4f} | {rel} | {r['bytes_per_step']:,.0f} | "
                    f"{rb} | {r['step_ms']:.1f} | {r['load_1min']} |")
    return "\n".join(rows)


def _plot(records: Sequence[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in records:
        if not r["curve"]:
            continue
        steps, losses = zip(*r["curve"])
        ax.plot(steps, losses, label=r["method"], linestyle="--" if r["method"].endswith("-own") else "-")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out cross-entropy")
    ax.set_yscale("log")
    ax.set_title(f"compressed DDP, {records[0]['world']} ranks")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args._rank:
        from ._convergence_rank import rank_main

        return rank_main(args)
    args = _resolved(args)
    records: list[dict[str, Any]] = []
    if args.no_progress:
        for name in args.method_names:
            records.append(_guarded(args, name, lambda _s: None))
            print(f"bench compress: {name} done", file=sys.stderr)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn()) as bar:
            tasks = {n: bar.add_task(n, total=args.steps) for n in args.method_names}
            for name in args.method_names:
                records.append(_guarded(args, name, lambda s, t=tasks[name]: bar.update(t, completed=s)))
                bar.update(tasks[name], completed=args.steps)
    out_dir = Path(args.out or f"results/bench-compress-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    failures = check_tolerance(records, args.tolerance)
    report = {"benchmark": "compress_convergence", "world": args.world, "steps": args.steps, "batch": args.batch,
              "lr": args.lr, "tolerance": args.tolerance, "failures": failures,
              "machine": {"cpus": os.cpu_count(), "platform": sys.platform}, "records": records}
    (out_dir / "records.json").write_text(json.dumps(report, indent=2) + "\n")
    table = _table(records)
    params = max((r["params"] for r in records), default=0)
    header = (f"homagg bench compress: {args.world} ranks, {args.steps} steps, batch {args.batch}/rank, "
              f"{params} parameters, lr {args.lr}")
    (out_dir / "table.md").write_text(f"{header}\n\n{table}\n")
    print(f"{header}\n\n{table}\n")
    if not args.no_plot:
        try:
            _plot(records, out_dir / "loss.png")
        except ImportError:
            print("bench compress: matplotlib missing (pip install 'homagg[bench]'): no plot", file=sys.stderr)
    for f in failures:
        print(f"bench compress: tolerance missed: {f}", file=sys.stderr)
    print(f"results in {out_dir}")
    failed = [r["method"] for r in records if "error" in r]
    return 1 if (args.check and failures) or failed else 0
