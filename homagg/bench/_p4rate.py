"""``homagg bench p4rate``: BMv2's packet rate on homagg.p4 (ports as pcap files, no NIC or kernel).

A job of 3 workers sends ``--rounds`` full 32-word ADD rounds (no loss): 3 worker packets in and
3 results out per round.  The frames enter port 1 of ``simple_switch_grpc --use-files``
(:class:`homagg.p4._pcap_switch.PcapSwitch`), configured by :class:`homagg.p4.Controller`;
the rate is ``packets in / (last result's pcap timestamp - first result's)``.  Every result is
checked: each worker gets ``--rounds`` results whose words are the sum of the 3 workers' words.

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

from .. import wire
from .._errors import ConfigError, ProtocolError
from ..jobs import JobSpec, WorkerAddr

__all__ = ["configure_parser", "run", "measure", "rate_job", "rate_sequence", "missing_requirements"]

SERVICE_IP, SERVICE_MAC = "10.0.0.254", "02:48:41:00:00:fe"
WORDS = list(range(wire.P4_WORDS))


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


def measure(rounds: int, *, bmv2_args: tuple[str, ...] = ("--log-level", "off"), grpc_port: int = 50561,
            folder: Path | None = None) -> dict[str, Any]:
    """One run: build, start BMv2 on pcap files, configure, wait for every result, check, time."""
    from ..p4 import Controller, SwitchConfig
    from ..p4._build import build
    from ..p4._pcap_switch import PcapSwitch, udp_frame

    j = rate_job()
    seq = rate_sequence(rounds)
    hosts = [{"ip": w.ip, "mac": _mac(w.worker_id), "port": w.worker_id + 1} for w in j.workers]
    frames = [udp_frame(src, _mac(int(src[0].rsplit(".", 1)[1]) - 1), (SERVICE_IP, wire.HOMAGG_UDP_PORT),
                        SERVICE_MAC, dg) for src, dg in seq]
    with tempfile.TemporaryDirectory(prefix="homagg-p4rate-") as tmp:
        work = folder or Path(tmp)
        built = build(work / "build")
        cfg = SwitchConfig.from_dict({"name": "s1", "grpc": f"127.0.0.1:{grpc_port}", "service_ip": SERVICE_IP,
                                      "service_mac": SERVICE_MAC, "ports": [1, 2, 3], "hosts": hosts})
        expected = 3 * rounds
        with PcapSwitch(work, [1, 2, 3], {1: frames}, grpc_port=grpc_port, bmv2_args=bmv2_args,
                        start_delay_s=8) as sw:
            with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=10) as ctl:
                ctl.push()
                ctl.configure(cfg)
                ctl.add_job(cfg, j)
                sw.wait_for(expected, timeout=60 + rounds / 500)
                time.sleep(1.0)
        out = {p: sw.output(p) for p in (1, 2, 3)}
    _check(out, rounds)
    stamps = [t for recs in out.values() for t, _ in recs]
    span = max(stamps) - min(stamps)
    pps = len(seq) / span if span > 0 else float("inf")
    return {"rounds": rounds, "packets_in": len(seq), "results_out": len(stamps), "seconds": span,
            "packets_per_s": pps, "results_per_s": len(stamps) / span if span > 0 else float("inf"),
            "payload_mb_per_s": pps * 4 * wire.P4_WORDS / 1e6, "bmv2_args": list(bmv2_args)}


def _check(out: dict[int, list[tuple[float, bytes]]], rounds: int) -> None:
    """Each worker's port got ``rounds`` results, each the 3-worker sum of :data:`WORDS`."""
    want = [3 * w for w in WORDS]
    for port, recs in out.items():
        if len(recs) != rounds:
            raise ProtocolError(f"port {port}: {len(recs)} results, expected {rounds}")
        for _, frame in recs:
            _h, words = wire.parse_packet(frame[14 + 20 + 8:])
            if words.tolist() != want:
                raise ProtocolError(f"port {port}: a result differs from the sum of the workers' words")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=2000, help="ADD rounds of 3 worker packets (default 2000)")
    p.add_argument("--repeats", type=int, default=3, help="runs (a fresh switch each); the median is reported")
    p.add_argument("--log-level", default="off",
                   help="BMv2 --log-level (default off; a build with logging macros formats every message "
                        "at its default level trace otherwise); 'none' passes no flag")
    p.add_argument("--grpc-port", type=int, default=50561)
    p.add_argument("--json", type=Path, help="write the runs and the median to this file")


def run(args: argparse.Namespace) -> int:
    missing = missing_requirements()
    if missing:
        raise ConfigError("homagg bench p4rate needs BMv2 and the P4 extras; missing: " + ", ".join(missing)
                          + " (see README.md, section 'Getting p4c and BMv2')")
    bmv2_args = () if args.log_level == "none" else ("--log-level", args.log_level)
    runs = []
    for i in range(args.repeats):
        r = measure(args.rounds, bmv2_args=bmv2_args, grpc_port=args.grpc_port)
        runs.append(r)
        print(f"run {i + 1}: {r['packets_in']} worker packets ({wire.P4_WORDS} words) in {r['seconds']:.3f} s = "
              f"{r['packets_per_s']:,.0f} packets/s in ({r['payload_mb_per_s']:.2f} MB/s payload), "
              f"{r['results_per_s']:,.0f} results/s out")
    median = statistics.median(r["packets_per_s"] for r in runs)
    print(f"median of {len(runs)}: {median:,.0f} packets/s")
    if args.json:
        record = {"benchmark": "p4rate", "machine": platform.platform(), "processor": platform.processor(),
                  "runs": runs, "median_packets_per_s": median}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0
