"""Options of the homagg backend (env / pg_options / validation) and its registration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

import homagg
from homagg.jobs import format_addr, parse_addr
from homagg.torch import BackendConfig, is_registered, register

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import entry_point_site  # noqa: E402


def test_defaults() -> None:
    cfg = BackendConfig.resolve(None, env={})
    assert (cfg.switch, cfg.scheme, cfg.timeout, cfg.slots) == ("embedded", "auto", 30.0, None)
    assert cfg.external_address is None and cfg.control_address is None


def test_return_attempts() -> None:
    assert BackendConfig.resolve(None, env={}).return_attempts == 3
    assert BackendConfig.resolve(None, env={"HOMAGG_RETURN_ATTEMPTS": "0"}).return_attempts == 0  # never return
    assert BackendConfig.resolve({"return_attempts": 7}, env={"HOMAGG_RETURN_ATTEMPTS": "1"}).return_attempts == 7


def test_env_then_pg_options_precedence() -> None:
    env = {"HOMAGG_SWITCH": "10.0.0.1:18497", "HOMAGG_SCHEME": "Sketch", "HOMAGG_TIMEOUT": "5"}
    cfg = BackendConfig.resolve(None, env=env)
    assert cfg.switch == "10.0.0.1:18497" and cfg.scheme == "sketch" and cfg.timeout == 5.0
    assert cfg.control_address == ("10.0.0.1", 18498)
    cfg = BackendConfig.resolve({"scheme": "dense", "switch": "gloo", "codec": {"block_size": 256}}, env=env)
    assert cfg.switch == "gloo" and cfg.scheme == "dense" and cfg.timeout == 5.0 and cfg.codec == {"block_size": 256}
    cfg = BackendConfig.resolve({"switch": "[::1]:9000", "switch_control": "h:1"}, env={})
    assert cfg.external_address == ("::1", 9000) and cfg.control_address == ("h", 1)
    assert cfg.switch == "[::1]:9000"  # normalised, readable by parse_addr again


@pytest.mark.parametrize(
    "options",
    [
        {"scheme": "zip"},
        {"switch": "nohostport"},
        {"switch": "h:0"},
        {"switch": "h:x"},
        {"switch": "::1:9000"},
        {"switch": ":9000"},
        {"switch_control": "h:65536"},
        {"words_per_packet": 16001},
        {"timeout": 0},
        {"timeout": "soon"},
        {"timeout": float("inf")},
        {"slots": 0},
        {"words_per_packet": 1.5},
        {"codec": {"not an identifier": 1}},
        {"unknown_key": 1},
        {"return_attempts": -1},
        {"return_attempts": 2.5},
        {"return_attempts": "often"},
    ],
)
def test_invalid_options_raise_config_error(options: dict) -> None:
    with pytest.raises(homagg.ConfigError):
        BackendConfig.resolve(options, env={})


def test_invalid_env_names_the_variable() -> None:
    with pytest.raises(homagg.ConfigError, match="HOMAGG_SCHEME"):
        BackendConfig.resolve(None, env={"HOMAGG_SCHEME": "bogus"})
    with pytest.raises(homagg.ConfigError):
        BackendConfig.resolve(["not", "a", "dict"], env={})


def test_capped_by_group_timeout() -> None:
    assert BackendConfig(timeout=30.0).capped(10.0).timeout == 10.0
    assert BackendConfig(timeout=5.0).capped(10.0).timeout == 5.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a:1", ("a", 1)),
        (" 10.0.0.1:18497 ", ("10.0.0.1", 18497)),
        ("[::1]:9000", ("::1", 9000)),
        ("[fe80::1%eth0]:0", ("fe80::1%eth0", 0)),
        (("h", 5), ("h", 5)),
    ],
)
def test_parse_addr_accepts(text: str | tuple, expected: tuple[str, int]) -> None:
    assert parse_addr(text) == expected
    assert parse_addr(format_addr(expected)) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nohostport", "expected 'HOST:PORT'"),
        ("::1:9000", "needs brackets"),
        ("[::1", "bracketed"),
        ("[::1]9000", "bracketed"),
        (":9000", "empty host"),
        ("h:x", "not an integer"),
        ("h:65536", "outside 0..65535"),
        (("h", -1), "outside 0..65535"),
    ],
)
def test_parse_addr_rejects_with_config_error(text: str | tuple, message: str) -> None:
    with pytest.raises(homagg.ConfigError, match=f"^listen: .*{message}"):
        parse_addr(text, source="listen")


def test_parse_addr_default_port_and_zero_port() -> None:
    assert parse_addr("h", default_port=7) == ("h", 7)
    assert parse_addr("[::1]", default_port=7) == ("::1", 7)
    assert parse_addr("h:0") == ("h", 0)
    with pytest.raises(homagg.ConfigError, match="outside 1..65535"):
        parse_addr("h:0", zero_port=False)


def test_register_is_idempotent() -> None:
    register()
    register()
    assert is_registered()
    assert "homagg" in dist.Backend.backend_capability
    assert dist.Backend.backend_capability["homagg"] == ["cpu", "cuda"]


_PROBE = (
    "import sys, torch\n"
    "import torch.distributed as dist\n"
    "during_import = 'HOMAGG' in dist.Backend._plugins and 'homagg._autoload' in sys.modules\n"
    "import homagg._autoload as a\n"
    "a.autoload(); a.autoload()\n"
    "print(during_import, 'HOMAGG' in dist.Backend._plugins, dist.is_backend_available('homagg'))\n"
)


@pytest.mark.parametrize("autoload", ["1", "0"])
def test_autoload_entry_point_during_import_torch(tmp_path: Path, autoload: str) -> None:
    """``import torch`` alone registers the backend through the entry point (no circular import:
    it runs while torch is still importing); with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` it does not,
    and calling the entry point (twice: idempotent) registers it."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD=autoload)
    env["PYTHONPATH"] = os.pathsep.join([str(entry_point_site(tmp_path)), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    during_import = "True" if autoload == "1" else "False"
    assert r.stdout.split() == [during_import, "True", "True"], r.stdout + r.stderr[-3000:]
