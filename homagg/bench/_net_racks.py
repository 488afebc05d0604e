"""``homagg bench net --racks R[,R...]``: all_reduce across racks, the tree vs the star vs gloo's ring.

Per rack count R, one :class:`~homagg.bench._racknet.RackNet` (R leaves of ``--rack-size`` workers
under one spine; worker links ``--bw``, uplinks ``--uplink-bw``, default ``--bw``) and, on identical
tensors in the same run (:mod:`homagg.bench._racks_rank`):

* ``gloo-ring``: gloo's all_reduce between the worker hosts (``topology`` ``ring``);
* ``homagg`` ``tree``: every leaf's emulator aggregates its rack, the spine's root the leaves;
* ``homagg`` ``star``: one emulator at the spine aggregates every worker (the leaves only forward:
  every worker's stream crosses its uplink, both ways), per scheme.

Each record is ``bench allreduce``'s (the time is the slowest rank's, median over repeats; ``exact``:
bit-identical on every rank and within the bound of the float64 sum) plus ``method``, ``topology``,
``racks``, ``rack_size``, ``bw_mbit``, ``uplink_bw_mbit``, ``oversubscription`` (a rack's worker
links over its uplink), ``mtu``, ``n_slots`` (the job's slots at every switch: each rank's send
window; ``HOMAGG_SLOTS``, default 64), ``replication`` (how the arrangement's switches reach their
members: the star and the root unicast, the leaves ``--replication``), ``engine`` (what the
arrangement's emulators ran, from their status: ``python``, ``native``, or e.g. ``native+python``),
``uplink_bytes_per_call`` (per rack ``{"up": towards the spine, "down": from it}``, counted at its
leaf's uplink interface, mean over the timed calls), ``uplink_streams`` (the busiest uplink
direction's bytes over one worker's bytes per call: about ``rack_size`` for the star, 1 for the
tree) and ``speedup_vs_star`` (tree records: the star's median time of the same scheme over the
tree's), ``result_digest`` (blake2b of rank 0's last result: the tree's and the star's of one
scheme must be equal, bit for bit).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from .. import _options as opt
from .._errors import ConfigError, HomAggError
from ..wire import MAX_WORKERS, words_for_mtu
from ._allreduce import _cpu_cell, _fmt, _machine, _merge, _ms, _names, _sweep
from ._load import BackgroundLoad, describe_load
from ._netns import require_root
from ._racknet import RackNet
from ._ranks import RECORD_MARK
from ._report import counts, load_range, out_folder, write_report

__all__ = ["add_racks_arguments", "run_racks", "TOPOLOGIES"]

TOPOLOGIES = ("tree", "star")  #: homagg's arrangements; gloo's records say ``ring``
RACK_SIZE = 4  #: default workers per rack


def add_racks_arguments(parser: argparse.ArgumentParser) -> None:
    """``--racks``, ``--rack-size``, ``--uplink-bw``, ``--topologies``, ``--engine``."""
    parser.add_argument("--racks", default=None, type=counts,
                        help="two tiers: R racks (leaf switch hosts) under one spine, a comma list to sweep; "
                             "compares the tree, the star at the spine and gloo's ring (world = R x --rack-size)")
    parser.add_argument("--rack-size", type=int, default=RACK_SIZE,
                        help=f"--racks: worker hosts per rack (default {RACK_SIZE})")
    parser.add_argument("--uplink-bw", type=float, default=None,
                        help="--racks: each leaf's uplink rate in Mbit/s, both ways (default: --bw; "
                             "oversubscription = rack size x bw / uplink bw)")
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES), type=_names,
                        help="--racks: homagg's arrangements to run (default tree,star)")
    parser.add_argument("--engine", default="auto", choices=("auto", "python", "native"),
                        help="--racks: the emulators' engine (default auto: native where built; the tree's "
                             "emulators run python where the native engine has no tree roles)")


def _check(args: argparse.Namespace) -> tuple[list[int], dict[str, Any]]:
    """The rack counts and the sweep; :class:`ConfigError` naming the first bad option."""
    if args.world is not None:
        raise ConfigError("--world: with --racks the world size is --racks x --rack-size; leave --world out")
    if not args.racks:
        raise ConfigError("--racks: need at least one value")
    opt.count("--rack-size", args.rack_size, 1, MAX_WORKERS, why="workers per leaf: its worker bitmap")
    for racks in args.racks:
        opt.count("--racks", racks, 1, MAX_WORKERS, why="leaves per root: its worker bitmap")
        if racks * args.rack_size > 250:
            raise ConfigError(f"--racks: {racks} racks of {args.rack_size} is over 250 worker hosts")
    if args.uplink_bw is not None:
        opt.positive("--uplink-bw", args.uplink_bw, "Mbit/s")
    opt.names("--topologies", args.topologies, TOPOLOGIES)
    if not args.topologies:
        raise ConfigError("--topologies: need at least one of tree, star")
    if set(args.baselines or ()) - {"gloo"}:
        raise ConfigError("--baselines: with --racks only gloo (its ring) runs beside homagg")
    args.world = [r * args.rack_size for r in args.racks]
    args.baselines = ["gloo"]
    return list(args.racks), _sweep(args)


def _units(sweep: dict[str, Any], topologies: list[str]) -> list[tuple[str, str | None, str | None]]:
    """(method, topology, scheme) launches: gloo first, then each scheme in every topology."""
    return [("gloo", None, None)] + [("homagg", t, s) for s in sweep["schemes"] for t in topologies]


def _rack_fields(r: dict[str, Any], line0: dict[str, Any], net: RackNet, topology: str | None,
                 n_slots: int) -> dict[str, Any]:
    """What a record of ``bench net --racks`` adds to ``bench allreduce``'s (from rank 0's line)."""
    moved = line0.get("traffic") or {}
    per_rack = [{"up": moved.get(f"{k}.up"), "down": moved.get(f"{k}.down")} for k in range(net.racks)]
    busiest = max((v for v in moved.values()), default=None)
    worker = r["bytes_per_worker"]
    engines = line0.get("engines")
    return {"method": "gloo-ring" if r["backend"] == "gloo" else "homagg", "topology": topology or "ring",
            "racks": net.racks, "rack_size": net.rack_size, "bw_mbit": net.bw_mbit,
            "uplink_bw_mbit": net.uplink_bw_mbit, "oversubscription": net.oversubscription, "mtu": net.mtu,
            "n_slots": None if topology is None else n_slots,
            "replication": None if topology is None else "unicast" if topology == "star"
            else f"{net.replication} at the leaves, unicast at the root",
            "engine": "+".join(sorted(set(engines))) if engines else None,
            "uplink_bytes_per_call": per_rack,
            "uplink_streams": busiest / worker if busiest is not None and worker > 0 else None,
            "speedup_vs_star": None, "result_digest": line0["digests"][-1]}


def _speedups(records: list[dict[str, Any]]) -> None:
    """``speedup_vs_gloo`` (every non-gloo record) and ``speedup_vs_star`` (tree records), in place."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["numel"], r["density"], r["world"], r["bw_mbit"], r["uplink_bw_mbit"]

    gloo = {key(r): r["median_s"] for r in records if r["backend"] == "gloo"}
    star = {(key(r), r["scheme"]): r["median_s"] for r in records if r["topology"] == "star"}
    for r in records:
        if r["backend"] != "gloo" and key(r) in gloo and r["median_s"] > 0:
            r["speedup_vs_gloo"] = gloo[key(r)] / r["median_s"]
        if r["topology"] == "tree" and (key(r), r["scheme"]) in star and r["median_s"] > 0:
            r["speedup_vs_star"] = star[(key(r), r["scheme"])] / r["median_s"]


def _measure(net: RackNet, sweep: dict[str, Any], args: argparse.Namespace,
             machine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every launch on ``net``: its records (speedups not yet filled in)."""
    records: list[dict[str, Any]] = []
    words = words_for_mtu(net.mtu)
    for method, topology, scheme in _units(sweep, args.topologies):
        name = "gloo ring" if topology is None else f"homagg/{scheme} {topology}"
        codec = {"bandwidth_gbps": net.bw_mbit / 1000, **args.codec} if method == "homagg" else {}
        cfg = {"method": method, "topology": topology, "scheme": scheme, "codec": codec, "world": net.world,
               "racks": net.racks, "numels": sweep["numel"], "densities": sweep["density"],
               "repeats": sweep["repeats"], "seed": args.seed, "timeout": args.timeout,
               "switches": net.switches.to_dict(), "switch_pids": net.emulator_pids(topology or "star"),
               "uplinks": [list(u) for u in net.uplinks()], "words_per_packet": words,
               "n_slots": int(net.rank_env(0)["HOMAGG_SLOTS"])}
        print(f"bench net --racks: {name}, {net.racks} racks x {net.rack_size}", file=sys.stderr, flush=True)
        outs = net.launch([sys.executable, "-m", "homagg.bench._racks_rank", json.dumps(cfg)], net.world,
                          label=f"bench net ({name}, {net.racks} racks x {net.rack_size})",
                          stall_timeout=args.timeout)
        reports = [[json.loads(ln.partition(RECORD_MARK)[2]) for ln in rank_lines if RECORD_MARK in ln]
                   for rank_lines in outs]
        want = len(sweep["numel"]) * len(sweep["density"])
        short = [r for r, rep in enumerate(reports) if len(rep) != want]
        if short:
            raise HomAggError(f"bench net ({name}): rank {short[0]} reported {len(reports[short[0]])} of {want} "
                              f"configurations; its stdout: {outs[short[0]][-20:]}")
        for lines in zip(*reports):
            r = {**_merge(method, scheme, net.world, list(lines), machine), "codec": codec, "cpu_load": args.cpu_load}
            records.append({**r, **_rack_fields(r, lines[0], net, topology, cfg["n_slots"])})
    return records


def markdown_racks(records: list[dict[str, Any]]) -> str:
    """One row per record: time, speedups, bytes per uplink per call (mean over racks), the ranks' and
    the arrangement's emulators' CPU per call, exactness."""
    rows = sorted(records, key=lambda r: (r["racks"], r["numel"], r["density"], r["topology"] != "ring",
                                          r["scheme"] or "", r["topology"]))
    out = ["| racks x size | numel | density | method | topology | engine | median ms | x gloo | x star | "
           "uplink MB up/down per call | streams/uplink | ranks' CPU ms (user+sys) | switches' CPU ms | exact |",
           "|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]

    def mb(side: str, r: dict[str, Any]) -> str:
        values = [u[side] for u in r["uplink_bytes_per_call"] if u[side] is not None]
        return f"{statistics.fmean(values) / 1e6:.3g}" if values else "-"

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for r in rows:
        name = r["method"] if r["scheme"] is None else f"homagg/{r['scheme']}"
        out.append(f"| {r['racks']} x {r['rack_size']} | {r['numel']:,} | {r['density']:g} | {name} | "
                   f"{r['topology']} | {r['engine'] or '-'} | {r['median_s'] * 1e3:.1f} | {fmt(r['speedup_vs_gloo'])} | "
                   f"{fmt(r['speedup_vs_star'])} | {mb('up', r)} / {mb('down', r)} | {fmt(r['uplink_streams'])} | "
                   f"{_cpu_cell(r)} | {_fmt(_ms(r['switch_cpu_s_per_call']), '.0f')} | "
                   f"{'yes' if r['exact'] else 'NO'} |")
    return "\n".join(out)


def run_racks(args: argparse.Namespace, bws: list[float]) -> int:
    """The sweep over ``bws`` x ``--racks``; exit 0, or :class:`HomAggError` if a result was not exact."""
    racks_list, sweep = _check(args)
    require_root()
    out_dir = out_folder(args.out, "net")
    machine = _machine()
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    with BackgroundLoad(args.cpu_load):
        for bw in bws:
            for racks in racks_list:
                one = {**sweep, "world": [racks * args.rack_size]}
                with RackNet(racks, args.rack_size, bw, args.uplink_bw or bw, args.mtu, args.replication,
                             args.engine) as net:
                    records += _measure(net, one, args, machine)
    _speedups(records)
    links = (f"two tiers: racks of {args.rack_size} under one spine; tc tbf rate per direction on every worker "
             f"link (--bw) and uplink (--uplink-bw: {args.uplink_bw or 'as --bw'}), MTU {args.mtu} "
             f"({words_for_mtu(args.mtu)} words per homagg datagram); no delay or loss; leaves' results by "
             f"{args.replication}, the spine's by unicast")
    report = {"benchmark": "net", "racks": racks_list, "rack_size": args.rack_size, "links": links, "mtu": args.mtu,
              "replication": args.replication, "bw_mbit": bws, "uplink_bw_mbit": args.uplink_bw, "sweep": sweep,
              "machine": machine, "codec": args.codec, "cpu_load": args.cpu_load,
              "wall_s": round(time.monotonic() - started, 1), "records": records}
    header = (f"machine: {machine['platform']}, {machine['cpus']} cpus; {load_range(records)}; "
              f"{describe_load(args.cpu_load)}; {sweep['repeats']} repeats, medians of the slowest rank; "
              f"links: {links}; wall {report['wall_s']} s")
    tables = [f"### {bw:g} Mbit/s worker links\n\n" + markdown_racks([r for r in records if r["bw_mbit"] == bw])
              for bw in bws]
    write_report(out_dir, report, header, "\n\n".join(tables), json_copy=args.json, no_plot=True,
                 command="bench net --racks")
    if not all(r["exact"] for r in records):
        raise HomAggError("bench net --racks: a result was not exact (see records.json)")
    return 0
