"""``--cpu-load N`` of ``homagg bench allreduce``, ``bench net`` and ``bench models``: N busy
background processes while the benchmark runs ("a training host is never idle").

:class:`BackgroundLoad` is a context manager: entering it starts N processes (``python -m
homagg.bench._load``), each a pure-CPU busy loop (``while True: pass``: no memory traffic, no
system calls) at nice 19, and returns once every one of them runs at that priority; leaving it,
normally, on an error or on ``KeyboardInterrupt``, SIGKILLs and reaps them.  They run in their own
session (a terminal's Ctrl-C reaches the benchmark, which then stops them, not them directly) and
ask the kernel to SIGKILL them when the launcher dies (:func:`~homagg.bench._ranks.die_with_launcher`:
when the *thread* that entered the context exits, so enter it from the main thread).  Nice 19
gives each of them a CFS weight of 15 against 1024 at nice 0, yet on a 2-core VM whose ranks wait
on the network one of them slowed ``bench models``' compute-only iterations by 27-37%
(docs/benchmarks.md): it takes every moment a rank waits, and a woken rank may wait for it.
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from .._errors import HomAggError
from ._ranks import LAUNCHER_ENV, die_with_launcher

__all__ = ["BackgroundLoad", "LOAD_NICE", "MAX_LOAD", "add_cpu_load_argument", "describe_load"]

LOAD_NICE = 19  #: the busy processes' nice value (the lowest priority)
MAX_LOAD = 1024  #: most background processes ``--cpu-load`` accepts
_READY = "busy"  #: a busy process's one line on stdout, once it runs at LOAD_NICE
_START_TIMEOUT_S = 60.0
_REAP_TIMEOUT_S = 10.0


def _count(text: str) -> int:
    """``--cpu-load``'s value: an int in [0, MAX_LOAD]."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpu-load: {text!r} is not an integer") from None
    if not 0 <= n <= MAX_LOAD:
        raise argparse.ArgumentTypeError(f"--cpu-load: need 0 <= N <= {MAX_LOAD}, got {n}")
    return n


def add_cpu_load_argument(parser: argparse.ArgumentParser) -> None:
    """``--cpu-load N`` (default 0)."""
    parser.add_argument("--cpu-load", type=_count, default=0, metavar="N",
                        help=f"run N busy background processes (pure CPU loops at nice {LOAD_NICE}) from before "
                             "the first timed configuration to the end, as on a training host that is never "
                             "idle; recorded as cpu_load (default 0)")


def describe_load(n: int) -> str:
    """The table header's words for ``--cpu-load n``."""
    if n == 0:
        return "background load: none"
    return f"background load: {n} busy process{'es' if n != 1 else ''} at nice {LOAD_NICE}"


class BackgroundLoad:
    """``n`` busy processes at nice :data:`LOAD_NICE` while the context is entered (``n = 0``: none)."""

    def __init__(self, n: int) -> None:
        if not 0 <= n <= MAX_LOAD:
            raise HomAggError(f"cpu load: need 0 <= n <= {MAX_LOAD} background processes, got {n}")
        self.n = n
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        """The busy processes' pids (empty outside the context)."""
        return [p.pid for p in self._procs]

    def __enter__(self) -> BackgroundLoad:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])  # import this homagg, whatever the working directory
        env = {**os.environ, LAUNCHER_ENV: str(os.getpid()),
               "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
        cmd = [sys.executable, "-m", "homagg.bench._load"]
        for _ in range(self.n):
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
            self._procs.append(proc)
            try:  # at once, before its interpreter has started (the child sets it again itself)
                os.setpriority(os.PRIO_PROCESS, proc.pid, LOAD_NICE)
            except ProcessLookupError:
                pass  # already exited: reported by _await_ready
        deadline = time.monotonic() + _START_TIMEOUT_S
        for proc in self._procs:
            self._await_ready(proc, deadline)

    @staticmethod
    def _await_ready(proc: subprocess.Popen[bytes], deadline: float) -> None:
        """Wait (bounded) for ``proc``'s ready line; raise :class:`HomAggError` with its stderr if none."""
        assert proc.stdout is not None and proc.stderr is not None
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                break
            chunk = os.read(proc.stdout.fileno(), 64)
            if not chunk:
                break  # exited
            line += chunk
        if line.strip() != _READY.encode():
            proc.kill()
            proc.wait(_REAP_TIMEOUT_S)
            err = proc.stderr.read().decode(errors="replace")[-2000:]
            raise HomAggError(f"cpu load: background process {proc.pid} did not start its busy loop "
                              f"within {_START_TIMEOUT_S:g} s (exit status {proc.returncode}); stderr:\n{err}")
        proc.stdout.close()
        proc.stderr.close()  # it writes nothing more: the loop has no output

    def stop(self) -> None:
        """SIGKILL every busy process and reap it (idempotent)."""
        procs, self._procs = self._procs, []
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            try:
                proc.wait(_REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not delivered within 10 s
                pass
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None and not pipe.closed:
                    pipe.close()


def _busy() -> None:
    """A busy process's body: die with the launcher, lowest priority, say so, then spin forever."""
    die_with_launcher()
    os.setpriority(os.PRIO_PROCESS, 0, LOAD_NICE)
    sys.stdout.write(_READY + "\n")
    sys.stdout.flush()
    while True:
        pass


if __name__ == "__main__":
    _busy()
