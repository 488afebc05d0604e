"""The stage profiler of small calls (``python -m homagg.bench._stages``, docs/benchmarks.md 'Small
calls: where the time goes') still finds every function it times: a renamed function would
silently drop out of the profile, so the run reports what it could not wrap and this test fails.
No timing assertions: the figures' form only (a subprocess: the timers wrap classes in place)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from homagg.bench._stages import GAPS, STAGES, TOTAL

ROOT = Path(__file__).resolve().parent.parent


def _stages(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "stages.json"
    r = subprocess.run([sys.executable, "-m", "homagg.bench._stages", *argv, "--calls", "3", "--warmup", "1",
                        "--numel", "1,300,3000", "--json", str(out)], cwd=ROOT, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def _well_formed(result: dict) -> None:
    assert result["missing"] == [], f"functions the profile times are gone (renamed?): {result['missing']}"
    for numel in ("1", "300", "3000"):
        table = result["tables"][numel]
        for stage in (*STAGES, *GAPS, TOTAL):
            assert stage in table and table[stage]["wall_us"] >= 0 and table[stage]["cpu_us"] >= 0, stage
        assert table[TOTAL]["wall_us"] > 0 and result["plain_us"][numel] > 0


def test_local_profile_finds_every_function(tmp_path: Path) -> None:
    result = _stages(tmp_path, "--mode", "local", "--world", "2")
    _well_formed(result)
    table = result["tables"]["1"]  # the codec's stages ran on every worker thread (one block: the small path)
    assert table["small path: codec (values, exponent, guess, quantise, decode, history)"]["cpu_us"] > 0


@pytest.mark.parametrize("barrier", [False, True])
def test_process_group_profile_finds_every_function(tmp_path: Path, barrier: bool) -> None:
    result = _stages(tmp_path, "--mode", "pg", "--world", "2", *(["--barrier"] if barrier else []))
    _well_formed(result)
    assert result["barrier"] is barrier  # --barrier: a dist.barrier() before every call, recorded
    table = result["tables"]["1"]
    for stage in ("caller: PG.allreduce, Work, submit", "datagram I/O: C round loop (send, wait, receive); "
                  "local: the in-process switch", "completion: Work._complete (futures, events); inline: CompletedWork",
                  "small path: codec (values, exponent, guess, quantise, decode, history)"):
        assert table[stage]["cpu_us"] > 0, stage
    # 3,000 elements (3 blocks): steady calls take the mid-size path
    assert result["tables"]["3000"]["mid-size path: codec (exponents, guess, quantise, settle, decode, history)"][
        "cpu_us"] > 0
