"""Bad input at the command line (``homagg switch``, ``homagg demo``) as a new user types it: each
is a :class:`~homagg.ConfigError` that names the option and what it accepts, exit status 2, no
traceback, and nothing started.  The real CLI runs in a subprocess; with ``--watch-stdin`` and
stdin at EOF a switch that started anyway stops at once (exit 0), so no case can hang."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from homagg.wire import MAX_SLOTS, MAX_WORDS_JUMBO

ROOT = Path(__file__).resolve().parent.parent


def _homagg(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "homagg", *argv], cwd=ROOT, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def _switch(*argv: str) -> subprocess.CompletedProcess[str]:
    return _homagg("switch", "--listen", "127.0.0.1:0", "--quiet", "--ready-json", "--watch-stdin", *argv)


def _refused(r: subprocess.CompletedProcess[str], *words: str) -> None:
    """Exit status 2 with one ``ConfigError`` line holding ``words``; no traceback, no ready line."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and r.stdout == "", r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("homagg: error: ConfigError: "), line
    for w in words:
        assert w in line, (w, line)


@pytest.mark.parametrize("slots", ["-1", "0", str(MAX_SLOTS + 1), "100000000"])
def test_switch_slots_outside_the_slot_field(slots: str) -> None:
    _refused(_switch("--slots", slots), f"--slots {slots}", f"1..{MAX_SLOTS}")


@pytest.mark.parametrize("slots", ["1", str(MAX_SLOTS)])
def test_switch_slots_at_the_limits_start(slots: str) -> None:
    r = _switch("--slots", slots)
    assert r.returncode == 0 and '"data"' in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("option,value", [
    ("--listen", "999.1.1.1:5"),  # not an address: getaddrinfo fails
    ("--listen", "192.0.2.1:5"),  # TEST-NET-1: no interface of this host holds it
    ("--listen", "[::1]:0"),  # the emulator's sockets are IPv4
    ("--control", "999.1.1.1:5"),
])
def test_switch_address_that_cannot_be_bound(option: str, value: str) -> None:
    _refused(_switch(option, value), f"{option} {value}", "address of this host")


def test_switch_data_port_in_use() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        _refused(_switch("--listen", f"127.0.0.1:{port}", "--control", "127.0.0.1:0"),
                 f"--listen 127.0.0.1:{port}", "Address already in use")


def test_switch_secret_file_in_a_missing_folder(tmp_path: Path) -> None:
    path = tmp_path / "no-such-folder" / "secret"
    _refused(_switch("--secret-file", str(path)), f"--secret-file {path}", "existing folder")
    assert not path.parent.exists()


def test_switch_raw_backend_on_a_missing_interface() -> None:
    _refused(_switch("--backend", "raw", "--iface", "homagg-none0"), "--iface homagg-none0")


@pytest.mark.parametrize("option,value,accepts", [("--drop", "2", "[0, 1]"), ("--duplicate", "-0.1", "[0, 1)"),
                                                  ("--reorder", "nan", "[0, 1)")])
def test_switch_fault_rate_outside_its_range(option: str, value: str, accepts: str) -> None:
    _refused(_switch(option, value), f"{option} {value}", accepts)


@pytest.mark.parametrize("option,value,accepts", [
    ("--timeout", "0", "> 0"),
    ("--timeout", "nan", "> 0"),
    ("--words-per-packet", "0", f"1..{MAX_WORDS_JUMBO}"),  # 0 ran with the default K
    ("--slots", "0", f"1..{MAX_SLOTS}"),
    ("--drop", "2", "[0, 1]"),
])
def test_demo_refuses_before_it_starts_anything(option: str, value: str, accepts: str) -> None:
    _refused(_homagg("demo", "--workers", "1", "--numel", "100", "--schemes", "dense", option, value),
             f"{option} {value}", accepts)


@pytest.mark.parametrize("pool", [0, -1, MAX_SLOTS + 1])
def test_an_emulator_pool_outside_the_slot_field_is_refused(pool: int) -> None:
    """The same check for the emulator as a library (``Switch(pool_slots=...)``, the embedded default)."""
    from homagg import ConfigError
    from switch_emulator.switch import Switch

    with pytest.raises(ConfigError, match=rf"pool_slots {pool} outside 1\.\.{MAX_SLOTS}"):
        Switch(lambda d, a: None, pool_slots=pool)
    assert Switch(lambda d, a: None, pool_slots=MAX_SLOTS).admission.pool_slots == MAX_SLOTS


@pytest.mark.parametrize("argv,words", [
    (["bench", "codec", "--repeats", "0"], ["--repeats 0", "at least 1"]),  # was a StatisticsError traceback
    (["bench", "codec", "--workers", "0"], ["--workers 0", "at least 1"]),  # was an IndexError traceback
    (["bench", "codec", "--density", "2"], ["--density 2", "(0, 1]"]),  # ran as if density were 1
    (["bench", "switch", "--repeats", "0"], ["--repeats 0", "at least 1"]),  # StatisticsError after a run
    (["bench", "switch", "--timeout", "nan"], ["--timeout nan", "> 0"]),
])
def test_bench_refuses_before_it_measures(argv: list[str], words: list[str]) -> None:
    _refused(_homagg(*argv, "--numel", "1000"), *words)
