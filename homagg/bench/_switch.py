"""``homagg bench switch``: dense int32 aggregation goodput through the emulator vs gloo allreduce.

W worker processes each hold ``numel`` int32 words.  In every repeat, every worker first runs a
gloo ``all_reduce`` (torch.distributed, TCP on loopback) of its words, then a homagg round (one
ADD stream through :class:`~homagg.transport.UdpSwitchPort` to the emulator, a separate process).
Both are started after a barrier; a repeat's time is the slowest worker's.  The homagg result is
checked against the integer sum in the first repeat.  Reported per configuration: medians over
``--repeats`` (after one warm-up), ``goodput_gbps = numel * 4 * 8 / homagg_s / 1e9`` (one
worker's payload per second) and the same for gloo; retransmissions summed over the workers
(``retransmits``, of them ``fast_retransmits`` and provably ``spurious_retransmits``, see
:class:`~homagg.transport.UdpSwitchPort`) and the switch's view of them (``switch_duplicates``:
copies of a contribution already counted, answered or dropped); ``load_1min`` is the host's load
average when the configuration started.

Per emulator engine (``--engine native,python`` or ``both``): ``switch_datagrams_per_s`` (worker
datagrams into the switch per second of the median homagg round) and ``payload_in_gbps`` (the
workers' payload bits into the switch per second).  Packet sizes: a full datagram is an IPv4
packet of ``48 + 4 K`` bytes (IPv4 20 + UDP 8 + homagg header :data:`~homagg.wire.HEADER_LEN` 20
+ K words): K = 2238 is a 9000-byte packet (MTU 9000), K = 363 a 1500-byte one (MTU 1500),
K = 16000 (the default) a 64048-byte one; ``frame_bytes`` adds Ethernet's 14.

Where the CPU goes (to tell whether the switch or the workers' Python transport bounds a run):
``switch_cpu_per_round_s`` is the emulator child's CPU seconds per thread (``/proc``, read by
rank 0 around each of its homagg rounds, at the clock tick's 10 ms resolution: meaningful for
rounds of a second or so); ``switch_data_cpu_share`` is its data thread's CPU over rank 0's round
times (1.0: the switch's data thread saturates a core), ``switch_cpu_us_per_datagram`` that CPU
per worker datagram (its inverse bounds the engine's datagrams/s on one core);
``worker_cpu_cores`` is the workers' CPU seconds (``getrusage``, one thread each) in their homagg
rounds over the rounds' time, ``worker_sys_cores`` its kernel part (``switch_data_sys_share``
the switch's).  Loopback delivers a datagram in its sender's system call: the receiver's
protocol work is partly charged to the sender.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import _options as opt
from .._errors import ConfigError, ProtocolError
from ..wire import HEADER_LEN
from ._cpu import thread_cpu
from ._report import RETX_KEYS, counts

__all__ = ["configure_parser", "run", "measure"]



def _words(rank: int, numel: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(rank).integers(-(2**20), 2**20, numel, dtype=np.int32))


def _worker(rank: int, cfg: dict[str, Any], barrier: Any) -> dict[str, Any]:
    import torch.distributed as dist

    from ..transport import CombineOp, Stream
    from ..jobs import JobSpec
    from ..transport import UdpSwitchPort

    torch.set_num_threads(1)
    w, numel = cfg["workers"], cfg["numel"]
    data = _words(rank, numel)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['gloo_port']}", rank=rank, world_size=w)
    port = UdpSwitchPort(tuple(cfg["data"]), job=JobSpec.from_dict(cfg["job"]), rank=rank,
                         control=tuple(cfg["control"]), timeout=cfg["timeout"], secret=cfg.get("secret"))
    homagg_t: list[float] = []
    gloo_t: list[float] = []
    homagg_cpu: list[tuple[float, float]] = []  # (user, system) CPU seconds of each homagg round
    switch_cpu: list[dict[str, float]] = []  # rank 0: the emulator's CPU seconds per thread in each round
    prof = None
    if os.environ.get("HOMAGG_BENCH_PROFILE") and rank == 0:  # cProfile rank 0's homagg rounds into this file
        import cProfile

        prof = cProfile.Profile()
    try:
        for rep in range(cfg["repeats"] + 1):
            buf = data.clone()
            barrier.wait(cfg["timeout"])
            t0 = time.perf_counter()
            dist.all_reduce(buf)
            gloo_t.append(time.perf_counter() - t0)
            barrier.wait(cfg["timeout"])
            if prof is not None:
                prof.enable()
            sw0 = thread_cpu(cfg["switch_pid"]) if rank == 0 else {}
            t0, ru0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
            (out,) = port.combine([Stream("data", CombineOp.ADD, data)])
            homagg_t.append(time.perf_counter() - t0)
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            homagg_cpu.append((ru1.ru_utime - ru0.ru_utime, ru1.ru_stime - ru0.ru_stime))
            if rank == 0:
                sw1 = thread_cpu(cfg["switch_pid"])
                switch_cpu.append({k: v - sw0.get(k, 0.0) for k, v in sw1.items()})
            if prof is not None:
                prof.disable()
            if rep == 0 and not (torch.equal(out, buf) and (rank or cfg["check"])):
                if not torch.equal(out, buf):
                    raise ProtocolError(f"rank {rank}: homagg result differs from gloo's integer sum")
            del out, buf  # steady state, as in a training loop: the port may recycle the result array
        stats = dict(port.stats)
        if prof is not None:
            prof.dump_stats(os.environ["HOMAGG_BENCH_PROFILE"])
    finally:
        port.close()
        dist.destroy_process_group()
    return {"homagg": homagg_t[1:], "gloo": gloo_t[1:], "homagg_cpu": homagg_cpu[1:], "switch_cpu": switch_cpu[1:],
            "stats": stats}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(workers: int, numel: int, *, words_per_packet: int = 16000, slots: int = 64, repeats: int = 5,
            drop: float = 0.0, timeout: float = 60.0, engine: str = "auto") -> dict[str, Any]:
    """One configuration: start an emulator (``engine``), run the workers, return the record."""
    import switch_emulator

    from ..transport import ControlClient
    from ..transport._procs import RankFailure, Workers, context

    load = round(os.getloadavg()[0], 2)
    with switch_emulator.spawn(drop=drop, engine=engine) as sw:
        ctl = ControlClient(sw.control_addr)
        job = ctl.admit(workers, n_slots=slots, words_per_packet=words_per_packet)
        cfg = {"workers": workers, "numel": numel, "repeats": repeats, "timeout": timeout, "data": list(sw.data_addr),
               "control": list(sw.control_addr), "job": job.to_dict(), "gloo_port": _free_port(), "check": True,
               "secret": sw.secret}
        cfg["switch_pid"] = sw.process.pid if sw.process is not None else os.getpid()
        barrier = context().Barrier(workers)
        results = Workers(_worker, workers, cfg, barrier).join(timeout * (repeats + 2) * 2 + 60)
        status = ctl.status()
        counters = status["counters"]
        ctl.remove(job.job_id)
    failed = [r for r in results if isinstance(r, RankFailure)]
    if failed:
        raise ProtocolError(f"bench worker {failed[0].rank} failed: {failed[0].type}: {failed[0].message}")
    homagg_rep = [max(r["homagg"][i] for r in results) for i in range(repeats)]
    gloo_rep = [max(r["gloo"][i] for r in results) for i in range(repeats)]
    h, g = statistics.median(homagg_rep), statistics.median(gloo_rep)
    r0 = results[0]["switch_cpu"]
    switch_cpu = {k: round(sum(c.get(k, 0.0) for c in r0) / len(r0), 4) for k in r0[0] if any(c.get(k) for c in r0)}
    switch_share = sum(c.get("data", 0.0) for c in r0) / sum(results[0]["homagg"])
    wall = sum(sum(r["homagg"]) for r in results) / workers
    worker_user = sum(u for r in results for u, _ in r["homagg_cpu"]) / wall
    worker_sys = sum(y for r in results for _, y in r["homagg_cpu"]) / wall
    bits = numel * 4 * 8
    datagrams = workers * -(-numel // words_per_packet)  # into the switch per call
    return {
        "workers": workers, "numel": numel, "payload_words": words_per_packet, "slots": slots, "repeats": repeats,
        "engine": status["engine"], "frame_bytes": frame_bytes(words_per_packet),
        "ip_packet_bytes": frame_bytes(words_per_packet) - 14,
        "switch_cpu_per_round_s": switch_cpu, "switch_data_cpu_share": switch_share,
        "switch_cpu_us_per_datagram": switch_cpu.get("data", 0.0) / datagrams * 1e6,
        "worker_cpu_cores": worker_user + worker_sys, "worker_sys_cores": worker_sys,
        "switch_data_sys_share": sum(c.get("data_sys", 0.0) for c in r0) / sum(results[0]["homagg"]),
        "switch_datagrams_per_s": datagrams / h, "payload_in_gbps": workers * bits / h / 1e9,
        "homagg_s": h, "gloo_s": g, "goodput_gbps": bits / h / 1e9, "gloo_goodput_gbps": bits / g / 1e9,
        "homagg_runs_s": homagg_rep, "gloo_runs_s": gloo_rep,
        **{k: sum(r["stats"][k] for r in results) for k in RETX_KEYS},
        "switch_duplicates": counters["retransmit_answered"] + counters["drop_duplicate"],
        "load_1min": load,
        "switch_packets_in": counters["rx"], "switch_packets_out": counters["tx"], "drop": drop,
        "machine": f"{platform.machine()} {platform.node()} cpus={len(os.sched_getaffinity(0))}",
    }


def frame_bytes(words_per_packet: int) -> int:
    """The Ethernet frame (without preamble and FCS) of a full datagram: 14 + IPv4 20 + UDP 8 +
    homagg header 20 + 4 bytes per word; 2238 words: 9014 (MTU 9000), 363 words: 1514 (MTU 1500),
    16000 words: 64062 (a 64048-byte IPv4 packet)."""
    return 14 + 20 + 8 + HEADER_LEN + 4 * words_per_packet


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", default="4", help="worker processes, comma-separated list (default 4)")
    p.add_argument("--numel", default="10000000", help="int32 words per worker, comma-separated (default 10M)")
    p.add_argument("--words-per-packet", default="16000,2238,363",
                   help="K, words per packet, comma-separated (default: all three frame sizes, 16000: a "
                        "64048-byte IPv4 packet; 2238: 9000 bytes, an MTU-9000 frame; 363: 1500 bytes, an MTU-1500 one)")
    p.add_argument("--engine", default="auto",
                   help="emulator engines, comma-separated: auto, native, python, or both (= native,python); "
                        "default auto: native where built")
    p.add_argument("--slots", type=int, default=64, help="window: slots of the job (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats after one warm-up; medians reported")
    p.add_argument("--drop", type=float, default=0.0, help="loss injected at the emulator")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--json", type=Path, help="write the records to this file")


def _engines(text: str) -> list[str]:
    """``--engine``: comma-separated engines; ``both`` is native then python."""
    out: list[str] = []
    for e in (x.strip() for x in text.split(",") if x.strip()):
        for name in (("native", "python") if e == "both" else (e,)):
            if name not in ("auto", "native", "python"):
                raise ConfigError(f"--engine: {name!r} is none of auto, native, python, both")
            out.append(name)
    return out


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ._report import print_table
    from rich.table import Table

    opt.count("--repeats", args.repeats, why="medians are reported")
    opt.seconds("--timeout", args.timeout)
    console = Console()
    records = []
    for engine in _engines(args.engine):
        for k in counts(str(args.words_per_packet)):
            for w in counts(str(args.workers)):
                for n in counts(str(args.numel)):
                    with console.status(f"{engine} engine, K={k}, {w} workers, {n:,} words: homagg and gloo"):
                        rec = measure(w, n, words_per_packet=k, slots=args.slots, repeats=args.repeats,
                                      drop=args.drop, timeout=args.timeout, engine=engine)
                    records.append(rec)
                    console.print(f"{rec['engine']} K={k} W={w} numel={n:,}: homagg {rec['homagg_s']:.3f}s "
                                  f"({rec['payload_in_gbps']:.2f} Gbit/s in, {rec['switch_datagrams_per_s']:,.0f} "
                                  f"datagrams/s; switch data thread {rec['switch_data_cpu_share']:.0%} of a core, "
                                  f"workers {rec['worker_cpu_cores']:.2f} cores, {rec['worker_sys_cores']:.2f} of them "
                                  f"in the kernel), gloo {rec['gloo_s']:.3f}s")
    table = Table(title="homagg emulator vs gloo allreduce (int32, loopback, medians)")
    for col in ("engine", "workers", "numel", "K", "frame B", "homagg s", "gloo s", "switch dgram/s", "payload in Gbit/s",
                "homagg Gbit/s", "gloo Gbit/s", "switch cpu", "worker cores", "retx", "spurious", "load"):
        table.add_column(col, justify="right")
    for r in records:
        table.add_row(r["engine"], str(r["workers"]), f"{r['numel']:,}", str(r["payload_words"]),
                      str(r["frame_bytes"]), f"{r['homagg_s']:.3f}", f"{r['gloo_s']:.3f}",
                      f"{r['switch_datagrams_per_s']:,.0f}", f"{r['payload_in_gbps']:.2f}",
                      f"{r['goodput_gbps']:.2f}", f"{r['gloo_goodput_gbps']:.2f}",
                      f"{r['switch_data_cpu_share']:.0%}", f"{r['worker_cpu_cores']:.2f}",
                      str(r["retransmits"]), str(r["spurious_retransmits"]), f"{r['load_1min']:.1f}")
    print_table(console, table)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")
    return 0
