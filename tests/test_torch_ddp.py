"""DDP over the ``homagg`` group: training equals the in-process replay and gloo's, hooks, failures,
torchrun entry point.

The rank script (``tests/_dist_scripts/ddp.py``) returns its final parameters; the oracle is
computed here: ``_ddp_model.reference`` replays the same steps in one process (DDP averages
gradients, so the parameters must match the mean-loss training of one model).  Lossy comm hooks
(PowerSGD, fp16) have no such replay: for them gloo's training with the same hook is the oracle.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _ddp_model import SCENARIOS, reference  # noqa: E402
from _launch import REPO, SCRIPTS, entry_point_site, free_port, launch, tensor_from_json  # noqa: E402

FOUR_RANKS = ["basic", "find_unused", "powersgd_hook"]
REPLAY_TOL = 1e-5  # fixed point + float summation order, over 5 SGD steps
_cache: dict[int, list[dict[str, Any]]] = {}


def ddp_results(world: int) -> list[dict[str, Any]]:
    if world not in _cache:
        args = list(SCENARIOS) if world == 2 else FOUR_RANKS
        _cache[world] = launch("ddp.py", world, args=args, timeout=300)[0]
    return _cache[world]


def check_scenario(world: int, scenario: str) -> None:
    per_rank = [res[scenario] for res in ddp_results(world)]
    for rank, value in enumerate(per_rank):
        assert isinstance(value, dict), f"rank {rank}: {value}"
    mine = [tensor_from_json(v["homagg"]["params"]) for v in per_rank]
    theirs = [tensor_from_json(v["gloo"]["params"]) for v in per_rank]
    for rank, (m, t) in enumerate(zip(mine, theirs)):
        assert torch.equal(m, mine[0]), f"rank {rank}: parameters differ across ranks"
        err = float((m - t).abs().max())
        assert err <= SCENARIOS[scenario].get("tol", 1e-5), f"rank {rank}: max |homagg - gloo| = {err}"
        bm, bt = (tensor_from_json(per_rank[rank][side]["buffers"]) for side in ("homagg", "gloo"))
        assert bm.shape == bt.shape and bool(((bm - bt).abs() <= 1e-4).all()), f"rank {rank}: buffers"
    if SCENARIOS[scenario].get("exact", True):
        want = reference(world, scenario)
        err = float((mine[0] - want).abs().max())
        assert err <= REPLAY_TOL, f"max |homagg - one-process replay| = {err}"
        assert float((theirs[0] - want).abs().max()) <= REPLAY_TOL, "gloo disagrees with the replay"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_ddp_two_ranks_matches_replay_and_gloo(scenario: str) -> None:
    check_scenario(2, scenario)


@pytest.mark.parametrize("scenario", FOUR_RANKS)
def test_ddp_four_ranks_matches_replay_and_gloo(scenario: str) -> None:
    check_scenario(4, scenario)


@pytest.mark.parametrize("world", [2, 4])
def test_destroy_after_ddp_leaves_no_threads(world: int) -> None:
    for rank, res in enumerate(ddp_results(world)):
        assert res["threads_after_destroy"] == ["MainThread"]
        before, after = res["os_threads"]
        assert after <= before, (rank, res["os_thread_names"])
        assert res["live_groups"] == 0


def test_switch_failure_surfaces_typed_from_backward() -> None:
    """With ``fallback="error"`` (the default ``host`` continues: tests/test_switch_fallback.py)."""
    timeout = 3.0
    results, outputs = launch("failure.py", 2, env={"HOMAGG_TIMEOUT": str(timeout), "HOMAGG_EMULATOR_FAULTS": "1",
                                                    "HOMAGG_FALLBACK": "error"}, timeout=120)
    for rank, (res, out) in enumerate(zip(results, outputs)):
        assert res.get("type") == "SwitchTimeoutError" and res["is_homagg"], (rank, res)
        assert res["step"] == 2
        assert res["seconds"] <= timeout + 5.0, res
        assert res["after"] == "SwitchTimeoutError"  # the group stays unusable, same typed error
        assert res["destroy_seconds"] < 15.0
        assert "terminate called" not in out and "Aborted" not in out


def test_a_gone_peer_fails_the_gloo_side_collectives_typed() -> None:
    timeout = 5.0
    results, outputs = launch("peer_exit.py", 2, env={"HOMAGG_TIMEOUT": str(timeout)}, timeout=120)
    assert results[1]["left"] and results[0]["sum"] == results[1]["sum"] == [2.0] * 4
    res = results[0]
    for op in ("barrier", "broadcast"):
        got = res[op]
        assert got is not None, (op, res)  # a collective with a dead peer cannot succeed
        assert got["is_homagg"] and got["seconds"] <= timeout + 5.0, (op, got)
    # the barrier's switch round finds rank 1's presence socket closed: well before the switch timeout
    barrier = res["barrier"]
    assert barrier["type"] == "RankTimeoutError" and barrier["ranks"] == [1], barrier
    assert barrier["seconds"] < 3.0 and "rank(s) 1 of the group are gone" in barrier["message"], barrier
    assert res["broadcast"]["type"] in ("TransportError", "SwitchTimeoutError", "RankTimeoutError"), res
    assert res["destroy_seconds"] < 15.0
    assert "terminate called" not in outputs[0] and "Aborted" not in outputs[0]


def test_unmodified_torchrun_script_uses_entry_point(tmp_path: Path) -> None:
    site = entry_point_site(tmp_path)
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
