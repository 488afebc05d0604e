"""A switch failure does not end the run: the group falls back to the host path and comes back.

Real parts only: rank processes of a ``homagg`` process group, the embedded emulator or a
standalone one (``python -m switch_emulator``) SIGKILLed and started again.  Oracles: the exact
integer-valued sums, the same results on every rank bit for bit, and an undisturbed DDP run (the
host path runs the same codec with gloo combining the words, so a disturbed run is bit-identical).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests._dist_scripts._launch import REPO, free_port, launch, process_alive, tensor_from_json

pytestmark = pytest.mark.slow


def _oracle(n: int, world: int, call: int) -> torch.Tensor:
    base = (torch.arange(n, dtype=torch.float64) % 1000)
    return (sum(base * (r + 1) + call for r in range(world))).to(torch.float32)


@pytest.mark.parametrize(("following", "n"), [("allreduce", 100_000), ("broadcast", 100_000), ("allreduce", 100)])
def test_result_reached_some_ranks_then_the_switch_died(following: str, n: int) -> None:
    """Ranks 0 and 1 get a call's result, rank 2 does not (muted at the emulator); then the emulator
    is killed.  Rank 2 gets the result the others hold; nothing is summed twice.  100 elements: the
    small-call path, whose held result is a host-array round's."""
    results, _ = launch("fallback_partial.py", 3, timeout=120,
                        env={"NEXT": following, "N": str(n), "HOMAGG_EMULATOR_FAULTS": "1", "HOMAGG_TIMEOUT": "10"})
    muted = [tensor_from_json(r["muted"]) for r in results]
    for r, res in enumerate(results):
        assert torch.equal(muted[r], _oracle(n, 3, 1)), f"rank {r}: wrong result of the muted call"
        expected = _oracle(n, 3, 2) if following == "allreduce" else (torch.arange(n) % 1000) * 2.0 + 2
        assert torch.equal(tensor_from_json(res["following"]), expected), f"rank {r}: wrong {following}"
        assert res["path"] == "host"
        assert res["link"] == {"kind": "host", "job": None}  # pg.switch: the host path, not the dead link
        assert [(t["from"], t["to"]) for t in res["transitions"]] == [("switch", "host")], res["transitions"]
        assert len(res["warnings"]) == 1 and "host path" in res["warnings"][0]
    # ranks 0 and 1 finished the muted call on the switch, rank 2 only after the crash
    assert [r["path_after_muted"] for r in results] == ["switch", "switch", "host"]
    assert results[2]["seconds"] > results[0]["seconds"]
    if following == "allreduce":  # the warm-up call on the switch, then the muted one, then the next
        assert results[0]["paths"] == {"switch": 2, "host": 1}
        assert results[2]["paths"] == {"switch": 1, "host": 2}
    else:
        assert "lost the switch" in results[0]["transitions"][0]["cause"]


def test_ranks_a_round_apart_inside_one_call() -> None:
    """Rank 2 misses the results of a call's first round, ranks 0 and 1 wait in its second round:
    the switch is alive but stalled, so each rank falls back at its progress timeout; ranks 0 and 1
    hand rank 2 the first round's words and redo their second round on the host path."""
    n = 300_000
    results, _ = launch("fallback_partial.py", 3, timeout=120,
                        env={"NEXT": "allreduce", "N": str(n), "HOMAGG_EMULATOR_FAULTS": "1", "HOMAGG_TIMEOUT": "3"})
    for r, res in enumerate(results):
        assert torch.equal(tensor_from_json(res["muted"]), _oracle(n, 3, 1)), f"rank {r}"
        assert torch.equal(tensor_from_json(res["following"]), _oracle(n, 3, 2)), f"rank {r}"
        assert res["path_after_muted"] == "host"
        assert res["paths"] == {"switch": 1, "host": 2}
        assert "no progress" in res["transitions"][0]["cause"]


def _ddp(env: dict[str, str]) -> list[dict]:
    results, _ = launch("fallback_ddp.py", 2, timeout=240, env={"HOMAGG_TIMEOUT": "10", **env})
    return results


@pytest.fixture(scope="module")
def undisturbed() -> list[dict]:
    return _ddp({"CRASH": "none", "STEP_S": "0"})


def _check_disturbed(results: list[dict], undisturbed: list[dict]) -> None:
    params = [tensor_from_json(r["params"]) for r in results]
    assert torch.equal(params[0], params[1]), "ranks ended with different parameters"
    assert torch.equal(params[0], tensor_from_json(undisturbed[0]["params"])), "parameters differ from the undisturbed run"
    for res, ref in zip(results, undisturbed, strict=True):
        assert res["losses"] == ref["losses"]  # bit-identical: the host path runs the same codec
        assert len(res["losses"]) >= 50
        moves = [(t["from"], t["to"]) for t in res["transitions"] if t["from"] != t["to"]]
        assert moves == [("switch", "host"), ("host", "switch")], res["transitions"]
        assert res["stats_paths"]["host"] >= 1 and res["stats_paths"]["switch"] >= 1
        assert res["paths"][0] == "switch" and "host" in res["paths"] and res["paths"][-1] == "switch"
        # pg.switch is the link in use: the host path's after the fallback, the new switch's after the return
        assert [kind == "host" for kind, _ in res["links"]] == [p == "host" for p in res["paths"]], res["links"]
        assert len(res["warnings"]) == 2


def test_ddp_survives_the_embedded_emulator_killed(undisturbed: list[dict]) -> None:
    """The embedded emulator is SIGKILLed at step 15; the group goes on on the host path and starts
    a new emulator at its next probe."""
    _check_disturbed(_ddp({"CRASH": "embedded", "KILL_AT": "15", "HOMAGG_PROBE_INTERVAL": "0.5"}), undisturbed)


def _start_emulator(port: int, secret: str, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "switch_emulator", "--listen", f"127.0.0.1:{port}", "--control",
           f"127.0.0.1:{port + 1}", "--log-level", "warning", "--ready-json", *args]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO), "HOMAGG_SWITCH_SECRET": secret},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=str(REPO))
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the --ready-json line: bound and serving
    assert line.startswith(b"{"), line
    return proc


def _external_run(tmp_path: Path, restart_at: int, *restart_args: str, **env: str) -> tuple[list[dict], list[str]]:
    """DDP through a standalone emulator that an operator SIGKILLs at step 15 and starts again at
    the same address (with ``restart_args``) at step ``restart_at``; every emulator is gone after."""
    port = free_port()
    while port + 1 > 65535:
        port = free_port()
    secret = os.urandom(16).hex()
    progress = tmp_path / "progress"
    procs = [_start_emulator(port, secret)]
    done = threading.Event()
    log: list[str] = []

    def operator() -> None:
        killed = False
        while not done.is_set():
            step = int(progress.read_text() or 0) if progress.exists() else -1
            if not killed and step >= 15:
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait(10)
                killed = True
                log.append(f"killed at step {step}")
            if killed and step >= restart_at:
                procs.append(_start_emulator(port, secret, *restart_args))
                log.append(f"restarted at step {step}")
                return
            time.sleep(0.005)

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    try:
        results = _ddp({"CRASH": "external", "HOMAGG_SWITCH": f"127.0.0.1:{port}", "HOMAGG_SWITCH_SECRET": secret,
                        "PROGRESS": str(progress), "HOMAGG_PROBE_INTERVAL": "0.2", "HOMAGG_TIMEOUT": "30", **env})
    finally:
        done.set()
        thread.join(10)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
    assert not any(process_alive(p.pid) for p in procs)
    assert len(log) == 2, log
    return results, log


@pytest.mark.parametrize("restart_at", [30, 15])
def test_ddp_survives_an_external_emulator_killed_and_restarted(tmp_path: Path, undisturbed: list[dict],
                                                                 restart_at: int) -> None:
    """A standalone emulator is SIGKILLed at step 15 and a new one started at the same address at
    step 30 (what an operator restarting the switch does), or at once: then the switch answers
    before any rank saw it dead, but has lost the job, which the ranks' liveness probe asks it
    (found in seconds, not at the 30 s progress timeout).  The run finishes on the switch."""
    results, log = _external_run(tmp_path, restart_at)
    _check_disturbed(results, undisturbed)
    fallback = results[0]["transitions"][0]
    assert fallback["detect_s"] < 10, fallback  # the liveness probe, not the 30 s progress timeout
    if restart_at == 15:
        assert "no longer holds this job" in fallback["cause"], fallback
    print(json.dumps({"operator": log, "transitions": results[0]["transitions"]}))


def test_ddp_stays_on_the_host_path_when_the_switch_comes_back_forwarding_nothing(
        tmp_path: Path, undisturbed: list[dict]) -> None:
    """The standalone emulator comes back at step 30 dropping every datagram (it answers its control
    port and admits jobs).  Each return's canary round fails within a few retransmission timeouts
    (before: every return cost the 30 s progress timeout), and after ``return_attempts`` (2) failed
    returns the group stays on the host path, with one warning; the run is bit-identical."""
    results, log = _external_run(tmp_path, 30, "--drop", "1", "--engine", "python", HOMAGG_RETURN_ATTEMPTS="2")
    params = [tensor_from_json(r["params"]) for r in results]
    assert torch.equal(params[0], params[1]) and torch.equal(params[0], tensor_from_json(undisturbed[0]["params"]))
    for res, ref in zip(results, undisturbed, strict=True):
        assert res["losses"] == ref["losses"]
        moves = [(t["from"], t["to"]) for t in res["transitions"] if t["from"] != t["to"]]
        assert moves == [("switch", "host")], res["transitions"]  # never back on a switch that forwards nothing
        failed = [t for t in res["transitions"] if t["from"] == t["to"] == "host" and not t.get("gave_up")]
        assert len(failed) == 2 and all("canary round failed" in t["cause"] or "another rank" in t["cause"]
                                        for t in failed), res["transitions"]
        assert all(t["readmit_s"] < 10 for t in failed), failed  # a few RTOs, not the 30 s timeout
        assert res["transitions"][-1].get("gave_up"), res["transitions"]
        first_host = res["paths"].index("host")
        assert first_host >= 15 and set(res["paths"][first_host:]) == {"host"}, res["paths"]
        stays = [w for w in res["warnings"] if "stays on the host path" in w]
        assert len(stays) == 1 and len(res["warnings"]) == 2, res["warnings"]  # the fallback, then giving up
    print(json.dumps({"operator": log, "transitions": results[0]["transitions"]}))


@pytest.mark.parametrize("kill", [True, False])
def test_the_last_call_reached_some_ranks_then_the_group_closed(kill: bool) -> None:
    """The muted call is the group's last: ranks 0 and 1 get its result and destroy the group while
    rank 2 still waits.  Their close meets rank 2's agreement (when it finds the switch killed, or
    stalled at its progress timeout), so rank 2 ends with the result instead of an error."""
    n = 100_000
    results, outputs = launch("fallback_partial.py", 3, timeout=120,
                              env={"NEXT": "none", "KILL": str(int(kill)), "N": str(n), "HOMAGG_EMULATOR_FAULTS": "1",
                                   "HOMAGG_TIMEOUT": "10" if kill else "3"})
    for r, res in enumerate(results):
        assert torch.equal(tensor_from_json(res["muted"]), _oracle(n, 3, 1)), f"rank {r}: wrong result of the last call"
    assert [r["path_after_muted"] for r in results] == ["switch", "switch", "host"]
    assert results[2]["paths"] == {"switch": 1, "host": 1}
    assert len(results[2]["warnings"]) == 1 and "host path" in results[2]["warnings"][0]
    assert "RuntimeWarning" not in "".join(outputs)  # every close confirmed the last call


def _faults(scenario: str, **env: str) -> list[dict]:
    results, _ = launch("switch_faults.py", 2, timeout=180,
                        env={"SCENARIO": scenario, "HOMAGG_PROBE_INTERVAL": "0.2", "HOMAGG_TIMEOUT": "30", **env})
    return results


def _data(rank: int, call: int, n: int = 50_000) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float32) % 1000) * (rank + 1) + call


def test_a_failed_emulator_restart_keeps_the_group_on_the_host_path() -> None:
    """The embedded emulator is killed and cannot be started again (its command line refuses rank
    0's environment): each return fails at once on every rank (rank 0 publishes its error), the calls
    go on on the host path with exact sums, and after ``return_attempts`` failures the group stops
    trying, with one warning."""
    results = _faults("restart_fails", CALLS="10", HOMAGG_RETURN_ATTEMPTS="2")
    for r, res in enumerate(results):
        assert res["error"] is None, res["error"]
        assert torch.equal(tensor_from_json(res["first"]), _data(0, 0) + _data(1, 0))
        assert len(res["calls"]) == 10
        for c, call in enumerate(res["calls"], start=1):
            assert torch.equal(tensor_from_json(call["result"]), _data(0, c) + _data(1, c)), f"rank {r} call {c}"
            assert call["path"] == "host" and call["link"] == "host"
            assert call["seconds"] < 15.0, (r, c, call["seconds"])  # not the group timeout
        failed = [t for t in res["transitions"] if t["from"] == t["to"] == "host" and not t.get("gave_up")]
        assert len(failed) == 2, res["transitions"]
        assert "cannot start the embedded emulator" in failed[0]["cause"] or r != 0, failed
        assert "could not open the switch" in failed[0]["cause"] or r != 1, failed
        assert res["transitions"][-1].get("gave_up"), res["transitions"]
        stays = [w for w in res["warnings"] if "stays on the host path" in w]
        assert len(stays) == 1 and "2 returns to the switch failed" in stays[0], res["warnings"]


def test_an_emulator_that_drops_everything_is_an_error_in_seconds() -> None:
    """``HOMAGG_FALLBACK=error``: the switch holds the job and answers its control port but drops
    every datagram; the error arrives within seconds (not the 30 s timeout) and says what was seen."""
    results = _faults("drop_all", HOMAGG_FALLBACK="error", HOMAGG_EMULATOR_FAULTS="1", CALLS="1")
    for r, res in enumerate(results):
        error = res["error"]
        assert error is not None and error["type"] == "SwitchTimeoutError", (r, error)
        assert "holds this job but accepted none of its datagrams" in error["message"], error
        assert "drop_injected +" in error["message"], error
        assert error["seconds"] < 10.0, error  # ~2 s, not HOMAGG_TIMEOUT=30


def test_ddp_survives_an_embedded_emulator_that_drops_everything(undisturbed: list[dict]) -> None:
    """The embedded emulator starts dropping every datagram at step 15 (it stays up, holding the
    job): found in seconds, the group falls back and returns to a new emulator; bit-identical."""
    results = _ddp({"CRASH": "drop_all", "KILL_AT": "15", "HOMAGG_PROBE_INTERVAL": "0.5", "HOMAGG_TIMEOUT": "30",
                    "HOMAGG_EMULATOR_FAULTS": "1"})
    _check_disturbed(results, undisturbed)
    fallback = results[0]["transitions"][0]
    assert "accepted none of its datagrams" in fallback["cause"] and fallback["detect_s"] < 10, fallback
