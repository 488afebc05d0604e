"""``homagg bench faults``: reliability figures (JSON), not timed tests.

Four parts; the first three against a Python emulator in its own process (:func:`switch_emulator.spawn`):

* ``soak``: W workers (processes) run continuous all_reduces of int32 tensors -- mixed sizes and
  schemes, every result compared with the exact integer sum -- for ``--duration`` seconds while
  the switch drops, duplicates and reorders ``--soak-loss`` of the datagrams (its fault
  injection).  The resident memory (``VmRSS``) of the switch and of every worker is sampled;
  ``growth_mib`` is the median of the last three samples minus the median of the samples taken
  after warm-up (the first fifth of the run), checked against ``--rss-bound-mib``.  The workers
  agree to stop through one extra 1-word all_reduce per iteration (everyone stops together).
* ``fuzz``: ``--fuzz`` datagrams at ``--fuzz-rate`` per second (scapy ``fuzz()`` of the homagg layer, truncated headers, wrong
  versions, bad word counts, unknown jobs, forged tokens from admitted-looking headers, random
  noise) blasted at the data port while two legitimate jobs (2 workers each) run again and again:
  every run exact, the switch alive.  A coverage-guided fuzzer (atheris) of the parser and
  pipeline runs too when atheris imports; otherwise the record says why not.
* ``loss``: for each rate in ``--loss-rates`` (drop at ingress and egress), ``--loss-iters``
  all_reduces of ``--loss-numel`` int32 words: median time per all_reduce (slowest worker) and
  retransmissions per all_reduce (summed over the workers), every result exact.
* ``crash``: a DDP run whose switch is SIGKILLed mid-run and comes back (:mod:`._crash`): steps on
  each path, the time lost to detection and return, final parameters on every rank.
* ``chaos`` (``--chaos``, not in the default parts): a ``--duration`` DDP soak on the embedded default
  with the emulator killed, loss/reorder/duplicate bursts and a stalled rank at seeded random
  times, then the same run undisturbed (:mod:`._chaos`).

Every worker process runs :func:`homagg.bench._faults_rank.worker`.  ``--quick`` is the CI form
(seconds, not minutes).  ``load_1min`` and the machine are recorded: on a shared machine the
times are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import struct
import sys
import threading
import time
from typing import Any

from .._errors import ProtocolError
from ._chaos import chaos, check_chaos_args, summary
from ._chaos import configure_parser as _chaos_parser
from ._crash import configure_parser as _crash_parser
from ._crash import crash
from ._faults_checks import check_faults_args
from ._faults_rank import SIZES, worker

__all__ = ["configure_parser", "run"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="the short CI form of every part")
    p.add_argument("--parts", default="soak,fuzz,loss,crash", help="comma-separated subset of soak,fuzz,loss,crash,chaos")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--duration", type=float, default=600.0, help="soak and chaos seconds (default 10 min)")
    p.add_argument("--soak-loss", type=float, default=0.01, help="soak drop = duplicate = reorder rate")
    p.add_argument("--rss-bound-mib", type=float, default=64.0, help="allowed RSS growth per process")
    p.add_argument("--fuzz", type=int, default=100_000, help="fuzzed datagrams")
    p.add_argument("--fuzz-rate", type=float, default=2000.0,
                   help="fuzzed datagrams per second (a flood beyond what the switch absorbs is a denial of "
                        "service by queueing, which no admission check prevents)")
    p.add_argument("--loss-rates", default="0.001,0.01,0.05,0.2")
    p.add_argument("--loss-iters", type=int, default=20)
    p.add_argument("--loss-numel", type=int, default=100_000)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds without progress before a worker fails")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the record to this file")
    _crash_parser(p)
    _chaos_parser(p)


def _rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _job(sw: Any, world: int, words: int, slots: int = 16) -> Any:
    from ..transport import ControlClient

    with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
        return ctl.admit(world, n_slots=slots, words_per_packet=words)


def _base_cfg(sw: Any, job: Any, args: argparse.Namespace, world: int) -> dict[str, Any]:
    return {"world": world, "data": list(sw.data_addr), "control": list(sw.control_addr), "job": job.to_dict(),
            "timeout": args.timeout, "secret": sw.secret, "seed": args.seed}


def _check(results: list[Any], what: str) -> list[dict[str, Any]]:
    from ..transport._procs import RankFailure

    bad = [r for r in results if isinstance(r, RankFailure)]
    if bad:
        raise ProtocolError(f"{what}: worker {bad[0].rank} failed: {bad[0].type}: {bad[0].message}")
    return results


def soak(args: argparse.Namespace) -> dict[str, Any]:
    import switch_emulator

    from ..transport import ControlClient
    from ..transport._procs import Workers

    w, loss = args.workers, args.soak_loss
    with switch_emulator.spawn(drop=loss, duplicate=loss, reorder=loss, seed=args.seed) as sw:
        job = _job(sw, w, 2048)
        cfg = {**_base_cfg(sw, job, args, w), "duration": args.duration}
        ws = Workers(worker, w, cfg)
        pids = {"switch": sw.process.pid, **{f"worker{r}": p.pid for r, p in enumerate(ws.procs)}}
        samples: list[tuple[float, dict[str, float | None]]] = []
        t0 = time.monotonic()
        step = max(0.5, args.duration / 60)
        while any(p.is_alive() for p in ws.procs) and time.monotonic() - t0 < args.duration + 4 * args.timeout:
            samples.append((round(time.monotonic() - t0, 1), {k: _rss_mib(pid) for k, pid in pids.items()}))
            time.sleep(step)
        results = _check(ws.join(60 + 4 * args.timeout), "soak")
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            counters = ctl.status()["counters"]
    rss = {}
    warm = [s for t, s in samples if args.duration * 0.1 <= t <= args.duration * 0.3] or [samples[0][1]]
    tail = [s for _, s in samples[-3:]]
    for k in pids:
        base = statistics.median(v for s in warm if (v := s.get(k)) is not None)
        last = statistics.median(v for s in tail if (v := s.get(k)) is not None) if any(
            s.get(k) is not None for s in tail) else base
        rss[k] = {"warm_mib": round(base, 1), "end_mib": round(last, 1), "growth_mib": round(last - base, 1),
                  "max_mib": round(max(v for _, s in samples if (v := s.get(k)) is not None), 1)}
    iters = results[0]["iterations"]
    times = [max(r["times"][i] for r in results) for i in range(iters)]
    return {
        "workers": w, "duration_s": args.duration, "loss": {"drop": loss, "duplicate": loss, "reorder": loss},
        "all_reduces": iters, "exact": all(not r["inexact"] for r in results),
        "inexact": [x for r in results for x in r["inexact"]][:10],
        "schemes": results[0]["schemes"], "sizes": list(SIZES),
        "median_all_reduce_s": round(statistics.median(times), 4) if times else None,
        "retransmits": sum(r["port_stats"]["retransmits"] for r in results),
        "rss": rss, "rss_bound_mib": args.rss_bound_mib,
        "rss_within_bound": all(v["growth_mib"] <= args.rss_bound_mib for v in rss.values()),
        "rss_samples": len(samples),
        "switch": {k: counters.get(k, 0) for k in ("rx", "tx", "accepted", "completed", "dropped", "drop_injected",
                                                   "drop_injected_egress", "injected_duplicate", "injected_reorder",
                                                   "retransmit_answered")},
    }


def _fuzz_pool(rng: random.Random, jobs: list[Any], n: int) -> list[bytes]:
    """``n`` hostile datagrams (see the module docstring)."""
    from .. import wire

    try:
        from scapy.packet import fuzz

        from ..wire_scapy import HomAgg

        scapy = [bytes(fuzz(HomAgg(words=[0] * rng.randrange(0, 8)))) for _ in range(min(n, 3000))]
    except ImportError:
        scapy = []
    out = []
    for i in range(n):
        kind = i % 8
        j = jobs[i % len(jobs)]
        h = wire.Header(wire.VERSION, rng.randrange(3), 0, j.job_id, rng.randrange(j.world_size), 4, rng.randrange(2),
                        j.slot_base + rng.randrange(j.n_slots), rng.randrange(65536), 0, token=rng.getrandbits(32))
        good = wire.pack_packet(h, [2**31 - 1, -1, 7, 0])  # a guessed token: the forged kind
        if kind == 0 and scapy:
            d = bytearray(scapy[i % len(scapy)])
            if d:
                d[rng.randrange(len(d))] ^= 1 << rng.randrange(8)
            out.append(bytes(d))
        elif kind == 1:
            out.append(good[: rng.randrange(0, wire.HEADER_LEN)])
        elif kind == 2:
            out.append(bytes([rng.choice([0x00, 0x10, 0x30, 0xF0]) | (good[0] & 0xF)]) + good[1:])
        elif kind == 3:
            out.append(good[:6] + struct.pack("!H", rng.choice([0, 5, 3, 16001, 65535])) + good[8:])
        elif kind == 4:
            out.append(good[:2] + struct.pack("!H", rng.randrange(100, 65536)) + good[4:])
        elif kind == 5:
            out.append(bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 120))))
        else:
            out.append(good)
    return out


def fuzz(args: argparse.Namespace) -> dict[str, Any]:
    import switch_emulator

    from ..transport import ControlClient
    from ..transport._procs import Workers

    rng = random.Random(args.seed)
    with switch_emulator.spawn() as sw:
        jobs = [_job(sw, 2, 256, slots=8) for _ in range(2)]
        pool = _fuzz_pool(rng, jobs, min(args.fuzz, 20_000))
        sent = [0]
        blast_s = [0.0]
        done = threading.Event()

        def blast() -> None:
            socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(8)]
            start = time.monotonic()
            try:
                while sent[0] < args.fuzz:
                    socks[sent[0] % 8].sendto(pool[sent[0] % len(pool)], sw.data_addr)
                    sent[0] += 1
                    if sent[0] % 32 == 0:  # paced: sent[0] datagrams are due at start + sent[0] / rate
                        ahead = start + sent[0] / args.fuzz_rate - time.monotonic()
                        if ahead > 0:
                            time.sleep(ahead)
            finally:
                for s in socks:
                    s.close()
                blast_s[0] = time.monotonic() - start
                done.set()

        runs = [0, 0]
        problems: list[str] = []

        def legit(k: int) -> None:
            # each run is a fresh job (new ports start their chunk sequence at 0: a job's slots
            # must not be reused by a second set of ports), admitted while the fuzzing goes on
            seed = args.seed + 100 * k
            job = jobs[k]
            while True:
                cfg = {**_base_cfg(sw, job, args, 2), "iters": 4, "seed": seed}
                try:
                    res = _check(Workers(worker, 2, cfg).join(60 + 8 * args.timeout), f"fuzz job {k}")
                except ProtocolError as exc:
                    problems.append(str(exc))
                    return
                problems.extend(x for r in res for x in r["inexact"])
                runs[k] += 1
                seed += 1
                with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
                    ctl.remove(job.job_id)
                    if done.is_set():
                        return
                    job = ctl.admit(2, n_slots=8, words_per_packet=256)

        t0 = time.monotonic()
        threads = [threading.Thread(target=blast)] + [threading.Thread(target=legit, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            counters = ctl.status()["counters"]
        alive = sw.process.poll() is None
    return {
        "datagrams": sent[0], "distinct": len(pool), "seconds": round(elapsed, 1), "rate_target": args.fuzz_rate,
        "rate": round(sent[0] / max(blast_s[0], 1e-9), 1),
        "legit_runs": runs, "exact": not problems and min(runs) >= 1, "problems": problems[:5], "switch_alive": alive,
        "switch": {k: v for k, v in counters.items() if k.startswith("drop_") and v} | {
            "rx": counters["rx"], "accepted": counters["accepted"], "dropped": counters["dropped"]},
        "coverage_guided": _atheris(args),
    }


def _atheris(args: argparse.Namespace) -> dict[str, Any]:
    """Coverage-guided fuzzing of the parser + pipeline with atheris (libFuzzer), in a child
    process, if atheris imports: a 2-worker job is admitted, each input comes from the source of the
    worker its ``worker_id`` byte names (low bit), and the corpus is seeded with one valid datagram;
    reports libFuzzer's final coverage line and the pipeline's counters."""
    import re
    import subprocess
    import sys
    import tempfile

    from .. import wire

    try:
        import atheris  # noqa: F401
    except ImportError:
        return {"ran": False, "why": "atheris is not installed (pip install atheris); scapy fuzzing only"}
    runs = 5000 if args.quick else 200_000
    code = (
        "import json, sys, atheris\n"
        "import homagg, numpy\n"
        "with atheris.instrument_imports(include=['switch_emulator', 'homagg.wire', 'homagg.jobs']):\n"
        "    import homagg.wire\n"
        "    from homagg.jobs import JobSpec, WorkerAddr\n"
        "    from switch_emulator.admission import AdmissionTable\n"
        "    from switch_emulator.pipeline import Pipeline\n"
        "adm = AdmissionTable(64); adm.admit(JobSpec(1, 2, 0, 8, 32, (WorkerAddr(0, '10.0.0.1', 1),"
        " WorkerAddr(1, '10.0.0.2', 1)), token=7))\n"
        "sent = []\n"
        "pipe = Pipeline(adm, lambda d, a: sent.append(len(d)))\n"
        "def one(data):\n"
        "    pipe.process(data, len(data), ('10.0.0.2' if len(data) > 4 and data[4] & 1 else '10.0.0.1', 1))\n"
        f"    if pipe.counters['rx'] % {runs // 10} == 0:\n"
        "        print('@counters@' + json.dumps(dict(pipe.counters)), file=sys.stderr, flush=True)\n"
        "atheris.Setup(sys.argv, one)\n"
        "atheris.Fuzz()\n"
    )
    with tempfile.TemporaryDirectory(prefix="homagg-atheris-") as corpus:
        seed = wire.pack_packet(wire.Header(wire.VERSION, wire.OP_ADD, 0, 1, 0, 3, 0, 1, 1, 0, token=7), [1, 2, 3])
        with open(os.path.join(corpus, "seed"), "wb") as f:
            f.write(seed)
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", code, f"-runs={runs}", "-max_len=256", corpus],
                           capture_output=True, text=True, timeout=3600)
    cov = re.findall(r"DONE\s+cov: (\d+) ft: (\d+)", r.stderr)
    counters = ([json.loads(ln[len("@counters@"):]) for ln in r.stderr.splitlines() if ln.startswith("@counters@")]
                or [{}])[-1]
    return {"ran": True, "runs": runs, "seconds": round(time.monotonic() - t0, 1), "crashed": r.returncode != 0,
            "coverage_edges": int(cov[-1][0]) if cov else None, "features": int(cov[-1][1]) if cov else None,
            "pipeline_counters": {k: v for k, v in counters.items() if v},
            "tail": r.stderr[-300:] if r.returncode else ""}


def loss(args: argparse.Namespace) -> list[dict[str, Any]]:
    import switch_emulator

    from ..transport import ControlClient
    from ..transport._procs import Workers

    out = []
    for rate in [float(x) for x in args.loss_rates.split(",") if x.strip()]:
        with switch_emulator.spawn(drop=rate, seed=args.seed) as sw:
            job = _job(sw, args.workers, 2048)
            cfg = {**_base_cfg(sw, job, args, args.workers), "iters": args.loss_iters, "numel": args.loss_numel,
                   "scheme": "dense"}
            res = _check(Workers(worker, args.workers, cfg).join(60 + args.loss_iters * 4 * args.timeout),
                         f"loss {rate}")
            with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
                c = ctl.status()["counters"]
        n = args.loss_iters
        times = [max(r["times"][i] for r in res) for i in range(n)]
        retx = [sum(r["retransmits"][i] for r in res) for i in range(n)]
        out.append({"loss": rate, "all_reduces": n, "numel": args.loss_numel, "workers": args.workers,
                    "median_s": round(statistics.median(times), 4), "p90_s": round(sorted(times)[int(0.9 * (n - 1))], 4),
                    "retransmits_per_all_reduce": round(statistics.mean(retx), 1),
                    "exact": all(not r["inexact"] for r in res),
                    "switch_injected_drops": c.get("drop_injected", 0) + c.get("drop_injected_egress", 0)})
    return out


def run(args: argparse.Namespace) -> int:
    check_faults_args(args)
    check_chaos_args(args)
    chaos_s = min(args.duration, 120.0) if args.quick else args.duration
    if args.quick:
        args.duration = min(args.duration, 8.0)
        args.fuzz = min(args.fuzz, 3000)
        args.loss_iters = min(args.loss_iters, 3)
        args.loss_numel = min(args.loss_numel, 20_000)
        args.crash_steps, args.crash_at = min(args.crash_steps, 24), min(args.crash_at, 8)
        args.crash_width, args.crash_probe = min(args.crash_width, 256), min(args.crash_probe, 0.3)
    parts = ["chaos"] if args.chaos else [p.strip() for p in args.parts.split(",") if p.strip()]
    record: dict[str, Any] = {
        "bench": "faults", "quick": bool(args.quick), "load_1min_start": round(os.getloadavg()[0], 2),
        "machine": f"{platform.machine()} cpus={len(os.sched_getaffinity(0))} python {platform.python_version()}",
    }
    if "soak" in parts:
        record["soak"] = soak(args)
    if "fuzz" in parts:
        record["fuzz"] = fuzz(args)
    if "loss" in parts:
        record["loss"] = loss(args)
    if "crash" in parts:
        record["crash"] = crash(args)
    if "chaos" in parts:
        record["chaos"] = chaos(args, chaos_s)
    record["load_1min_end"] = round(os.getloadavg()[0], 2)
    text = json.dumps(record, indent=2)
    print(text)
    if "chaos" in record:
        print(summary(record["chaos"]), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    ok = (record.get("soak", {}).get("exact", True) and record.get("soak", {}).get("rss_within_bound", True)
          and record.get("fuzz", {}).get("exact", True) and record.get("fuzz", {}).get("switch_alive", True)
          and all(r["exact"] for r in record.get("loss", []))
          and record.get("crash", {}).get("params_match_across_ranks", True)
          and record.get("chaos", {}).get("ok", True))
    return 0 if ok else 1
