"""``homagg bench allreduce``: ``dist.all_reduce`` through the homagg backend vs gloo, on loopback.

Sweeps world size x (gloo's ring, gloo's sparse COO all_reduce, then every homagg scheme) x numel x density (each axis a comma list or
one value).  For each world size and backend/scheme, ``world`` rank processes are started on
127.0.0.1 (:func:`homagg.bench._ranks.launch_ranks`; with ``--isolate``, once per configuration
instead) and run :mod:`homagg.bench._allreduce_rank`: per configuration one warm-up and
``--repeats`` timed calls, each between two barriers.  A repeat's time is the slowest rank's; the record
holds the median over repeats, the homagg group's rounds and bytes per call (``pg.stats``; a
large tensor's pipelined segments overlap, so rounds are then per segment, beside
``segments_per_allreduce``), the
UDP port's retransmissions per call (summed over ranks), the ranks' CPU time and minor page faults
per call (``getrusage`` of each rank process around the call, every thread; summed over ranks,
median over calls: ``cpu_s_per_call``, ``faults_per_call``; a switch process is not in it), that
CPU split into user and kernel time (``cpu_user_s_per_call`` + ``cpu_sys_s_per_call`` =
``cpu_s_per_call``: the parts of the median call), the switch emulator's CPU per call
(``switch_cpu_s_per_call``: its process's ``/proc`` user + system time, every thread, read by rank
0 around each call; the mean over calls, as ``/proc`` counts 10 ms ticks; null for the gloo
baselines, an external switch or one running inside a rank), ``cpu_load`` (``--cpu-load``: busy
background processes at nice 19, :mod:`homagg.bench._load`), and ``exact``: every rank's result
equals rank 0's bit for bit and lies within the documented bound of the float64 sum.

Output: JSON records (``--json``, and ``records.json`` in ``--out``), ``table.md`` (also printed)
and ``speedup.png`` (speedup vs density, one panel per (numel, world)).  Exit status 1 if a homagg
result was not exact; a failed or hung rank raises :class:`~homagg.HomAggError` naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import _options as opt
from ..codec._config import SCHEMES, CodecConfig
from .._errors import ConfigError, HomAggError
from ..wire import MAX_WORKERS
from ._cpu import median_call_split
from ._load import BackgroundLoad, add_cpu_load_argument, describe_load
from ._ranks import RECORD_MARK, launch_ranks
from ._report import RETX_KEYS, counts, load_range, out_folder, write_report

__all__ = ["configure_parser", "run", "BASELINES", "FULL", "QUICK", "RECORD_FIELDS", "RECORD_MARK", "markdown_table"]

#: sweep defaults: world sizes, numels, densities, schemes, repeats
FULL: dict[str, Any] = {"world": [2, 4, 8], "numel": [1_000_000, 25_000_000],
                        "density": [1e-4, 1e-3, 1e-2, 0.1, 1.0], "schemes": list(SCHEMES), "repeats": 5,
                        "baselines": ["gloo", "gloo-sparse"]}
QUICK: dict[str, Any] = {"world": [2, 4], "numel": [1_000_000], "density": [1e-3, 1e-2, 1.0],
                         "schemes": ["auto", "dense"], "repeats": 3, "baselines": ["gloo", "gloo-sparse"]}
#: baseline backends: gloo's ring all_reduce of the dense tensor (the reference of ``speedup_vs_gloo``)
#: and gloo's all_reduce of the same data as a sparse COO tensor (densities below 1 only)
BASELINES = ("gloo", "gloo-sparse")
#: every record's fields and their JSON types (None: the field may be null)
RECORD_FIELDS: dict[str, tuple[type, ...]] = {
    "backend": (str,), "scheme": (str, type(None)), "numel": (int,), "density": (float,), "world": (int,),
    "median_s": (float,), "rounds_per_allreduce": (float, type(None)),
    "segments_per_allreduce": (float, type(None)), "bytes_per_worker": (float,),
    "speedup_vs_gloo": (float, type(None)), "retransmits": (float, type(None)),
    "fast_retransmits": (float, type(None)), "spurious_retransmits": (float, type(None)), "exact": (bool,),
    "max_abs_err": (float,), "cpu_s_per_call": (float, type(None)), "cpu_user_s_per_call": (float, type(None)),
    "cpu_sys_s_per_call": (float, type(None)), "switch_cpu_s_per_call": (float, type(None)),
    "faults_per_call": (float, type(None)), "times_s": (list,), "repeats": (int,), "load_avg": (list,),
    "machine": (dict,), "codec": (dict,), "cpu_load": (int,),
}


def _floats(text: str) -> list[float]:
    return [float(p) for p in text.split(",") if p.strip()]


def _names(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def codec_options(text: str) -> dict[str, Any]:
    """``"bitmap_levels=1,segment=8388608"`` -> codec options for homagg's ranks (values: ints,
    floats, ``none``); validated by :class:`~homagg.CodecConfig` (ConfigError naming the key)."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip().isidentifier():
            raise argparse.ArgumentTypeError(f"codec option {part!r} is not KEY=VALUE")
        value: Any = None if raw.strip().lower() == "none" else raw.strip()
        for kind in (int, float):
            try:
                value = kind(value)
                break
            except (TypeError, ValueError):
                continue
        out[key.strip()] = value
    try:
        CodecConfig.from_options(out)
    except HomAggError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return out


def add_sweep_arguments(parser: argparse.ArgumentParser, timeout: float) -> None:
    """The sweep axes and output options shared by ``bench allreduce`` and ``bench net``."""
    parser.add_argument("--world", type=counts, default=None, help="rank counts (default 2,4,8)")
    parser.add_argument("--numel", type=counts, default=None, help="fp32 elements (default 1M,25M)")
    parser.add_argument("--density", type=_floats, default=None,
                        help="fraction of nonzeros per rank (default 1e-4,1e-3,1e-2,0.1,1.0)")
    parser.add_argument("--schemes", type=_names, default=None, help="homagg schemes (default auto,sketch,compact,dense)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per configuration (default 5)")
    parser.add_argument("--codec", type=codec_options, default={},
                        help="homagg codec options for every scheme, KEY=VALUE,... (e.g. bitmap_levels=1, "
                             "segment=4194304; see homagg.CodecConfig; default: the defaults)")
    parser.add_argument("--baselines", type=_names, default=None,
                        help="gloo backends to run beside homagg: gloo (dense ring, always run: the speedup "
                             "reference), gloo-sparse (sparse COO all_reduce; densities < 1) (default both)")
    parser.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    parser.add_argument("--timeout", type=float, default=timeout,
                        help=f"seconds without a finished call before the ranks count as hung (default {timeout:g})")
    parser.add_argument("--out", default=None, help="folder for records.json, table.md, speedup.png "
                                                    "(default results/bench-<command>-<time>)")
    parser.add_argument("--json", default=None, help="also write the JSON records here")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    add_cpu_load_argument(parser)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of ``homagg bench allreduce`` (each sweep axis: a comma list or one value)."""
    add_sweep_arguments(parser, timeout=300.0)
    parser.add_argument("--quick", action="store_true",
                        help="numel 1M, density 1e-3,1e-2,1.0, world 2,4, schemes auto,dense, 3 repeats")
    parser.add_argument("--isolate", action="store_true", help="fresh rank processes for every configuration")
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_backend", default="gloo", help=argparse.SUPPRESS)
    parser.add_argument("--_scheme", default="", help=argparse.SUPPRESS)
    parser.add_argument("--_codec", default="{}", help=argparse.SUPPRESS)


def _sweep(args: argparse.Namespace) -> dict[str, Any]:
    """Explicit options win over ``--quick``, which wins over the full defaults; validated: a
    :class:`~homagg.ConfigError` names the first option out of range (before anything starts)."""
    base = QUICK if args.quick else FULL
    sweep = {k: getattr(args, k) if getattr(args, k) is not None else base[k] for k in FULL}
    for key in ("world", "numel", "density"):
        if not sweep[key]:
            raise ConfigError(f"--{key}: need at least one value")
    for world in sweep["world"]:  # every sweep runs homagg (--schemes is never empty)
        opt.count("--world", world, 1, MAX_WORKERS, why="homagg's worker bitmap")
    for numel in sweep["numel"]:
        opt.count("--numel", numel)
    for density in sweep["density"]:
        opt.within("--density", density, "(0, 1]")
    opt.count("--repeats", sweep["repeats"], why="medians are reported")
    opt.names("--schemes", sweep["schemes"], SCHEMES)
    opt.names("--baselines", sweep["baselines"], BASELINES)
    opt.seconds("--timeout", args.timeout)
    numel, world = max(sweep["numel"]), max(sweep["world"])  # fp32 inputs: the least the ranks hold at once
    opt.memory("--numel", numel, 4 * numel * world, f"{world} rank(s) holding {numel:,} fp32 elements each")
    sweep["baselines"] = ["gloo"] + [b for b in sweep["baselines"] if b != "gloo"]
    return sweep


def _merge(backend: str, scheme: str | None, world: int, lines: list[dict[str, Any]],
           machine: dict[str, Any]) -> dict[str, Any]:
    """One record from every rank's report of one configuration (``lines[r]`` is rank r's)."""
    first = lines[0]
    calls = len(first["times"])
    slowest = [max(col) for col in zip(*(ln["times"] for ln in lines))]
    same = all(ln["digests"] == first["digests"] for ln in lines)
    numel = int(first["numel"])
    homagg = backend == "homagg"

    def per_call(key: str, combine: Callable[[list[int]], int]) -> float | None:
        values = [ln[key] for ln in lines]
        return None if any(v is None for v in values) else combine(values) / calls

    if backend == "gloo":
        bytes_per: float | None = 2 * (world - 1) / world * 4 * numel
    else:
        bytes_per = per_call("bytes", max)
    # a pipelined call's segments take their rounds concurrently: report rounds per segment
    segments = per_call("segments", max) if homagg else None
    rounds = per_call("rounds", max) if homagg else None
    if rounds is not None and segments:
        rounds /= segments
    def per_rank_sum(key: str) -> list[float] | None:  # per call, the sum over ranks
        if any(ln.get(key) is None for ln in lines):
            return None
        return [float(sum(col)) for col in zip(*(ln[key] for ln in lines))]

    def summed(key: str) -> float | None:  # median over calls of the sum over ranks
        values = per_rank_sum(key)
        return None if values is None else float(statistics.median(values))

    cpu, cpu_user, cpu_sys = median_call_split(per_rank_sum("cpu") or [], per_rank_sum("cpu_user"),
                                               per_rank_sum("cpu_sys"))
    switch_cpu = first.get("switch_cpu")  # rank 0's readings; mean over calls (/proc's 10 ms ticks)

    return {"backend": backend, "scheme": scheme, "numel": numel, "density": float(first["density"]),
            "world": world, "median_s": float(statistics.median(slowest)),
            "rounds_per_allreduce": rounds, "segments_per_allreduce": segments,
            "bytes_per_worker": float(bytes_per if bytes_per is not None else -1.0),
            "speedup_vs_gloo": None, **{k: per_call(k, sum) if homagg else None for k in RETX_KEYS},
            "exact": bool(same and first["within_bound"]), "max_abs_err": float(first["max_abs_err"]),
            "cpu_s_per_call": cpu, "cpu_user_s_per_call": cpu_user, "cpu_sys_s_per_call": cpu_sys,
            "switch_cpu_s_per_call": float(statistics.fmean(switch_cpu)) if switch_cpu else None,
            "faults_per_call": summed("faults"), "times_s": slowest, "repeats": calls,
            # homagg: rank 0's group so far: calls per path (switch, host) and path changes
            "paths": first.get("paths"), "path_transitions": first.get("path_transitions"),
            "load_avg": [round(v, 2) for v in first["load_avg"]], "machine": machine}


def _units(sweep: dict[str, Any], isolate: bool) -> list[tuple[int, str, str | None, list[int], list[float]]]:
    """Launches: (world, backend, scheme, numels, densities); gloo first for every world size.

    ``gloo-sparse`` runs the densities below 1 only (a dense tensor as COO is all overhead)."""
    out = []
    for world in sweep["world"]:
        runs = [(b, None) for b in sweep.get("baselines", ["gloo"])] + [("homagg", s) for s in sweep["schemes"]]
        for backend, scheme in runs:
            densities = [d for d in sweep["density"] if d < 1.0 or backend != "gloo-sparse"]
            if not densities:
                continue
            if isolate:
                out += [(world, backend, scheme, [n], [d]) for n in sweep["numel"] for d in densities]
            else:
                out.append((world, backend, scheme, list(sweep["numel"]), densities))
    return out


def _measure(sweep: dict[str, Any], args: argparse.Namespace, machine: dict[str, Any],
             launch: Callable[..., list[list[str]]] = launch_ranks, title: str = "bench allreduce",
             codec_defaults: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run every launch with a progress bar; return the records (speedups filled in).

    ``launch`` has :func:`~homagg.bench._ranks.launch_ranks`'s signature (``homagg bench net``
    passes one that starts each rank in its network namespace, and ``codec_defaults``: the links'
    rate for ``auto``'s cost model, under the user's ``--codec``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    units = _units(sweep, args.isolate)
    total = sum(len(n) * len(d) for *_, n, d in units)
    records: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(title, total=total)
        for world, backend, scheme, numels, densities in units:
            name = backend if scheme is None else f"homagg/{scheme}"
            bar.update(task, description=f"{name} world={world}")
            codec = {**(codec_defaults or {}), **args.codec} if backend == "homagg" else {}
            cmd = [sys.executable, "-m", "homagg", "bench", "allreduce", "--_worker", "--_backend", backend,
                   "--_scheme", scheme or "", "--numel", ",".join(map(str, numels)),
                   "--density", ",".join(map(repr, densities)), "--repeats", str(sweep["repeats"]),
                   "--seed", str(args.seed), "--timeout", str(args.timeout),
                   "--_codec", json.dumps(codec)]

            def progress(rank: int, line: str) -> None:
                if rank == 0 and RECORD_MARK in line:
                    bar.advance(task)

            outs = launch(cmd, world, label=f"{title} ({name}, world {world})",
                                stall_timeout=args.timeout, on_line=progress)
            reports = [[json.loads(ln.partition(RECORD_MARK)[2]) for ln in rank_lines if RECORD_MARK in ln]
                       for rank_lines in outs]
            short = [r for r, rep in enumerate(reports) if len(rep) != len(numels) * len(densities)]
            if short:
                raise HomAggError(f"bench allreduce ({name}, world {world}): rank {short[0]} reported "
                                  f"{len(reports[short[0]])} of {len(numels) * len(densities)} configurations; "
                                  f"its stdout: {outs[short[0]][-20:]}")
            records += [{**_merge(backend, scheme, world, list(lines), machine), "codec": codec,
                         "cpu_load": args.cpu_load} for lines in zip(*reports)]
    gloo = {(r["numel"], r["density"], r["world"]): r["median_s"] for r in records if r["backend"] == "gloo"}
    for r in records:
        base = gloo.get((r["numel"], r["density"], r["world"]))
        if r["backend"] != "gloo" and base is not None and r["median_s"] > 0:
            r["speedup_vs_gloo"] = base / r["median_s"]
    return records


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def _cpu_cell(r: dict[str, Any]) -> str:
    """The ranks' CPU ms per call as ``total (user+sys)``, e.g. ``233 (151+82)``."""
    total, user, system = (_ms(r.get(k)) for k in ("cpu_s_per_call", "cpu_user_s_per_call", "cpu_sys_s_per_call"))
    if total is None or user is None or system is None:
        return _fmt(total, ".0f")
    return f"{total:.0f} ({user:.0f}+{system:.0f})"


def markdown_table(records: Sequence[dict[str, Any]], limits: bool = False) -> str:
    """One row per record, ordered by numel, world, density, then gloo and the schemes; with
    ``limits``, also each record's ``physical_limit_speedup`` and ``ratio_to_limit``."""
    order = {s: i for i, s in enumerate((*BASELINES, *SCHEMES))}
    rows = sorted(records, key=lambda r: (r["numel"], r["world"], r["density"],
                                          order.get(r["scheme"] or r["backend"], 9)))
    out = ["| numel | world | density | backend | median ms | x gloo | rounds/call | MB/worker | retrans/call | "
           "ranks' CPU ms (user+sys) | switch CPU ms | exact |",
           "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    if limits:
        out = [out[0] + " limit x | of limit |", out[1] + "---:|---:|"]
    for r in rows:
        name = r["backend"] if r["scheme"] is None else f"homagg/{r['scheme']}"
        out.append(f"| {r['numel']:,} | {r['world']} | {r['density']:g} | {name} | {r['median_s'] * 1e3:.1f} | "
                   f"{_fmt(r['speedup_vs_gloo'], '.2f')} | {_fmt(r['rounds_per_allreduce'], '.1f')} | "
                   f"{r['bytes_per_worker'] / 1e6:.3g} | {_fmt(r['retransmits'], '.1f')} | "
                   f"{_cpu_cell(r)} | {_fmt(_ms(r.get('switch_cpu_s_per_call')), '.1f')} | "
                   f"{'yes' if r['exact'] else 'NO'} |"
                   + (f" {_fmt(r.get('physical_limit_speedup'), '.2f')} | {_fmt(r.get('ratio_to_limit'), '.2f')} |"
                      if limits else ""))
    return "\n".join(out)


def _plot(records: Sequence[dict[str, Any]], path: Path) -> None:
    """speedup vs density (log x), one line per scheme, one panel per (numel, world)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numels = sorted({r["numel"] for r in records})
    worlds = sorted({r["world"] for r in records})
    fig, axes = plt.subplots(len(numels), len(worlds), figsize=(4 * len(worlds), 3.2 * len(numels)),
                             squeeze=False, sharey=True)
    for i, numel in enumerate(numels):
        for j, world in enumerate(worlds):
            ax = axes[i][j]
            here = [r for r in records if r["numel"] == numel and r["world"] == world and r["speedup_vs_gloo"]]
            for name in (*BASELINES[1:], *SCHEMES):
                pts = sorted((r["density"], r["speedup_vs_gloo"]) for r in here if (r["scheme"] or r["backend"]) == name)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=name)
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
            ax.set_xscale("log")
            ax.set_title(f"numel {numel:,}, world {world}")
            ax.set_xlabel("density")
            if j == 0:
                ax.set_ylabel("speedup vs gloo")
            if here:
                ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version()}


def run(args: argparse.Namespace) -> int:
    """Run the sweep (or, with the hidden ``--_worker``, one rank of a launch)."""
    if args._worker:
        from ._allreduce_rank import rank_main

        args._numels, args._densities = args.numel, args.density
        args.repeats = args.repeats or FULL["repeats"]
        return rank_main(args)
    sweep = _sweep(args)
    out_dir = out_folder(args.out, "allreduce")
    machine = _machine()
    started = time.monotonic()
    with BackgroundLoad(args.cpu_load):
        records = _measure(sweep, args, machine)
    report = {"benchmark": "allreduce", "sweep": sweep, "machine": machine, "cpu_load": args.cpu_load,
              "wall_s": round(time.monotonic() - started, 1), "records": records}
    header = (f"machine: {machine['platform']}, {machine['cpus']} cpus; {load_range(records)}; "
              f"{describe_load(args.cpu_load)}; {sweep['repeats']} repeats, medians of the slowest rank; "
              f"wall {report['wall_s']} s")
    write_report(out_dir, report, header, markdown_table(records), json_copy=args.json, no_plot=args.no_plot,
                 plots=[("speedup.png", lambda path: _plot(records, path))], command="bench allreduce")
    inexact = [r for r in records if r["backend"] == "homagg" and not r["exact"]]
    if inexact:
        print(f"bench allreduce: {len(inexact)} homagg result(s) NOT exact", file=sys.stderr)
        return 1
    return 0
