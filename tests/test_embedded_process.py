"""The embedded emulator runs in its own process, stops with the group, and dies with its owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._dist_scripts._launch import free_port, process_alive

REPO = Path(__file__).resolve().parents[1]

OWNER = r"""
import os, sys, time, torch, torch.distributed as dist
import homagg
dist.init_process_group("homagg", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
pg = dist.distributed_c10d._get_default_group()
emu = pg.switch.emulator
x = torch.arange(10, dtype=torch.float32)
dist.all_reduce(x)
print(emu.process.pid, float(x.sum()), flush=True)
if sys.argv[1] == "hang":
    time.sleep(600)
dist.destroy_process_group()
print("closed", flush=True)
time.sleep(600 if sys.argv[1] == "linger" else 0)
"""


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process_alive(pid):
            return True
        time.sleep(0.1)
    return False


def _start(mode: str) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", OWNER % free_port(), mode], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if not line:
        proc.kill()
        pytest.fail(f"owner process printed nothing (exit {proc.wait(10)})")
    pid, total = int(line[0]), float(line[1])
    assert total == 45.0  # the all_reduce went through the emulator (one rank: the sum of its input)
    assert pid != proc.pid and process_alive(pid)  # its own process
    return proc, pid


def test_emulator_process_stops_with_the_group() -> None:
    proc, pid = _start("linger")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "closed"
        assert _wait_gone(pid, 15), "the emulator outlived destroy_process_group"
    finally:
        proc.kill()
        proc.wait(10)


def test_no_orphan_emulator_after_the_owner_is_killed() -> None:
    proc, pid = _start("hang")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert _wait_gone(pid, 15), "the emulator outlived its killed owner"


def test_a_child_that_exits_at_once_is_reported_with_its_status_and_stderr() -> None:
    """A child that refuses its options exits at once: the error says so, with the child's own
    error line, instead of "did not start within 30.0s" (issue 37, item 2)."""
    from homagg import TransportError
    from switch_emulator import spawn

    with pytest.raises(TransportError) as info:
        spawn(duplicate=2.0)  # the child's check: a rate in [0, 1)
    message = str(info.value)
    assert "exited with status 2 before it served" in message, message
    assert "--duplicate 2: fault rate duplicate=2.0 outside [0, 1)" in message, message
    assert "did not start within" not in message


def test_a_child_that_does_not_start_in_time_is_killed_and_said_so() -> None:
    from homagg import TransportError
    from switch_emulator import spawn

    with pytest.raises(TransportError, match=r"did not start within 0\.001s \(killed\)"):
        spawn(timeout=0.001)  # no interpreter prints its ready line in a millisecond


def test_the_child_log_reaches_stderr_once_it_serves(capfd: pytest.CaptureFixture[str]) -> None:
    """The child's stderr is read (for the error above) and, once it serves, copied to ours."""
    from homagg.transport import ControlClient
    from switch_emulator import spawn

    with spawn(log_level="info") as sw, ControlClient(sw.control_addr) as ctl:
        job = ctl.admit(2, n_slots=4, words_per_packet=8)
        deadline, err = time.monotonic() + 30, ""
        while f"job {job.job_id} admitted" not in err and time.monotonic() < deadline:
            time.sleep(0.1)
            err += capfd.readouterr().err
    assert f"job {job.job_id} admitted" in err, err[-2000:]
