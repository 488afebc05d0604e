"""``homagg bench latency``: per-call latency of small ``dist.all_reduce`` calls, homagg vs gloo in
the same run, and the floor of this machine (one UDP round trip through the emulator process).

For each world size (``--world``, each 1..32: homagg's worker bitmap) and backend (``--backends``,
gloo first), exactly ``world`` rank processes are started on 127.0.0.1 with the launcher of
``bench allreduce`` (:func:`homagg.bench._ranks.launch_ranks`: each rank in its own session,
killed with whatever it started when the launch ends, fails or stalls; every rank asks the kernel
to kill it when the launcher dies, so no rank outlives this command).  Each rank runs
:mod:`homagg.bench._latency_rank` over every size of ``--numel`` (fp32 elements; default
1, 256, 16K and 256K: 4 bytes to 1 MB) and reduction (``--op``: ``sum``, the default, a record
of ``op`` ``allreduce``; ``max`` and ``min``, records of that ``op``): ``--warmup`` calls, then
``--calls`` timed calls; with
``--barrier`` also ``dist.barrier()`` itself (a record of ``op`` ``barrier``, 0 elements; homagg's
runs on its gloo side: its rounds per call, switch rounds, are 0).

A call's time is the slowest rank's time of that call (``perf_counter`` around ``dist.all_reduce``
in each rank); the record holds its p50/p90/p99 and mean over the timed calls, the gloo p50 over
the record's p50 (``x_gloo``), each rank's CPU per call (user + system, ``getrusage`` in the rank
process, every thread: the median call's total, and the mean; user and system apart as means over
the calls only, since the kernel splits a task's time by sampling ticks) and the largest median, the emulator's
CPU per call (homagg, embedded emulator), the homagg group's rounds on the size's first call and
per timed call, and ``exact`` (every rank got rank 0's result bit for bit on every call, and rank
0's results lie within the documented bound of the float64 sum).

Before the ranks start, the floor is measured (:mod:`homagg.bench._latency_limit`): one 1-word
datagram of a 1-worker job through a spawned emulator and back (``limit`` in the report; skip with
``--no-limit``).

Bad options raise :class:`~homagg.ConfigError` naming the option (exit status 2) before anything
starts.  Exit status 1 if a homagg result was not exact.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from .. import _options as opt
from .._errors import ConfigError, HomAggError
from ..codec._config import SCHEMES
from ..wire import MAX_WORKERS
from ._latency_limit import measure_limit, percentiles
from ._ranks import RECORD_MARK, launch_ranks
from ._report import counts, load_range, out_folder, write_report

__all__ = ["configure_parser", "run", "BACKENDS", "DEFAULTS", "RECORD_FIELDS", "check_options", "markdown_table"]

#: backends compared (gloo is the reference of ``x_gloo``)
BACKENDS = ("gloo", "homagg")
#: option defaults: world sizes, sizes in fp32 elements, timed and warm-up calls
DEFAULTS: dict[str, Any] = {"world": [2, 4, 8], "numel": [1, 256, 16_384, 262_144], "calls": 300, "warmup": 30}
#: the largest size this benchmark takes (64 M elements: 256 MB per tensor; ``bench allreduce`` goes further)
MAX_NUMEL = 1 << 26
INPUTS = ("fresh", "same")
#: the reductions timed (``--op``): SUM (the codec), MAX and MIN (homagg: the switch's MAX)
OPS = ("sum", "max", "min")
PACES = ("loop", "barrier")
#: every record's fields and their JSON types (None: the field may be null)
RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "backend": (str,), "scheme": (str, type(None)), "op": (str,), "numel": (int,), "bytes": (int,), "world": (int,),
    "calls": (int,), "input": (str,), "pace": (str,), "p50_s": (float,), "p90_s": (float,), "p99_s": (float,),
    "mean_s": (float,), "x_gloo": (float, type(None)), "cpu_s_per_call": (float,),
    "cpu_s_per_call_per_rank": (list,), "cpu_user_s_per_call_per_rank": (list,),
    "cpu_sys_s_per_call_per_rank": (list,), "cpu_mean_s_per_call_per_rank": (list,),
    "switch_cpu_s_per_call": (float, type(None)), "first_call_rounds": (int, type(None)),
    "rounds_per_call": (float, type(None)), "exact": (bool,), "max_abs_err": (float,),
    "distinct_results": (int,), "times_s": (list,), "load_avg": (list,),
}


def _names(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``homagg bench latency``."""
    parser.add_argument("--world", type=counts, default=DEFAULTS["world"],
                        help=f"rank counts, each 1..{MAX_WORKERS} (default 2,4,8)")
    parser.add_argument("--numel", type=counts, default=DEFAULTS["numel"],
                        help="fp32 elements per call, a comma list (default 1,256,16384,262144: 4 B to 1 MB)")
    parser.add_argument("--calls", type=int, default=DEFAULTS["calls"], help="timed calls per size (default 300)")
    parser.add_argument("--warmup", type=int, default=DEFAULTS["warmup"],
                        help="untimed calls per size before them (default 30; the first is a first call)")
    parser.add_argument("--backends", type=_names, default=list(BACKENDS), help="gloo,homagg (default both)")
    parser.add_argument("--scheme", default="auto", help="homagg's scheme (default auto)")
    parser.add_argument("--op", type=_names, default=["sum"],
                        help="reductions timed at every size, a comma list of sum,max,min (default sum)")
    parser.add_argument("--input", default="fresh",
                        help="fresh: a new tensor every call (default); same: one tensor, its values restored")
    parser.add_argument("--pace", default="loop", help="loop: calls back to back (default); barrier: a "
                                                       "dist.barrier() (untimed) before every call")
    parser.add_argument("--barrier", action="store_true",
                        help="also time dist.barrier() (a row of 0 elements)")
    parser.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds: the groups' timeout, and silence after which the ranks count as hung")
    parser.add_argument("--no-limit", action="store_true", help="skip the emulator round-trip floor")
    parser.add_argument("--out", default=None, help="folder for records.json and table.md "
                                                    "(default results/bench-latency-<time>)")
    parser.add_argument("--json", default=None, help="also write the JSON report here")
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_backend", default="gloo", help=argparse.SUPPRESS)


def check_options(args: argparse.Namespace) -> None:
    """:class:`~homagg.ConfigError` naming the first option out of range; nothing is started."""
    for key in ("world", "numel", "backends", "op"):
        if not getattr(args, key):
            raise ConfigError(f"--{key}: need at least one value")
    for world in args.world:
        opt.count("--world", world, 1, MAX_WORKERS, why="homagg's worker bitmap; one rank process each")
    for numel in args.numel:
        opt.count("--numel", numel, 1, MAX_NUMEL, why="bench allreduce takes larger tensors")
    numel, world = max(args.numel), max(args.world)
    # each rank: its input, the restored copy and a call's tensor (12 B per element); rank 0 also
    # the float64 sum and bound (16 more)
    opt.memory("--numel", numel, 12 * numel * world + 16 * numel, f"{world} rank(s)")
    opt.count("--calls", args.calls)
    opt.count("--warmup", args.warmup, 0)
    opt.seconds("--timeout", args.timeout)
    for name, value, allowed in (("--backends", args.backends, BACKENDS), ("--scheme", [args.scheme], SCHEMES),
                                 ("--input", [args.input], INPUTS), ("--pace", [args.pace], PACES),
                                 ("--op", args.op, OPS)):
        bad = [v for v in value if v not in allowed]
        if bad:
            raise ConfigError(f"{name} {','.join(bad)}: choose from {', '.join(allowed)}")


def _merge(backend: str, scheme: str | None, world: int, lines: Sequence[dict[str, Any]],
           args: argparse.Namespace) -> dict[str, Any]:
    """One record from every rank's report of one size (``lines[r]`` is rank r's)."""
    first = lines[0]
    slowest = [max(col) for col in zip(*(ln["times"] for ln in lines))]
    spread = percentiles(slowest)
    per_rank = [[u + s for u, s in zip(ln["cpu_user"], ln["cpu_sys"])] for ln in lines]
    medians = [statistics.median(c) for c in per_rank]
    same = all(ln["digests"] == first["digests"] for ln in lines)
    return {"backend": backend, "scheme": scheme, "op": first["op"], "numel": int(first["numel"]), "bytes": 4 * int(first["numel"]),
            "world": world, "calls": len(slowest), "input": args.input, "pace": args.pace,
            "p50_s": spread["p50"], "p90_s": spread["p90"], "p99_s": spread["p99"], "mean_s": spread["mean"],
            "x_gloo": None, "cpu_s_per_call": float(max(medians)),
            "cpu_s_per_call_per_rank": [float(m) for m in medians],
            "cpu_user_s_per_call_per_rank": [float(statistics.fmean(ln["cpu_user"])) for ln in lines],
            "cpu_sys_s_per_call_per_rank": [float(statistics.fmean(ln["cpu_sys"])) for ln in lines],
            "cpu_mean_s_per_call_per_rank": [float(statistics.fmean(c)) for c in per_rank],
            "switch_cpu_s_per_call": first.get("switch_cpu_s_per_call"),
            "first_call_rounds": first.get("first_call_rounds"), "rounds_per_call": first.get("rounds_per_call"),
            "exact": bool(same and first["within_bound"]), "max_abs_err": float(first["max_abs_err"]),
            "distinct_results": int(first["distinct_results"]), "times_s": slowest,
            "load_avg": [round(v, 2) for v in first["load_avg"]]}


def _measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (world, backend) launch, gloo first; the records with ``x_gloo`` filled in."""
    records: list[dict[str, Any]] = []
    order = [b for b in BACKENDS if b in args.backends]
    for world in args.world:
        for backend in order:
            scheme = args.scheme if backend == "homagg" else None
            cmd = [sys.executable, "-m", "homagg", "bench", "latency", "--_worker", "--_backend", backend,
                   "--numel", ",".join(map(str, args.numel)), "--calls", str(args.calls), "--warmup", str(args.warmup),
                   "--scheme", args.scheme, "--input", args.input, "--pace", args.pace, "--seed", str(args.seed),
                   "--timeout", repr(args.timeout), "--op", ",".join(args.op)] + (["--barrier"] if args.barrier else [])
            label = f"bench latency ({backend}, world {world})"
            print(f"{label}: {len(args.numel)} size(s) x {args.warmup} + {args.calls} calls", flush=True)
            outs = launch_ranks(cmd, world, label=label, stall_timeout=args.timeout)
            reports = [[json.loads(ln.partition(RECORD_MARK)[2]) for ln in lines if RECORD_MARK in ln]
                       for lines in outs]
            want = len(args.numel) * len(args.op) + bool(args.barrier)
            short = [r for r, rep in enumerate(reports) if len(rep) != want]
            if short:
                raise HomAggError(f"{label}: rank {short[0]} reported {len(reports[short[0]])} of "
                                  f"{want} sizes; its stdout: {outs[short[0]][-20:]}")
            records += [_merge(backend, scheme, world, lines, args) for lines in zip(*reports)]
    gloo = {(r["op"], r["numel"], r["world"]): r["p50_s"] for r in records if r["backend"] == "gloo"}
    for r in records:
        base = gloo.get((r["op"], r["numel"], r["world"]))
        if r["backend"] != "gloo" and base is not None and r["p50_s"] > 0:
            r["x_gloo"] = base / r["p50_s"]
    return records


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e6 * seconds:,.0f}"


def markdown_table(records: Sequence[dict[str, Any]]) -> str:
    """One row per record, by size, world, then gloo before homagg."""
    rows = sorted(records, key=lambda r: (r["op"], r["numel"], r["world"], BACKENDS.index(r["backend"])))
    out = ["| numel | bytes | world | backend | p50 us | p90 us | p99 us | x gloo (p50) | CPU us/call/rank (the "
           "largest median; that rank's mean user+sys) | emulator CPU us/call | rounds: first call, per call | exact |",
           "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        worst = max(range(len(r["cpu_s_per_call_per_rank"])), key=lambda i: r["cpu_s_per_call_per_rank"][i])
        cpu = (f"{_us(r['cpu_s_per_call'])} ({_us(r['cpu_user_s_per_call_per_rank'][worst])}+"
               f"{_us(r['cpu_sys_s_per_call_per_rank'][worst])})")
        rounds = "-" if r["first_call_rounds"] is None else f"{r['first_call_rounds']}, {r['rounds_per_call']:.2f}"
        name = r["backend"] if r["scheme"] is None else f"homagg/{r['scheme']}"
        size = r["op"] if r["op"] == "barrier" else f"{r['numel']:,}" + ("" if r["op"] == "allreduce" else f" ({r['op']})")
        out.append(f"| {size} | {r['bytes']:,} | {r['world']} | {name} | {_us(r['p50_s'])} | "
                   f"{_us(r['p90_s'])} | {_us(r['p99_s'])} | "
                   f"{'-' if r['x_gloo'] is None else format(r['x_gloo'], '.2f')} | {cpu} | "
                   f"{_us(r['switch_cpu_s_per_call'])} | {rounds} | {'yes' if r['exact'] else 'NO'} |")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """Measure the floor and every launch (or, with the hidden ``--_worker``, be one rank)."""
    check_options(args)
    if args._worker:
        from ._latency_rank import rank_main

        return rank_main(args)
    out_dir = out_folder(args.out, "latency")
    started = time.monotonic()
    limit = None if args.no_limit else measure_limit(max(args.calls, 200), max(args.warmup, 20), args.timeout)
    records = _measure(args)
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "python": platform.python_version()}
    report = {"benchmark": "latency", "options": {k: getattr(args, k) for k in (
        "world", "numel", "calls", "warmup", "backends", "scheme", "op", "input", "pace", "barrier", "seed")},
        "machine": machine, "limit": limit, "wall_s": round(time.monotonic() - started, 1), "records": records}
    floor = ("floor not measured" if limit is None else
             f"floor: one datagram through the emulator and back p50 {_us(limit['bare_s']['p50'])} us "
             f"(p99 {_us(limit['bare_s']['p99'])}), through UdpSwitchPort.combine p50 {_us(limit['port_s']['p50'])} us")
    header = (f"machine: {machine['platform']}, {machine['cpus']} cpus; {load_range(records)}; "
              f"{args.calls} timed calls after {args.warmup}, input {args.input}, pace {args.pace}; "
              f"a call's time is the slowest rank's; {floor}; wall {report['wall_s']} s")
    write_report(out_dir, report, header, markdown_table(records), json_copy=args.json, no_plot=True,
                 command="bench latency")
    inexact = [r for r in records if r["backend"] == "homagg" and not r["exact"]]
    if inexact:
        print(f"bench latency: {len(inexact)} homagg result(s) NOT exact", file=sys.stderr)
        return 1
    return 0
