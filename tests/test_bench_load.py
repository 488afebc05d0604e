"""``--cpu-load N`` (:mod:`homagg.bench._load`): N busy processes at nice 19 for the benchmark's
duration, none left behind, whatever ends the benchmark.

Oracles: ``/proc/<pid>/stat`` (the nice field and the CPU clock ticks of each busy process) and
the process table after the context is left.  No timing assertions: waits for CPU to be consumed
are bounded, never measured (a nice-19 process on a loaded host gets its ~1.5% of a core).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from homagg import HomAggError
from homagg.bench._cpu import process_cpu
from homagg.bench._load import LOAD_NICE, BackgroundLoad, describe_load
from homagg.cli import main

_WAIT_S = 60.0


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (index 0: state, 16: nice)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _cpu(pid: int) -> float:
    times = process_cpu(pid)
    assert times is not None, f"process {pid} is gone"
    return sum(times)


def _gone(pid: int) -> bool:
    """Reaped (no /proc entry), not merely dead (a zombie would still be there)."""
    return not Path(f"/proc/{pid}").exists()


def _wait_for(pred: object, what: str) -> None:
    deadline = time.monotonic() + _WAIT_S
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"{what} within {_WAIT_S:g} s"
        time.sleep(0.05)


def test_busy_processes_run_at_nice_19_consume_cpu_and_are_reaped() -> None:
    with BackgroundLoad(2) as load:
        pids = load.pids
        assert len(set(pids)) == 2
        for pid in pids:
            fields = _stat_fields(pid)
            assert int(fields[16]) == LOAD_NICE and os.getpriority(os.PRIO_PROCESS, pid) == LOAD_NICE
            assert int(fields[1]) == os.getpid()  # our children
        # after the ready line each runs only its loop: its CPU ticks keep growing
        start = {pid: _cpu(pid) for pid in pids}
        _wait_for(lambda: all(_cpu(pid) > start[pid] for pid in pids), "every busy process used CPU")
    assert load.pids == []
    assert all(_gone(pid) for pid in pids)


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_nothing_is_left_behind_when_the_body_raises(error: BaseException) -> None:
    with pytest.raises(type(error)):
        with BackgroundLoad(1) as load:
            pids = load.pids
            assert len(pids) == 1 and not _gone(pids[0])
            raise error
    assert _gone(pids[0])


def test_busy_processes_die_with_their_launcher(tmp_path: Path) -> None:
    """SIGKILL the launcher (no ``__exit__`` runs): the kernel kills its busy processes."""
    code = ("import sys, time\nfrom homagg.bench._load import BackgroundLoad\n"
            "with BackgroundLoad(1) as load:\n    print(load.pids[0], flush=True)\n    time.sleep(600)\n")
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        pid = int(launcher.stdout.readline())
        assert int(_stat_fields(pid)[16]) == LOAD_NICE
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(30)
        # orphaned and killed, it is reaped by init: its /proc entry goes
        _wait_for(lambda: _gone(pid) or _stat_fields(pid)[0] in ("Z", "X"), "the orphan was killed")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(30)


def test_zero_is_no_load_and_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with BackgroundLoad(0) as load:
        assert load.pids == []
    with pytest.raises(HomAggError):
        BackgroundLoad(-1)
    assert describe_load(0) == "background load: none"
    assert describe_load(1) == f"background load: 1 busy process at nice {LOAD_NICE}"
    assert describe_load(3) == f"background load: 3 busy processes at nice {LOAD_NICE}"
    for command in ("allreduce", "net", "models"):
        with pytest.raises(SystemExit) as exc:
            main(["bench", command, "--cpu-load", "-1"])
        assert exc.value.code == 2 and "--cpu-load" in capsys.readouterr().err
