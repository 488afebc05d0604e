"""``homagg bench net``: all_reduce on bandwidth-limited links, homagg through a switch host vs gloo's ring.

W worker hosts and one switch host in network namespaces (:class:`~homagg.bench._netns.StarNet`),
every link shaped with ``tc tbf`` to ``--bw`` Mbit/s.  On identical tensors, in the same run:
gloo's ring all_reduce between the worker hosts (routed through the switch host), gloo's
all_reduce of the same data as a sparse COO tensor (what torch offers for sparse gradients; an
all-gather of indices and values, densities below 1 only), and homagg through the emulator on
the switch host (its native engine where built), every scheme (dense = SwitchML-style in-network
aggregation).  The ranks send runs of equal-length datagrams as UDP GSO messages
(``HOMAGG_UDP_GSO``, default 1 here; ``HOMAGG_UDP_GSO=0`` measures without).  The ranks are those of ``homagg bench allreduce`` (same inputs, same exactness
check), started inside the namespaces.

Each record adds to ``homagg bench allreduce``'s: ``method`` (``gloo-ring`` / ``gloo-sparse`` /
``homagg``), ``bw_mbit``, ``mtu`` (the links' MTU; a homagg datagram fills one frame, so a larger
MTU means fewer datagrams for the emulator and the ranks to handle), ``replication``
(``multicast``: the emulator sends each result once to the job's group and the switch host's
bridge copies it to every link, as a switch's multicast group does; ``unicast``: one send per
worker; the links carry the same bytes either way), ``physical_limit_speedup``
(ring bytes per worker / this method's bytes per worker) and ``ratio_to_limit``
(``speedup_vs_gloo / physical_limit_speedup``); ``switch_cpu_s_per_call`` is the emulator's on
the switch host (its process, started here; null for the gloo methods).  ``--cpu-load N`` runs N
busy processes at nice 19 on the host meanwhile (:mod:`homagg.bench._load`).  Needs root; without it
the command says what it needs and exits non-zero (no loopback fallback).  Links have no delay or
loss (this kernel has no ``netem``): the comparison is about bandwidth only.

Output folder: ``records.json``, ``table.md`` and ``speedup-w<W>.png`` per world size (speedup
vs density, one panel per (bandwidth, numel), each method's physical-limit speedup dotted in
its colour).

``--racks R[,R...]`` runs two tiers instead (:mod:`homagg.bench._net_racks`): R racks of
``--rack-size`` workers under a spine, uplinks shaped to ``--uplink-bw``; the aggregation tree
(an emulator at every leaf and a root at the spine) vs one emulator at the spine (the star) vs
gloo's ring, with the bytes crossing each uplink per call.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import _options as opt
from .._errors import HomAggError
from ._allreduce import _floats, _machine, _measure, _sweep, add_sweep_arguments, markdown_table
from ..transport._sockets import gso_env
from ..wire import words_for_mtu
from ._load import BackgroundLoad, describe_load
from ._net_racks import add_racks_arguments, run_racks
from ._netns import MAX_MTU, MTU, REPLICATIONS, StarNet, require_root
from ._report import load_range, out_folder, write_report

__all__ = ["configure_parser", "run", "plot_net", "METHODS"]

QUICK = {"world": [2], "numel": [1_000_000], "density": [0.01, 1.0], "schemes": ["auto", "dense"], "repeats": 3}
METHODS = {"gloo": "gloo-ring", "gloo-sparse": "gloo-sparse", "homagg": "homagg"}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options (each sweep axis: a comma list or one value)."""
    parser.add_argument("--bw", type=_floats, default=None, help="link rate in Mbit/s (default 100,1000,10000)")
    parser.add_argument("--mtu", type=int, default=MTU,
                        help=f"link MTU in bytes; a homagg datagram fills one frame (default {MTU}: jumbo Ethernet; "
                             f"up to {MAX_MTU})")
    add_replication_argument(parser)
    add_sweep_arguments(parser, timeout=600.0)
    parser.add_argument("--quick", action="store_true",
                        help="1 Gbit/s, 2 hosts, numel 1M, density 0.01 and 1.0, schemes auto,dense, 3 repeats "
                             "(with --racks: the hosts of the racks)")
    add_racks_arguments(parser)
    parser.set_defaults(isolate=False)


def add_replication_argument(parser: argparse.ArgumentParser) -> None:
    """``--replication {multicast,unicast}`` (shared with ``bench models``)."""
    parser.add_argument("--replication", choices=REPLICATIONS, default=REPLICATIONS[0],
                        help="how the emulator gets a result to the W workers: multicast = one send to the "
                             "job's group, copied to every link by the switch host's bridge (as a P4 switch's "
                             "multicast group); unicast = one send per worker (default multicast)")


def _gso_on() -> bool:
    """Whether the ranks send UDP GSO messages (``HOMAGG_UDP_GSO``, which :class:`StarNet` sets to 1
    unless it is set: see homagg/transport/_fastpath.py)."""
    return gso_env() is not False


def _with_limits(record: dict[str, Any], bw: float, mtu: int, replication: str) -> dict[str, Any]:
    ring = 2 * (record["world"] - 1) / record["world"] * 4 * record["numel"]
    limit = ring / record["bytes_per_worker"] if record["bytes_per_worker"] > 0 else None
    speedup = record["speedup_vs_gloo"]
    return {**record, "method": METHODS[record["backend"]], "bw_mbit": bw, "mtu": mtu,
            "replication": replication, "physical_limit_speedup": limit,
            "ratio_to_limit": speedup / limit if speedup is not None and limit else None}


def plot_net(records: Sequence[dict[str, Any]], path: Path) -> None:
    """Speedup vs density (log-log), one panel per (bandwidth, numel); one colour per method/scheme,
    its measured speedup solid and its physical-limit speedup (ring bytes / its bytes) dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bws = sorted({r["bw_mbit"] for r in records})
    numels = sorted({r["numel"] for r in records})
    fig, axes = plt.subplots(len(bws), len(numels), figsize=(4.5 * len(numels), 3.4 * len(bws)), squeeze=False)
    for i, bw in enumerate(bws):
        for j, numel in enumerate(numels):
            ax = axes[i][j]
            here = [r for r in records if r["bw_mbit"] == bw and r["numel"] == numel and r["backend"] != "gloo"]
            names = sorted({r["scheme"] or r["backend"] for r in here})
            for k, name in enumerate(names):
                mine = sorted((r for r in here if (r["scheme"] or r["backend"]) == name), key=lambda r: r["density"])
                color = f"C{k}"
                pts = [(r["density"], r["speedup_vs_gloo"]) for r in mine if r["speedup_vs_gloo"]]
                limit = [(r["density"], r["physical_limit_speedup"]) for r in mine if r["physical_limit_speedup"]]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=color, label=name)
                if limit:
                    ax.plot(*zip(*limit), linestyle=":", color=color, linewidth=1)
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{bw:g} Mbit/s, numel {numel:,}, world {records[0]['world'] if records else '?'}",
                         fontsize="small")
            ax.set_xlabel("density")
            ax.set_ylabel("speedup vs gloo ring (dotted: physical limit)", fontsize="small")
            if here:
                ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.quick:
        for key, value in QUICK.items():
            if getattr(args, key) is None and not (key == "world" and args.racks is not None):
                setattr(args, key, value)
        args.bw = args.bw or [1000.0]
    bws = args.bw or [100.0, 1000.0, 10000.0]
    for bw in bws:
        opt.positive("--bw", bw, "Mbit/s")
    opt.count("--mtu", args.mtu, 1280, MAX_MTU, why="bytes")
    if args.racks is not None:
        return run_racks(args, bws)
    sweep = _sweep(args)
    require_root()
    out_dir = out_folder(args.out, "net")
    machine = _machine()
    started = time.monotonic()
    records: list[dict[str, Any]] = []
    with BackgroundLoad(args.cpu_load):
        for bw in bws:
            for world in sweep["world"]:
                with StarNet(world, bw, args.mtu, args.replication) as net:
                    one = {**sweep, "world": [world]}
                    found = _measure(one, args, machine, launch=net.launch, title=f"bench net {bw:g} Mbit/s",
                                     codec_defaults={"bandwidth_gbps": bw / 1000})
                records += [_with_limits(r, bw, args.mtu, args.replication) for r in found]
    links = (f"tc tbf rate per direction, MTU {args.mtu} ({words_for_mtu(args.mtu)} words per homagg datagram); "
             f"no delay or loss (no netem here); results by {args.replication}; "
             f"worker sends as UDP GSO: {_gso_on()}")
    report = {"benchmark": "net", "links": links, "mtu": args.mtu, "replication": args.replication,
              "bw_mbit": bws, "sweep": sweep, "machine": machine, "codec": args.codec, "cpu_load": args.cpu_load,
              "wall_s": round(time.monotonic() - started, 1), "records": records}
    codec = ", ".join(["bandwidth_gbps = the links' rate (auto's cost model)"]
                      + [f"{k}={v}" for k, v in args.codec.items()])
    header = (f"machine: {machine['platform']}, {machine['cpus']} cpus; {load_range(records)}; "
              f"{describe_load(args.cpu_load)}; "
              f"{sweep['repeats']} repeats, medians of the slowest rank; links: {links}; homagg codec: {codec}; "
              f"wall {report['wall_s']} s")
    lines = []
    for bw in bws:
        lines += [f"### {bw:g} Mbit/s links, MTU {args.mtu}, results by {args.replication}", "", markdown_table([r for r in records if r["bw_mbit"] == bw], limits=True), ""]
    plots = [(f"speedup-w{w}.png", lambda path, w=w: plot_net([r for r in records if r["world"] == w], path))
             for w in sweep["world"]]
    write_report(out_dir, report, header, "\n".join(lines), json_copy=args.json, no_plot=args.no_plot, plots=plots,
                 command="bench net")
    if not all(r["exact"] for r in records):
        raise HomAggError("bench net: a result was not exact (see records.json)")
    return 0
