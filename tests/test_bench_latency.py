"""``homagg bench latency`` at CI size: well-formed records and floor, exact results for both
backends; bad options refused before anything starts; no rank outlives a killed command.

No timing assertions (the machine is shared): the figures are checked for form and sense only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from homagg.bench._latency import RECORD_FIELDS, markdown_table
from homagg.bench._latency_limit import percentiles
from homagg.bench._ranks import LAUNCHER_ENV
from homagg.cli import main
from homagg.wire import MAX_WORKERS

ROOT = Path(__file__).resolve().parent.parent
_cache: dict[str, Any] = {}


def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if "report" not in _cache:
        out = tmp_path_factory.mktemp("bench-latency")
        argv = ["bench", "latency", "--world", "2", "--numel", "1,3000", "--calls", "6", "--warmup", "2",
                "--barrier", "--out", str(out), "--json", str(out / "copy.json")]
        assert main(argv) == 0
        _cache["out"] = out
        _cache["report"] = json.loads((out / "records.json").read_text())
    return _cache


def test_records_well_formed_and_exact(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = tiny_run(tmp_path_factory)
    report = run["report"]
    assert json.loads((run["out"] / "copy.json").read_text()) == report
    records = report["records"]
    assert sorted((r["backend"], r["op"], r["numel"]) for r in records) == [
        ("gloo", "allreduce", 1), ("gloo", "allreduce", 3000), ("gloo", "barrier", 0),
        ("homagg", "allreduce", 1), ("homagg", "allreduce", 3000), ("homagg", "barrier", 0)]
    for rec in records:
        for name, types in RECORD_FIELDS.items():
            assert name in rec, f"{name} missing in {rec}"
            assert isinstance(rec[name], types), (name, rec)
            assert isinstance(rec[name], bool) == (bool in types), (name, rec)  # no bools posing as ints
        assert (rec["world"], rec["calls"], rec["input"], rec["pace"]) == (2, 6, "fresh", "loop")
        assert rec["bytes"] == 4 * rec["numel"]
        assert rec["exact"], rec  # every rank got rank 0's result on every call, within the bound
        assert len(rec["times_s"]) == 6 and all(t > 0 for t in rec["times_s"])
        assert 0 < rec["p50_s"] <= rec["p90_s"] <= rec["p99_s"] == max(rec["times_s"])
        for key in ("cpu_s_per_call_per_rank", "cpu_user_s_per_call_per_rank", "cpu_sys_s_per_call_per_rank",
                    "cpu_mean_s_per_call_per_rank"):
            assert len(rec[key]) == 2 and all(v >= 0 for v in rec[key]), (key, rec[key])
        assert rec["cpu_s_per_call"] == max(rec["cpu_s_per_call_per_rank"]) > 0
        if rec["backend"] == "homagg":
            assert rec["scheme"] == "auto" and rec["x_gloo"] is not None and rec["x_gloo"] > 0
            assert rec["switch_cpu_s_per_call"] is not None  # the embedded emulator, a child of rank 0
            if rec["op"] == "barrier":  # homagg's barrier is one switch round
                assert rec["first_call_rounds"] == 1 and rec["rounds_per_call"] == 1.0, rec
            else:  # the first call of a size has no history: at least one round; timed calls one or more each
                assert rec["first_call_rounds"] >= 1 and rec["rounds_per_call"] >= 1
        else:
            assert rec["scheme"] is None and rec["x_gloo"] is None and rec["first_call_rounds"] is None
    limit = report["limit"]
    assert limit["calls"] >= 6 and len(limit["bare_times_s"]) == limit["calls"]
    for form in ("bare_s", "port_s"):
        assert 0 < limit[form]["p50"] <= limit[form]["p90"] <= limit[form]["p99"], limit[form]
    table = (run["out"] / "table.md").read_text()
    assert "floor: one datagram through the emulator" in table
    assert table.count("| homagg/auto |") == 3 and markdown_table(records) in table
    assert table.count("| barrier | 0 | 2 |") == 2


def test_barrier_pace(tmp_path: Path) -> None:
    """``--pace barrier``: each timed call after an untimed ``dist.barrier()``, the results exact,
    homagg's rounds per call those of the all_reduce alone; the timed barriers of ``--barrier`` run
    back to back (no pacing barrier before each)."""
    assert main(["bench", "latency", "--world", "2", "--numel", "1", "--calls", "4", "--warmup", "1",
                 "--pace", "barrier", "--barrier", "--no-limit", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "records.json").read_text())["records"]
    assert sorted((r["backend"], r["op"]) for r in records) == [
        ("gloo", "allreduce"), ("gloo", "barrier"), ("homagg", "allreduce"), ("homagg", "barrier")]
    for rec in records:
        assert rec["pace"] == "barrier" and rec["exact"] and len(rec["times_s"]) == 4, rec
        if rec["backend"] == "homagg":
            assert rec["rounds_per_call"] == 1.0, rec  # the all_reduce's (not the paced barrier's) or the barrier's


def test_max_and_min(tmp_path: Path) -> None:
    """``--op sum,max,min``: a record per reduction and size, each exact (MAX/MIN: the elementwise
    extremum of the ranks' inputs, exactly), ``x_gloo`` against gloo's record of the same reduction;
    homagg's MAX and MIN are one switch round, the first call included (no history)."""
    assert main(["bench", "latency", "--world", "2", "--numel", "1,5", "--calls", "4", "--warmup", "1",
                 "--op", "sum,max,min", "--no-limit", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "records.json").read_text())["records"]
    assert sorted((r["backend"], r["op"], r["numel"]) for r in records) == sorted(
        (b, op, n) for b in ("gloo", "homagg") for op in ("allreduce", "max", "min") for n in (1, 5))
    for rec in records:
        assert rec["exact"] and rec["max_abs_err"] == 0.0 or rec["op"] == "allreduce", rec
        if rec["backend"] == "homagg" and rec["op"] != "allreduce":
            assert (rec["first_call_rounds"], rec["rounds_per_call"]) == (1, 1.0), rec
            assert rec["x_gloo"] is not None
    table = (tmp_path / "table.md").read_text()
    assert "| 5 (max) | 20 | 2 | homagg/auto |" in table and "| 1 (min) | 4 | 2 | gloo |" in table


def test_percentiles_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    got = percentiles(list(reversed(values)))
    assert (got["p50"], got["p90"], got["p99"], got["mean"]) == (50.5, 90.0, 99.0, 50.5)
    assert percentiles([3.0])["p99"] == 3.0


def _homagg(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "homagg", "bench", "latency", *argv], cwd=ROOT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("option,value,says", [
    ("--world", "0", f"--world 0 outside 1..{MAX_WORKERS}"),
    ("--world", str(MAX_WORKERS + 1), f"--world {MAX_WORKERS + 1} outside 1..{MAX_WORKERS}"),
    ("--world", "2,1000", "--world 1000 outside"),  # never hundreds of rank processes
    ("--numel", "0", "--numel 0 outside"),
    ("--numel", str(1 << 27), f"--numel {1 << 27} outside"),
    ("--calls", "0", "--calls 0: need at least 1"),
    ("--warmup", "-1", "--warmup -1: need at least 0"),
    ("--timeout", "nan", "--timeout nan: need > 0 seconds"),
    ("--timeout", "0", "--timeout 0: need > 0 seconds"),
    ("--backends", "gloo,mpi", "--backends mpi: choose from gloo, homagg"),
    ("--scheme", "zip", "--scheme zip: choose from"),
    ("--input", "old", "--input old: choose from fresh, same"),
    ("--pace", "fast", "--pace fast: choose from loop, barrier"),
    ("--op", "sum,prod", "--op prod: choose from sum, max, min"),
])
def test_bad_option_is_a_config_error_and_starts_nothing(option: str, value: str, says: str,
                                                         tmp_path: Path) -> None:
    r = _homagg("--out", str(tmp_path / "out"), option, value)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stdout == "", r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("homagg: error: ConfigError: ") and says in line, line
    assert not (tmp_path / "out").exists()  # refused before anything was made


def test_sizes_beyond_this_hosts_memory_are_refused(tmp_path: Path) -> None:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    numel = 1 << 26  # the largest size taken: 32 ranks x 12 bytes x 2**26 = 24 GiB
    if 12 * numel * 32 + 16 * numel <= memory:
        pytest.skip("this host holds 32 ranks of the largest size")
    r = _homagg("--out", str(tmp_path / "out"), "--world", "32", "--numel", str(numel))
    assert r.returncode == 2 and f"--numel {numel}: 32 rank(s) need" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def _launched_by(launcher: int) -> list[int]:
    """Live (not zombie) processes whose environment names ``launcher`` as their rank launcher."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if f"{LAUNCHER_ENV}={launcher}".encode() in environ and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's")
def test_killed_command_leaves_no_rank_behind(tmp_path: Path) -> None:
    """SIGKILL the command while its ranks run: ranks (and rank 0's emulator) are gone within seconds."""
    cmd = [sys.executable, "-m", "homagg", "bench", "latency", "--world", "2", "--numel", "1", "--calls", "1000000",
           "--warmup", "0", "--backends", "homagg", "--no-limit", "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while len(_launched_by(proc.pid)) < 3 and time.monotonic() < deadline:  # 2 ranks + the emulator
            assert proc.poll() is None, "the command ended before its ranks ran"
            time.sleep(0.2)
        started = _launched_by(proc.pid)
        assert len(started) >= 3, f"ranks did not start: {started}"
        assert len(started) == 3, f"more processes than 2 ranks and an emulator: {started}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 20
    while _launched_by(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _launched_by(proc.pid) == [], "processes outlived the killed command"
