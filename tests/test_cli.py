"""The ``homagg`` command line and cheap imports: lazy command tree, ``homagg switch`` addresses,
``homagg bench codec``'s table, and which modules start without torch."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import homagg
from homagg.cli import COMMANDS, main, selected_command
from switch_emulator._cli import addresses

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_help_lists_every_command_without_importing_them() -> None:
    out = _python(
        "import sys\n"
        "from homagg.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "mods = [m for m in sys.modules if m in ('torch', 'numpy', 'switch_emulator') or m.startswith('homagg.bench')]\n"
        "print('IMPORTED', sorted(mods))\n"
    )
    assert "IMPORTED []" in out
    for top in {path[0] for path, _, _ in COMMANDS}:
        assert top in out


@pytest.mark.parametrize("code", [
    "import homagg.wire, homagg.jobs, homagg.transport._control",
    "import homagg.transport; homagg.transport.ControlClient; homagg.transport.parse_addr",
    "import switch_emulator._cli",
])
def test_modules_that_start_without_torch(code: str) -> None:
    assert _python(f"import sys\n{code}\nprint('torch' in sys.modules)").split() == ["False"]


def test_selected_command() -> None:
    assert selected_command(["bench", "codec", "--numel", "5"]) == ("bench", "codec")
    assert selected_command(["switch", "--listen", "h:1"]) == ("switch",)
    assert selected_command(["--help"]) is None
    assert selected_command(["bench", "--help"]) is None
    assert selected_command(["nope"]) is None


@pytest.mark.parametrize("path,module", [(p, m) for p, m, _ in COMMANDS], ids=[" ".join(p) for p, _, _ in COMMANDS])
def test_every_command_help(path: tuple[str, ...], module: str, capsys: pytest.CaptureFixture[str]) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not part of this checkout")
    with pytest.raises(SystemExit) as exc:
        main([*path, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: homagg {' '.join(path)} [-h]") and "--" in out.split("options:")[1].replace("--help", "")


def test_bad_switch_address_is_a_config_error() -> None:
    with pytest.raises(homagg.ConfigError, match="--listen: IPv6 address"):
        addresses("::1:5", None)
    with pytest.raises(homagg.ConfigError, match=r"--listen port \+ 1"):
        addresses("h:65535", None)


def test_switch_control_defaults_to_listen_port_plus_one() -> None:
    assert addresses("10.0.0.9:5000", None) == (("10.0.0.9", 5000), ("127.0.0.1", 5001))  # control: loopback
    assert addresses("[::1]:5000", None) == (("::1", 5000), ("::1", 5001))
    assert addresses("10.0.0.9:0", None) == (("10.0.0.9", 0), ("127.0.0.1", 0))
    assert addresses("10.0.0.9:5000", "127.0.0.1:7") == (("10.0.0.9", 5000), ("127.0.0.1", 7))


def _free_pair() -> int:
    """A UDP port p with TCP port p + 1 free too (checked, then released)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind(("127.0.0.1", 0))
            port = u.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise AssertionError("no free port pair")


def test_switch_process_serves_control_on_data_port_plus_one() -> None:
    for attempt in range(3):
        port = _free_pair()
        proc = subprocess.Popen([sys.executable, "-m", "switch_emulator", "--listen", f"127.0.0.1:{port}",
                                 "--ready-json", "--quiet", "--watch-stdin"], cwd=ROOT, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line and attempt < 2:
                continue  # a port of the pair was taken in between
            info = json.loads(line)
            assert info["data"] == ["127.0.0.1", port] and info["control"] == ["127.0.0.1", port + 1]
            from homagg.transport import ControlClient

            with ControlClient(("127.0.0.1", port + 1)) as ctl:
                assert tuple(ctl.ping()["data"]) == ("127.0.0.1", port)
            return
        finally:
            proc.kill()
            proc.wait(10)
    raise AssertionError("the emulator never started")


def test_bench_codec_table_is_not_cut_at_80_columns(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["bench", "codec", "--numel", "2000", "--repeats", "1", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    for header in ("scheme", "encode ms", "decode ms", "bytes/worker", "x dense", "rounds", "(enc+dec)/add"):
        assert header in out
    assert "auto (" in out and max(len(line) for line in out.splitlines()) > 80


def test_bench_switch_table_is_not_cut_at_80_columns(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["bench", "switch", "--workers", "2", "--numel", "20k", "--repeats", "1"]) == 0  # sizes as every bench takes them
    out = capsys.readouterr().out
    assert "…" not in out
    for header in ("workers", "numel", "homagg s", "gloo s", "homagg Gbit/s", "gloo Gbit/s", "retx", "spurious"):
        assert header in out
