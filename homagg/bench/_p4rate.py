"""``homagg bench p4rate``: BMv2's loss-free packet rate on homagg.p4 (ports as pcap files).

A job of 3 workers sends full 32-word ADD rounds: 3 worker packets in and 3 results out per
round.  The frames enter port 1 of ``simple_switch_grpc --use-files``
(:class:`homagg.p4._pcap_switch.PcapSwitch`), configured by :class:`homagg.p4.Controller`.

BMv2 drops silently once an egress queue (64 packets) is full, and its pcap writer flushes every
result to disk, so frames offered all at once overflow the queues (the first version of this
benchmark lost ~3% of the results that way).  So, as RFC 2544 measures a device's throughput,
the input is an offered-load *staircase*: ``--rounds`` rounds at each rate of ``--rates`` (worker
packets/s, paced by the pcap stamps, which BMv2's file reader replays), steps separated by an idle
gap that drains the queues.  Per step: results received, lost, and the achieved rate (packets in /
time between the step's first and last result).  **Throughput** = the highest rate achieved
(at most the offered one) in a step that, like every slower one, lost nothing.  Every result that arrives is checked against
the sum of the workers' words (a wrong one is a :class:`~homagg.ProtocolError`, never a loss).

Needs the BMv2 tools (``p4c-bm2-ss``, ``simple_switch_grpc``) on PATH, and the ``p4`` and
``test`` extras (grpcio/p4runtime, scapy): without them the command says what is missing and
exits non-zero (``homagg: error: ConfigError: ...``, exit status 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import _options as opt
from .. import wire
from .._errors import ConfigError, ProtocolError
from ..jobs import JobSpec, WorkerAddr

__all__ = ["configure_parser", "run", "measure", "rate_job", "rate_sequence", "staircase", "missing_requirements"]

SERVICE_IP, SERVICE_MAC = "10.0.0.254", "02:48:41:00:00:fe"
WORDS = list(range(wire.P4_WORDS))
#: offered worker packets/s per step (the default staircase)
RATES = (2000, 4000, 8000, 12000, 16000, 24000, 32000, 48000, 64000)
GAP_S = 0.5  #: idle time between steps (the queues drain)


def rate_job() -> JobSpec:
    """The measured job: 3 workers (``10.0.0.1..3``, ports 40000..40002, switch ports 1..3), 2 slots."""
    workers = tuple(WorkerAddr(w, f"10.0.0.{w + 1}", 40000 + w) for w in range(3))
    return JobSpec(1, 3, slot_base=0, n_slots=2, words_per_packet=wire.P4_WORDS, workers=workers).validate()


def _mac(worker_id: int) -> str:
    return f"02:48:41:00:00:{worker_id + 1:02x}"


def rate_sequence(rounds: int) -> list[tuple[tuple[str, int], bytes]]:
    """Full ``P4_WORDS``-word ADD rounds of :func:`rate_job`: ``[(source, datagram), ...]``."""
    j = rate_job()
    out = []
    for g in range(rounds):
        slot, bank = j.slot_base + g % j.n_slots, (g // j.n_slots) % 2
        for w in j.workers:
            h = wire.Header(wire.VERSION, wire.OP_ADD, 0, j.job_id, w.worker_id, wire.P4_WORDS, bank, slot,
                            g & 0xFFFF, wire.P4_WORDS * g)
            out.append((w.addr, wire.pack_packet(h, WORDS)))
    return out


def missing_requirements() -> list[str]:
    """What this benchmark needs and does not find: tools on PATH, Python packages."""
    from ..p4._pcap_switch import missing_tools

    missing = [f"{t} (not on PATH)" for t in missing_tools()]
    for module, extra in (("grpc", "p4"), ("p4.v1", "p4"), ("scapy", "test")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(f"Python module {module} (pip install 'homagg[{extra}]')")
    return missing


def staircase(rounds: int, rates: tuple[int, ...]) -> list[float]:
    """The send time (s) of each round: ``rounds`` rounds per step at ``rates`` packets/s."""
    out, t = [], 0.0
    for rate in rates:
        dt = 3 / rate  # 3 worker packets per round
        out += [t + i * dt for i in range(rounds)]
        t += rounds * dt + GAP_S
    return out


def measure(rounds: int, rates: tuple[int, ...] = RATES, *, bmv2_args: tuple[str, ...] = ("--log-level", "off"),
            grpc_port: int = 50561, folder: Path | None = None) -> dict[str, Any]:
    """One run of the staircase: build, start BMv2 on pcap files, configure, collect, check."""
    from ..p4 import Controller, SwitchConfig
    from ..p4._build import build
    from ..p4._pcap_switch import PcapSwitch, udp_frame

    j = rate_job()
    seq = rate_sequence(rounds * len(rates))
    when = staircase(rounds, rates)
    hosts = [{"ip": w.ip, "mac": _mac(w.worker_id), "port": w.worker_id + 1} for w in j.workers]
    frames = [udp_frame(src, _mac(int(src[0].rsplit(".", 1)[1]) - 1), (SERVICE_IP, wire.HOMAGG_UDP_PORT),
                        SERVICE_MAC, dg) for src, dg in seq]
    stamps = [when[i // 3] for i in range(len(frames))]
    with tempfile.TemporaryDirectory(prefix="homagg-p4rate-") as tmp:
        work = folder or Path(tmp)
        built = build(work / "build")
        cfg = SwitchConfig.from_dict({"name": "s1", "grpc": f"127.0.0.1:{grpc_port}", "service_ip": SERVICE_IP,
                                      "service_mac": SERVICE_MAC, "ports": [1, 2, 3], "hosts": hosts})
        with PcapSwitch(work, [1, 2, 3], {1: frames}, stamps={1: stamps}, grpc_port=grpc_port,
                        bmv2_args=bmv2_args, start_delay_s=8) as sw:
            with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=10) as ctl:
                ctl.push()
                ctl.configure(cfg)
                ctl.add_job(cfg, j)
                sw.wait_for(len(seq), timeout=8 + when[-1] + 30)  # 3 results per round of 3
                time.sleep(1.0)
        out = {p: sw.output(p) for p in (1, 2, 3)}
    steps = _steps(out, rounds, rates)
    ok = 0
    for st in steps:
        if st["lost"]:
            break
        ok = max(ok, min(st["offered_packets_per_s"], st["achieved_packets_per_s"] or 0))
    if not ok:
        raise ProtocolError(f"BMv2 lost results even at the lowest offered rate ({rates[0]} packets/s): "
                            f"{steps[0]['lost']} of {steps[0]['expected']}")
    return {"rounds_per_step": rounds, "steps": steps, "throughput_packets_per_s": ok,
            "throughput_payload_mb_per_s": ok * 4 * wire.P4_WORDS / 1e6, "bmv2_args": list(bmv2_args)}


def _steps(out: dict[int, list[tuple[float, bytes]]], rounds: int, rates: tuple[int, ...]) -> list[dict[str, Any]]:
    """Per step: results expected, received, lost, achieved packets/s; every result checked."""
    want = [3 * w for w in WORDS]
    got: list[list[float]] = [[] for _ in rates]
    for port, recs in out.items():
        for t, frame in recs:
            h, words = wire.parse_packet(frame[14 + 20 + 8:])
            if words.tolist() != want:
                raise ProtocolError(f"port {port}: a result differs from the sum of the workers' words")
            g = h.offset // wire.P4_WORDS
            if not 0 <= g < rounds * len(rates):
                raise ProtocolError(f"port {port}: a result for round {g}, which was never sent")
            got[g // rounds].append(t)
    steps = []
    for rate, ts in zip(rates, got):
        span = max(ts) - min(ts) if len(ts) > 1 else 0.0
        steps.append({"offered_packets_per_s": rate, "expected": 3 * rounds, "received": len(ts),
                      "lost": 3 * rounds - len(ts),
                      "achieved_packets_per_s": round(3 * rounds / span) if span > 0 else None})
    return steps


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=1000, help="ADD rounds of 3 worker packets per step (default 1000)")
    p.add_argument("--rates", default=",".join(map(str, RATES)),
                   help="offered worker packets/s of the steps, ascending (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="runs (a fresh switch each); the median is reported")
    p.add_argument("--log-level", default="off",
                   help="BMv2 --log-level (default off; a build with logging macros formats every message "
                        "at its default level trace otherwise); 'none' passes no flag")
    p.add_argument("--grpc-port", type=int, default=50561)
    p.add_argument("--json", type=Path, help="write the runs and the median to this file")


def _rates(text: str) -> tuple[int, ...]:
    """``--rates``: ascending positive integers (worker packets/s), else :class:`~homagg.ConfigError`."""
    try:
        rates = tuple(int(r) for r in text.split(","))
    except ValueError:
        rates = ()
    if not rates or list(rates) != sorted(rates) or rates[0] <= 0:
        raise ConfigError(f"--rates {text!r}: need positive integers (packets/s), ascending, comma-separated")
    return rates


def run(args: argparse.Namespace) -> int:
    opt.count("--rounds", args.rounds)
    opt.count("--repeats", args.repeats, why="the median is reported")
    opt.count("--grpc-port", args.grpc_port, 1, 65535)
    rates = _rates(args.rates)
    missing = missing_requirements()
    if missing:
        raise ConfigError("homagg bench p4rate needs BMv2 and the P4 extras; missing: " + ", ".join(missing)
                          + " (see README.md, section 'Getting p4c and BMv2')")
    bmv2_args = () if args.log_level == "none" else ("--log-level", args.log_level)
    runs = []
    for i in range(args.repeats):
        r = measure(args.rounds, rates, bmv2_args=bmv2_args, grpc_port=args.grpc_port)
        runs.append(r)
        steps = "  ".join(f"{st['offered_packets_per_s']}->{st['achieved_packets_per_s']}/{st['lost']}"
                          for st in r["steps"])
        print(f"run {i + 1}: loss-free up to {r['throughput_packets_per_s']:,} worker packets/s "
              f"({r['throughput_payload_mb_per_s']:.2f} MB/s payload, {wire.P4_WORDS} words); "
              f"per step ({3 * args.rounds} packets each) offered->achieved packets/s / lost: {steps}")
    median = statistics.median(r["throughput_packets_per_s"] for r in runs)
    print(f"median of {len(runs)}: {median:,.0f} worker packets/s loss-free")
    if args.json:
        record = {"benchmark": "p4rate", "machine": platform.platform(), "processor": platform.processor(),
                  "runs": runs, "median_throughput_packets_per_s": median}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0
