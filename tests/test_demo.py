"""``homagg demo`` end to end: embedded emulator, worker processes, every scheme, exit status 0."""

from __future__ import annotations

import subprocess
import sys

import pytest

import switch_emulator
from homagg.cli import main


def test_demo_exact(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workers", "3", "--numel", "30000", "--words-per-packet", "256"]) == 0
    out = capsys.readouterr().out
    for scheme in ("auto", "sketch", "compact", "dense"):
        assert scheme in out
    assert "all results exact" in out and "NO" not in out


def test_demo_exact_with_loss(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--workers", "2", "--numel", "20000", "--drop", "0.01", "--words-per-packet", "64"]) == 0
    out = capsys.readouterr().out
    assert "all results exact" in out
    assert "injected" in out


def test_demo_external_switch(capsys: pytest.CaptureFixture[str]) -> None:
    with switch_emulator.start() as sw:
        host, port = sw.data_addr
        chost, cport = sw.control_addr
        rc = main(["demo", "--workers", "2", "--numel", "5000", "--switch", f"{host}:{port}",
                   "--control", f"{chost}:{cport}", "--schemes", "dense,compact"])
    assert rc == 0
    assert "all results exact" in capsys.readouterr().out


def test_demo_bad_options() -> None:
    assert main(["demo", "--workers", "0"]) == 2  # ConfigError -> exit status 2


@pytest.mark.slow
def test_console_entry_point_runs() -> None:
    r = subprocess.run([sys.executable, "-m", "homagg", "demo", "--workers", "2", "--numel", "4000",
                        "--schemes", "auto"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
