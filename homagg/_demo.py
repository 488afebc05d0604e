"""``homagg demo``: a real aggregation — emulator on loopback, W worker processes, every scheme.

Each worker holds realistic gradients (:func:`homagg.testing.gradients`: a row-sparse embedding gradient at
``--density``, an element-sparse layer, a dense layer, a bias, an int64 counter), runs
``homagg.allreduce`` over UDP through the switch for every scheme, and reports digests.  The
parent checks every worker's result: bit-identical across workers and schemes, within the
fixed-point bound of the float64 oracle (integers: exactly equal), then prints a table
(:func:`homagg.testing.verify_udp_results`).  ``--json PATH`` also writes the verdicts, the switch
counters (packets, drops, injected drops) and the workers' retransmissions.  Exit status 0 only if
everything is exact.
"""

from __future__ import annotations

import argparse
import json

from . import _options as opt
from .codec._config import SCHEMES
from ._errors import ConfigError
from .testing import UdpJobConfig, gradients, run_udp_job, verify_udp_results
from .wire import MAX_SLOTS, MAX_WORDS_JUMBO, MAX_WORKERS, P4_WORDS

__all__ = ["configure_parser", "run"]

def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4, help=f"worker processes, 1..{MAX_WORKERS} (default 4)")
    p.add_argument("--numel", type=int, default=1_000_000, help="elements per worker, all tensors together")
    p.add_argument("--density", type=float, default=0.01, help="fraction of embedding rows with a gradient")
    p.add_argument("--drop", type=float, default=0.0, help="loss rate injected at the emulator")
    p.add_argument("--switch", help="HOST:PORT of an external switch instead of the embedded emulator")
    p.add_argument("--control", help="HOST:PORT of the external switch's control port (default: port + 1)")
    p.add_argument("--words-per-packet", type=int,
                   help=f"K, 1..{MAX_WORDS_JUMBO} (default 2048 with the emulator, {P4_WORDS} external)")
    p.add_argument("--slots", type=int, default=64, help=f"slots (window) of the job, 1..{MAX_SLOTS} (default 64)")
    p.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated schemes to run")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds without progress before a worker fails")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write the verdicts and counters as JSON")


def check_args(args: argparse.Namespace, schemes: list[str]) -> None:
    """:class:`ConfigError` naming the first option outside what it accepts (before anything starts)."""
    from switch_emulator.faults import FaultConfig

    opt.count("--workers", args.workers, 1, MAX_WORKERS)
    opt.count("--numel", args.numel)
    opt.within("--density", args.density, "(0, 1]")
    opt.names("--schemes", schemes, SCHEMES, args.schemes)
    if args.words_per_packet is not None:
        opt.count("--words-per-packet", args.words_per_packet, 1, MAX_WORDS_JUMBO)
    opt.count("--slots", args.slots, 1, MAX_SLOTS)
    opt.seconds("--timeout", args.timeout)
    try:
        FaultConfig(drop=args.drop)
    except ConfigError as exc:
        raise ConfigError(f"--drop {args.drop:g}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """``homagg demo``: returns the exit status (0 iff every scheme's results are exact)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    import switch_emulator

    from .bench._report import print_table

    from .transport import ControlClient, parse_addr
    from .transport._auth import resolve_secret

    console = Console()
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    check_args(args, schemes)
    sw = None
    if args.switch:
        data = parse_addr(args.switch)
        ctl_addr = parse_addr(args.control) if args.control else (data[0], data[1] + 1)
        k = P4_WORDS if args.words_per_packet is None else args.words_per_packet
    else:
        with console.status("starting the switch emulator on loopback"):
            sw = switch_emulator.spawn(drop=args.drop, seed=args.seed)
        data, ctl_addr = sw.data_addr, sw.control_addr
        k = 2048 if args.words_per_packet is None else args.words_per_packet
    try:
        ctl = ControlClient(ctl_addr)
        job = ctl.admit(args.workers, n_slots=args.slots, words_per_packet=k)
        console.print(f"switch {data[0]}:{data[1]} (control {ctl_addr[0]}:{ctl_addr[1]}), job {job.job_id}: "
                      f"{args.workers} workers, slots {job.slot_base}..{job.slot_base + job.n_slots - 1}, K={k}"
                      + (f", injected loss {args.drop:.1%}" if args.drop else ""))
        cfg = UdpJobConfig(numel=args.numel, density=args.density, seed=args.seed, data=list(data),
                           control=list(ctl_addr), job=job.to_dict(), timeout=args.timeout, schemes=schemes)
        secret = sw.secret if sw is not None else resolve_secret(tuple(ctl_addr))  # external: $HOMAGG_SWITCH_SECRET...
        if secret:
            cfg["secret"] = secret  # the worker processes register with it
        with Progress(console=console, transient=True) as prog:
            task = prog.add_task("allreduce (workers x schemes)", total=args.workers * len(schemes))
            results = run_udp_job(cfg, args.workers, lambda r, s: prog.advance(task),
                                  timeout=args.timeout * 4 * len(schemes) + 60)
        status = ctl.status()["counters"]
        ctl.remove(job.job_id)
        ctl.close()
    finally:
        if sw is not None:
            sw.stop()
    failed = [r for r in results if not isinstance(r, dict)]
    for f in failed:
        console.print(f"[red]worker {f.rank}: {f.type}: {f.message}[/red]")
    verdicts = [] if failed else verify_udp_results(results, cfg, args.workers)
    all_ok = not failed and all(v.ok for v in verdicts)
    logical = sum(t.numel() * t.element_size() for t in gradients(0, args.numel, args.density, args.seed))
    table = Table(title=f"homagg demo: {args.workers} workers, {logical / 1e6:.2f} MB of gradients per worker")
    for col in ("scheme", "bytes/worker", "time (s)", "goodput (Gbit/s)", "exact"):
        table.add_column(col, justify="right" if col != "scheme" else "left")
    for v in verdicts:
        table.add_row(v.scheme, f"{v.bytes:,}", f"{v.time:.3f}", f"{logical * 8 / v.time / 1e9:.3f}",
                      "[green]yes[/green]" if v.ok else f"[red]NO[/red] ({'; '.join(v.problems)})")
    if verdicts:
        print_table(console, table)
    injected = status.get("drop_injected", 0) + status.get("drop_injected_egress", 0)
    retx = sum(r["port_stats"]["retransmits"] for r in results if isinstance(r, dict))
    console.print(f"switch: {status['rx']} packets in, {status['tx']} out, {status['dropped']} dropped "
                  f"({injected} injected); workers retransmitted {retx}")
    console.print("[green]all results exact[/green]" if all_ok else "[red]results NOT exact[/red]")
    if args.json:
        summary = {"ok": all_ok, "workers": args.workers, "failures": [f"{f.rank}: {f.type}" for f in failed],
                   "schemes": {v.scheme: {"ok": v.ok, "problems": v.problems, "bytes": v.bytes, "time": v.time,
                                          "digests": sorted({r[v.scheme]["digest"] for r in results})}
                               for v in verdicts},
                   "switch": {"rx": status["rx"], "tx": status["tx"], "dropped": status["dropped"],
                              "injected_drops": injected},
                   "retransmits": retx}
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    return 0 if all_ok else 1
