"""``homagg bench models``: DDP iteration time of NCF, LSTM, VGG19 and BERT on shaped links.

For every method, ``world`` rank processes are started, one per worker namespace of a
:class:`~homagg.bench._netns.StarNet` whose links are shaped to ``--bw`` Mbit/s (root needed;
``--loopback`` runs the same on 127.0.0.1 without shaping).  Each rank trains every model for a
few DDP iterations (:mod:`homagg.bench._models_rank` says exactly what is timed and checked).
Methods: ``gloo`` (ring all_reduce), ``homagg`` (backend ``homagg``, scheme ``auto``, the switch
emulator on the switch host), ``homagg-sparse`` (the same with ``nn.Embedding(sparse=True)``:
only for models with embeddings), ``homagg-topk`` (the same as ``homagg`` with the group option
``compress="topk:0.01"``: top-1% sparsification with error feedback in front of the exact codec),
``powersgd`` (torch's PowerSGD hook, rank 1, on gloo) and ``fp16`` (torch's fp16 compression hook
on gloo).  homagg-topk, PowerSGD and fp16 are lossy by design (``lossless: false``, never
``exact``; ``ranks_identical`` still says whether every rank got the same result; ``compress``
names the spec).

Records (``records.json`` under ``"records"`` in the output folder, and ``--json``): ``model``,
``method``, ``world``, ``bw_mbit``, ``mtu`` and ``replication`` (how the emulator sends results:
``multicast`` or ``unicast``, see ``homagg bench net``; all three null on loopback), ``iteration_s`` (median over the timed
iterations of the slowest rank's time), ``compute_s`` (the same for the forward/backward/step
under ``ddp.no_sync()``: no communication), ``comm_s`` (``iteration_s - compute_s``: the
communication time *not hidden* behind backward), ``bytes_per_worker`` (per iteration; homagg:
the group's ``stats.bytes_sent``; gloo methods: ``2(W-1)/W`` x the payload of every all_reduce,
i.e. after compression for PowerSGD/fp16), ``speedup_vs_gloo``, ``bytes_ratio_vs_gloo`` (gloo's bytes / this method's: the speedup the
bytes alone would allow), ``lossless``, ``exact``
(lossless methods: ranks' parameters and bucket results identical bit for bit, and, for homagg,
every bucket result within the codec's bound of the float64 sum), ``density`` (numel-weighted mean
local gradient density over the DDP buckets) and ``bucket_density``, ``max_rel_err``,
``load_avg``, ``machine``; where the comm time goes: ``bucket_issued_s`` / ``bucket_done_s`` (per DDP
bucket, the slowest rank's median time after the step began at which the hook was called / the
result was ready; DDP's communication runs one bucket after the other), ``comm_counters`` (homagg:
rank 0's codec and port counters over the timed iterations, e.g. ``scheme:compact`` = segments
that scheme carried, ``rounds``, ``port:packets``) and ``retransmits`` (all ranks); ``cpu_load``
(``--cpu-load N``: N busy processes at nice 19 beside the run, :mod:`homagg.bench._load`).  Also
``table.md`` and ``iteration.png`` (matplotlib, optional).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from .. import _options as opt
from .._errors import HomAggError
from ..wire import MAX_WORKERS
from ._allreduce import _machine, _names
from ._models_rank import COMPRESS, LOSSY, METHODS
from ._models_zoo import MODELS, spec
from ._models_out import markdown_table, plot
from ._load import BackgroundLoad, add_cpu_load_argument, describe_load
from ._net import add_replication_argument
from ._netns import MAX_MTU, MTU, require_root
from ._ranks import RECORD_MARK, launch_ranks
from ._report import load_range, out_folder, write_report

__all__ = ["configure_parser", "run", "RECORD_FIELDS"]

#: every record's fields and their JSON types
RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (str,), "method": (str,), "compress": (str, type(None)), "world": (int,), "bw_mbit": (float, type(None)),
    "mtu": (int, type(None)), "replication": (str, type(None)), "iteration_s": (float,),
    "compute_s": (float,), "comm_s": (float,), "bytes_per_worker": (float,), "speedup_vs_gloo": (float, type(None)),
    "bytes_ratio_vs_gloo": (float, type(None)), "lossless": (bool,), "exact": (bool,), "density": (float,), "bucket_density": (list,), "bucket_numel": (list,),
    "max_rel_err": (float,), "params": (int,), "iterations": (int,), "load_avg": (list,), "machine": (dict,),
    "cpu_load": (int,),
}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``homagg bench models``."""
    parser.add_argument("--models", type=_names, default=None, help=f"comma list (default {','.join(MODELS)}; "
                                                                    "also lstm-full)")
    parser.add_argument("--methods", type=_names, default=None,
                        help=f"comma list (default {','.join(METHODS)})")
    parser.add_argument("--world", type=int, default=4, help="worker hosts / ranks (default 4)")
    parser.add_argument("--bw", type=float, default=1000.0, help="link rate in Mbit/s (default 1000)")
    parser.add_argument("--mtu", type=int, default=MTU,
                        help=f"link MTU in bytes; a homagg datagram fills one frame (default {MTU}: jumbo "
                             f"Ethernet; up to veth's {MAX_MTU}: fewer datagrams for the emulator and ranks)")
    add_replication_argument(parser)
    parser.add_argument("--loopback", action="store_true",
                        help="no root: ranks on 127.0.0.1, links not shaped (bw_mbit null)")
    parser.add_argument("--iterations", type=int, default=None, help="timed iterations (default 5; quick 3)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default 3, >= 3 so "
                                                              "PowerSGD's timed iterations are compressed)")
    parser.add_argument("--batch", type=int, default=None, help="samples per rank (default: the model's)")
    parser.add_argument("--quick", action="store_true", help="scaled-down models, 3 iterations")
    parser.add_argument("--seed", type=int, default=0, help="batch seed (default 0)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds without progress before the ranks count as hung (default 600)")
    parser.add_argument("--out", default=None, help="output folder (default results/bench-models-<time>)")
    parser.add_argument("--json", default=None, help="also write the JSON report here")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    add_cpu_load_argument(parser)
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_method", default="gloo", help=argparse.SUPPRESS)
    parser.add_argument("--_codec", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--_scheme", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--_models", type=_names, default=None, help=argparse.SUPPRESS)


def _merge(lines: list[dict[str, Any]], world: int, bw: float | None, iterations: int,
           machine: dict[str, Any], mtu: int | None = None, replication: str | None = None,
           cpu_load: int = 0) -> dict[str, Any]:
    """One record from every rank's report of one (model, method) (``lines[r]``: rank r's);
    ``cpu_load``: the background processes beside the run."""
    first = lines[0]
    method = first["method"]
    slowest = [max(col) for col in zip(*(ln["times"] for ln in lines))]
    compute = [max(col) for col in zip(*(ln["compute_times"] for ln in lines))]
    iteration_s, compute_s = statistics.median(slowest), statistics.median(compute)
    same = all(ln["param_digest"] == first["param_digest"] and ln["bucket_digest"] == first["bucket_digest"]
               for ln in lines)
    lossless = method not in LOSSY
    exact = lossless and same and (first["within_bound"] or METHODS[method][0] != "homagg")
    numel, dens = first["bucket_numel"], first["bucket_density"]
    return {"model": first["model"], "method": method, "scheme": "auto" if METHODS[method][0] == "homagg" else None,
            "compress": COMPRESS.get(method),
            "world": world, "bw_mbit": bw, "mtu": mtu, "replication": replication, "iteration_s": float(iteration_s), "compute_s": float(compute_s),
            "comm_s": float(max(0.0, iteration_s - compute_s)),
            "bytes_per_worker": float(max(ln["bytes_per_iteration"] for ln in lines)), "speedup_vs_gloo": None,
            "bytes_ratio_vs_gloo": None, "lossless": lossless, "exact": bool(exact), "ranks_identical": same,
            "within_bound": bool(first["within_bound"]),
            "density": float(sum(n * d for n, d in zip(numel, dens)) / max(1, sum(numel))),
            "bucket_density": dens, "bucket_numel": numel, "max_rel_err": float(first["max_rel_err"]),
            "max_abs_err": float(first["max_abs_err"]), "params": int(first["params"]), "batch": first["batch"],
            "summary": first["summary"], "iterations": iterations, "times_s": slowest, "compute_times_s": compute,
            "load_avg": [round(v, 2) for v in first["load_avg"]], "machine": machine, "cpu_load": cpu_load,
            # per bucket (DDP's order), the slowest rank's median: hook called / result ready, s after the step began
            "bucket_issued_s": [max(c) for c in zip(*(ln.get("bucket_issued_s", []) for ln in lines))],
            "bucket_done_s": [max(c) for c in zip(*(ln.get("bucket_done_s", []) for ln in lines))],
            # homagg, over the timed iterations: rank 0's codec/port counters (schemes per segment, rounds,
            # packets...) and the retransmissions of all ranks
            "comm_counters": first.get("comm_counters", {}),
            "retransmits": sum(ln.get("comm_counters", {}).get("port:retransmits", 0) for ln in lines)}


def link_codec(args: argparse.Namespace) -> dict[str, float]:
    """Codec options of the homagg ranks: on shaped links, ``auto``'s cost model is told their rate
    (``bandwidth_gbps``), as a user of such links would set it; on loopback, the defaults."""
    return {} if args.loopback else {"bandwidth_gbps": args.bw / 1000}


def _measure(args: argparse.Namespace, models: list[str], methods: list[str], machine: dict[str, Any]) -> list[dict[str, Any]]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ._netns import StarNet

    units = [(m, [n for n in models if not METHODS[m][1] or spec(n, args.quick).has_embeddings]) for m in methods]
    units = [(m, ns) for m, ns in units if ns]
    records: list[dict[str, Any]] = []
    bw = None if args.loopback else float(args.bw)
    net = None if args.loopback else StarNet(args.world, float(args.bw), args.mtu, args.replication)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        if net is not None:
            net.__enter__()
        launch = launch_ranks if net is None else net.launch
        with Progress(*columns, transient=False) as bar:
            task = bar.add_task("bench models", total=sum(len(ns) for _, ns in units))
            for method, names in units:
                bar.update(task, description=f"{method} (world {args.world})")
                cmd = [sys.executable, "-m", "homagg", "bench", "models", "--_worker", "--_method", method,
                       "--_models", ",".join(names), "--iterations", str(args.iterations), "--warmup",
                       str(args.warmup), "--seed", str(args.seed), "--timeout", str(args.timeout)]
                cmd += (["--quick"] if args.quick else []) + (["--batch", str(args.batch)] if args.batch else [])
                cmd += ["--_codec", json.dumps(link_codec(args))]

                def progress(rank: int, line: str) -> None:
                    if rank == 0 and RECORD_MARK in line:
                        bar.advance(task)

                outs = launch(cmd, args.world, label=f"bench models ({method}, world {args.world})",
                              stall_timeout=args.timeout, on_line=progress)
                reports = [[json.loads(ln.partition(RECORD_MARK)[2]) for ln in lines if RECORD_MARK in ln]
                           for lines in outs]
                short = [r for r, rep in enumerate(reports) if len(rep) != len(names)]
                if short:
                    raise HomAggError(f"bench models ({method}): rank {short[0]} reported {len(reports[short[0]])} "
                                      f"of {len(names)} models; its stdout: {outs[short[0]][-20:]}")
                mtu, replication = (None, None) if net is None else (args.mtu, args.replication)
                records += [_merge(list(lines), args.world, bw, args.iterations, machine, mtu, replication,
                                   args.cpu_load) for lines in zip(*reports)]
    finally:
        if net is not None:
            net.close()
    gloo = {r["model"]: r for r in records if r["method"] == "gloo"}
    for r in records:
        base = gloo.get(r["model"])
        if base is not None and r["iteration_s"] > 0:
            r["speedup_vs_gloo"] = base["iteration_s"] / r["iteration_s"]
        # what the bytes alone would allow: the ring's bytes per worker over this method's
        r["bytes_ratio_vs_gloo"] = (base["bytes_per_worker"] / r["bytes_per_worker"]
                                    if base is not None and r["bytes_per_worker"] > 0 else None)
    return records


def run(args: argparse.Namespace) -> int:
    """The sweep (or, with the hidden ``--_worker``, one rank)."""
    if args.iterations is None:
        args.iterations = 3 if args.quick else 5
    if args._worker:
        from ._models_rank import rank_main

        return rank_main(args)
    models = args.models or list(MODELS)
    methods = args.methods or list(METHODS)
    for name in models:
        spec(name, args.quick)  # validates
    opt.names("--methods", methods, METHODS)
    homagg = any(METHODS[m][0] == "homagg" for m in methods)
    opt.count("--world", args.world, 2, MAX_WORKERS if homagg else None, why="homagg's worker bitmap" if homagg else "")
    opt.count("--iterations", args.iterations)
    opt.count("--warmup", args.warmup, 3, why="so PowerSGD's timed iterations are compressed")
    if args.batch is not None:
        opt.count("--batch", args.batch)
    opt.positive("--bw", args.bw, "Mbit/s")
    opt.count("--mtu", args.mtu, 1280, MAX_MTU, why="bytes")
    opt.seconds("--timeout", args.timeout)
    if not args.loopback:
        require_root("homagg bench models", "pass --loopback (unshaped 127.0.0.1, says so in the records)")
    if "gloo" not in methods:
        methods = ["gloo", *methods]  # the baseline of speedup_vs_gloo
    out_dir = out_folder(args.out, "models")
    machine = _machine()
    started = time.monotonic()
    with BackgroundLoad(args.cpu_load):
        records = _measure(args, models, methods, machine)
    links = ("loopback, not shaped" if args.loopback
             else f"tc tbf {args.bw:g} Mbit/s per direction, MTU {args.mtu}; no delay or loss; "
                  f"results by {args.replication}; homagg codec: bandwidth_gbps={args.bw / 1000:g} (the links' "
                  f"rate, for auto's cost model)")
    report = {"benchmark": "models", "quick": args.quick, "world": args.world, "links": links, "machine": machine,
              "iterations": args.iterations, "warmup": args.warmup, "cpu_load": args.cpu_load,
              "wall_s": round(time.monotonic() - started, 1),
              "records": records}
    header = (f"machine: {machine['platform']}, {machine['cpus']} cpus; {load_range(records)}; "
              f"{describe_load(args.cpu_load)}; world {args.world}; links: {links}; {args.iterations} timed "
              f"iterations, medians of the slowest "
              f"rank; wall {report['wall_s']} s{' (quick models)' if args.quick else ''}")
    write_report(out_dir, report, header, markdown_table(records), json_copy=args.json, no_plot=args.no_plot,
                 plots=[("iteration.png", lambda path: plot(records, path))], command="bench models")
    inexact = [f"{r['model']}/{r['method']}" for r in records if r["lossless"] and not r["exact"]]
    if inexact:
        print(f"bench models: lossless result(s) NOT exact: {inexact}", file=sys.stderr)
        return 1
    return 0
