"""Start ``world`` rank processes of one command on loopback and wait for them, bounded.

The ranks are subprocesses of a command line (typically the same ``homagg bench ...`` command with
hidden worker arguments).  Each gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1`` and ``MASTER_PORT`` (a free port) in its environment, so
``init_process_group`` works with its default ``env://`` method.

Invariants: every wait is bounded; when :func:`launch_ranks` returns or raises, no rank process is
left.  Each rank runs in its own session and is killed as a process group (whatever it started
goes with it), and a rank that calls :func:`die_with_launcher` is killed by the kernel if the
launcher itself dies.  Failures raise :class:`~homagg.HomAggError` naming the rank(s): the first
rank that exits with an error (its stderr tail included), or the ranks still running when no
rank printed a line for ``stall_timeout`` seconds.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

from .._errors import HomAggError
from ._ddp import _free_port as free_port

__all__ = ["LAUNCHER_ENV", "die_with_launcher", "free_port", "launch_ranks", "one_record_per_rank", "RECORD_MARK"]

#: prefix of a rank's JSON report line on its stdout (other output may share the stream)
RECORD_MARK = "@homagg-allreduce-record@"

#: environment variable holding the launcher's pid (read by :func:`die_with_launcher`)
LAUNCHER_ENV = "HOMAGG_RANK_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.1


def die_with_launcher() -> None:
    """In a rank: ask the kernel to SIGKILL this process when the launcher dies (Linux only).

    Exits at once if the launcher is already gone.  A no-op outside :func:`launch_ranks`.
    """
    launcher = os.environ.get(LAUNCHER_ENV)
    if not launcher or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(launcher):
        os._exit(3)


class _Rank:
    """One rank process, its output files and the complete stdout lines read so far."""

    def __init__(self, rank: int, cmd: Sequence[str], env: Mapping[str, str], folder: Path) -> None:
        self.rank = rank
        # append mode (O_APPEND): the rank's writes land at the end whatever the shared file offset,
        # which new_lines moves with its seek-and-read (with "w+b" a write between the two landed
        # mid-file, over earlier output: a record line lost its newline)
        self.out: IO[bytes] = open(folder / f"rank{rank}.out", "a+b")  # noqa: SIM115 - closed in close()
        self.err: IO[bytes] = open(folder / f"rank{rank}.err", "a+b")  # noqa: SIM115
        self.lines: list[str] = []
        self._read = 0
        self._partial = b""
        self.proc = subprocess.Popen(list(cmd), env=dict(env), stdout=self.out, stderr=self.err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def new_lines(self) -> list[str]:
        """Complete stdout lines written since the last call."""
        self.out.seek(self._read)
        chunk = self.out.read()
        self._read += len(chunk)
        parts = (self._partial + chunk).split(b"\n")
        self._partial = parts.pop()
        lines = [p.decode(errors="replace") for p in parts]
        self.lines.extend(lines)
        return lines

    def stderr_tail(self, chars: int = 2000) -> str:
        self.err.flush()
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL the rank's process group (the rank and what it started), then reap the rank."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not delivered within 10 s
            pass

    def close(self) -> None:
        self.out.close()
        self.err.close()


def _describe(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


def _watch(ranks: list[_Rank], label: str, stall_timeout: float,
           on_line: Callable[[int, str], None] | None) -> list[list[str]]:
    deadline = time.monotonic() + stall_timeout
    while True:
        codes = [r.proc.poll() for r in ranks]  # before reading: a finished rank's output is complete
        for r in ranks:
            new = r.new_lines()
            if new:
                deadline = time.monotonic() + stall_timeout
            for line in new:
                if on_line is not None:
                    on_line(r.rank, line)
        failed = [r for r, c in zip(ranks, codes) if c not in (None, 0)]
        if failed:
            first = failed[0]
            names = ", ".join(f"rank {r.rank} ({_describe(r.proc.returncode)})" for r in failed)
            raise HomAggError(f"{label}: {names} failed; all ranks killed. "
                              f"rank {first.rank} stderr:\n{first.stderr_tail()}")
        if all(c == 0 for c in codes):
            return [r.lines + ([r._partial.decode(errors="replace")] if r._partial else []) for r in ranks]
        if time.monotonic() > deadline:
            alive = [r.rank for r, c in zip(ranks, codes) if c is None]
            raise HomAggError(f"{label}: rank(s) {alive} printed nothing for {stall_timeout:g}s "
                              f"(hung?); all ranks killed")
        time.sleep(_POLL_S)


def launch_ranks(
    cmd: Sequence[str],
    world: int,
    *,
    label: str,
    stall_timeout: float,
    env: Mapping[str, str] | None = None,
    on_line: Callable[[int, str], None] | None = None,
    master_addr: str = "127.0.0.1",
    rank_env: Callable[[int], Mapping[str, str]] | None = None,
) -> list[list[str]]:
    """Run ``cmd`` as ``world`` ranks; return each rank's stdout lines once all exited with 0.

    ``master_addr`` is the rendezvous host (rank 0's address); ``rank_env(r)`` adds variables to
    rank ``r``'s environment (e.g. its network namespace and interface).

    ``on_line(rank, line)`` is called for every stdout line as it arrives (progress); every line
    resets the stall timer.  Raises :class:`~homagg.HomAggError` (``label`` first) when a rank
    fails or all stall; every rank is killed before this returns or raises.
    """
    if world < 1:
        raise HomAggError(f"{label}: world size must be >= 1, got {world}")
    base = dict(os.environ if env is None else env)
    base.update(MASTER_ADDR=master_addr, MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    base[LAUNCHER_ENV] = str(os.getpid())
    ranks: list[_Rank] = []
    with tempfile.TemporaryDirectory(prefix="homagg-ranks-") as tmp:
        try:
            for r in range(world):
                extra = dict(rank_env(r)) if rank_env is not None else {}
                ranks.append(_Rank(r, cmd, {**base, **extra, "RANK": str(r), "LOCAL_RANK": str(r)}, Path(tmp)))
            return _watch(ranks, label, stall_timeout, on_line)
        finally:
            for r in ranks:
                r.kill()
            for r in ranks:
                r.close()


def one_record_per_rank(outs: Sequence[Sequence[str]], label: str) -> list[dict]:  # type: ignore[type-arg]
    """Each rank's one :data:`RECORD_MARK` record (JSON) from :func:`launch_ranks`' output; raises
    :class:`~homagg.HomAggError` naming the rank that printed none or several."""
    reports = []
    for r, lines in enumerate(outs):
        recs = [json.loads(ln.partition(RECORD_MARK)[2]) for ln in lines if RECORD_MARK in ln]
        if len(recs) != 1:
            raise HomAggError(f"{label}: rank {r} reported {len(recs)} records")
        reports.append(recs[0])
    return reports
