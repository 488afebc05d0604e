"""DDP over the ``homagg`` group: training equals gloo's, hooks, failures, torchrun entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import REPO, SCRIPTS, free_port, launch  # noqa: E402

SCENARIOS = ["basic", "sparse_embedding", "find_unused", "no_sync", "static_graph", "batchnorm",
             "powersgd_hook", "fp16_hook", "homagg_comm_hook"]
_cache: dict[int, list[dict[str, Any]]] = {}


def ddp_results(world: int) -> list[dict[str, Any]]:
    if world not in _cache:
        args = SCENARIOS if world == 2 else ["basic", "find_unused", "powersgd_hook"]
        _cache[world] = launch("ddp.py", world, args=args, timeout=300)[0]
    return _cache[world]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ddp_two_ranks_matches_gloo(scenario: str) -> None:
    for rank, res in enumerate(ddp_results(2)):
        value = res[scenario]
        assert isinstance(value, dict), f"rank {rank}: {value}"


@pytest.mark.parametrize("scenario", ["basic", "find_unused", "powersgd_hook"])
def test_ddp_four_ranks_matches_gloo(scenario: str) -> None:
    for rank, res in enumerate(ddp_results(4)):
        assert isinstance(res[scenario], dict), f"rank {rank}: {res[scenario]}"


@pytest.mark.parametrize("world", [2, 4])
def test_destroy_after_ddp_leaves_no_threads(world: int) -> None:
    for rank, res in enumerate(ddp_results(world)):
        assert res["threads_after_destroy"] == ["MainThread"]
        before, after = res["os_threads"]
        assert after <= before, (rank, res["os_thread_names"])
        assert res["live_groups"] == 0


def test_switch_failure_surfaces_typed_from_backward() -> None:
    timeout = 3.0
    results, outputs = launch("failure.py", 2, env={"HOMAGG_TIMEOUT": str(timeout)}, timeout=120)
    for rank, (res, out) in enumerate(zip(results, outputs)):
        assert res.get("type") == "SwitchTimeoutError" and res["is_homagg"], (rank, res)
        assert res["step"] == 2
        assert res["seconds"] <= timeout + 5.0, res
        assert res["after"] == "SwitchTimeoutError"  # the group stays unusable, same typed error
        assert res["destroy_seconds"] < 15.0
        assert "terminate called" not in out and "Aborted" not in out


def _entry_point_dir(tmp_path: Path) -> Path:
    """A site dir declaring homagg's ``torch.backends`` entry point, as an installed wheel does."""
    info = tmp_path / "homagg_entrypoint_test-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: homagg-entrypoint-test\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nhomagg = homagg._autoload:autoload\n")
    return tmp_path


def test_unmodified_torchrun_script_uses_entry_point(tmp_path: Path) -> None:
    site = _entry_point_dir(tmp_path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site), env.get("PYTHONPATH", "")])
    env.pop("HOMAGG_SWITCH", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(SCRIPTS / "plain_ddp.py")]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert out.count("plain_ddp ok backend=homagg") == 2, out[-4000:]
    assert "terminate called" not in out
    assert time.monotonic() - t0 < 180
