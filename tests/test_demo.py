"""``homagg demo`` end to end: embedded emulator, worker processes, every scheme, exit status 0.

The demo's own verdicts are not trusted: its ``--json`` summary gives each scheme's result digest,
which must equal the digest of :func:`homagg.testing.local_allreduce` of the same inputs computed
here (in-process switch, no network), and those results are checked against the exact sum.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import switch_emulator
from homagg.cli import main
from homagg.testing import check_within_bound, digest, gradients, local_allreduce

SCHEMES = ("auto", "sketch", "compact", "dense")


def expected_digest(workers: int, numel: int, density: float = 0.01, seed: int = 0) -> str:
    """Digest of the exact-checked in-process result of the demo's inputs (same for every scheme)."""
    inputs = [gradients(r, numel, density, seed) for r in range(workers)]
    out = []
    for i in range(len(inputs[0])):
        column = [inp[i] for inp in inputs]
        res = local_allreduce(column, scheme="dense")[0]
        check_within_bound(res, column)
        out.append(res)
    return digest(out)


def run_demo(tmp_path: Path, *args: str) -> dict[str, Any]:
    path = tmp_path / "demo.json"
    assert main(["demo", *args, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def assert_exact(summary: dict[str, Any], schemes: tuple[str, ...], want: str) -> None:
    assert summary["ok"] and not summary["failures"]
    assert sorted(summary["schemes"]) == sorted(schemes)
    for scheme, v in summary["schemes"].items():
        assert v["ok"] and v["digests"] == [want], (scheme, v)


def test_demo_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = run_demo(tmp_path, "--workers", "3", "--numel", "30000", "--words-per-packet", "256")
    assert_exact(summary, SCHEMES, expected_digest(3, 30000))
    assert summary["switch"]["injected_drops"] == 0
    out = capsys.readouterr().out
    assert "all results exact" in out and "NO" not in out


def test_demo_exact_with_loss(tmp_path: Path) -> None:
    summary = run_demo(tmp_path, "--workers", "2", "--numel", "20000", "--drop", "0.01", "--words-per-packet", "64")
    assert_exact(summary, SCHEMES, expected_digest(2, 20000))
    # faults really happened: the switch dropped packets on purpose and the workers recovered them
    assert summary["switch"]["injected_drops"] > 0 and summary["switch"]["dropped"] >= summary["switch"]["injected_drops"]
    assert summary["retransmits"] > 0


def test_demo_external_switch(tmp_path: Path) -> None:
    with switch_emulator.start() as sw:
        host, port = sw.data_addr
        chost, cport = sw.control_addr
        summary = run_demo(tmp_path, "--workers", "2", "--numel", "5000", "--switch", f"{host}:{port}",
                           "--control", f"{chost}:{cport}", "--schemes", "dense,compact")
    assert_exact(summary, ("dense", "compact"), expected_digest(2, 5000))


def test_demo_bad_options() -> None:
    assert main(["demo", "--workers", "0"]) == 2  # ConfigError -> exit status 2


@pytest.mark.slow
def test_console_entry_point_runs(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    r = subprocess.run([sys.executable, "-m", "homagg", "demo", "--workers", "2", "--numel", "4000",
                        "--schemes", "auto", "--json", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_exact(json.loads(path.read_text()), ("auto",), expected_digest(2, 4000))
