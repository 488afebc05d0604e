"""CPU accounting shared by the benchmarks: other processes' CPU time from ``/proc``, and the
ranks' per-call CPU split into user and kernel (system) time.

``/proc/<pid>/stat`` and ``/proc/<pid>/task/<tid>/stat`` count CPU time in clock ticks
(``SC_CLK_TCK``, 100 per second on Linux: 10 ms), so one reading is exact to a tick only; a
difference over many calls is exact to a tick over all of them (see
:mod:`homagg.bench._allreduce_rank`).  Linux only: elsewhere every reader
returns ``None`` / an empty dict.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["SWITCH_PID_ENV", "thread_cpu", "process_cpu", "median_call_split"]

#: environment variable telling a benchmark rank the pid of a switch emulator process that a
#: launcher started (``homagg bench net``: :class:`~homagg.bench._netns.StarNet` sets it)
SWITCH_PID_ENV = "HOMAGG_BENCH_SWITCH_PID"


def _ticks(stat: str) -> tuple[int, int]:
    """(utime, stime) in clock ticks from the text of a ``/proc/.../stat`` file (the fields after the
    command name's closing parenthesis: a name may hold spaces and parentheses)."""
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]), int(fields[12])


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread of process ``pid``, by thread name, and the system
    part as ``<name>_sys`` (``/proc``; the emulator's data loop is the main thread: ``data``).
    Threads that exited are not in it (:func:`process_cpu` counts them)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        user, system = _ticks(stat)
        name = "data" if task.name == str(pid) else name  # the main thread serves the data socket
        out[name] = out.get(name, 0.0) + (user + system) / tick
        out[name + "_sys"] = out.get(name + "_sys", 0.0) + system / tick
    return out


def process_cpu(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of process ``pid`` so far, every thread (exited ones too: the
    process's own ``/proc/<pid>/stat``); ``None`` when it cannot be read (gone, not Linux)."""
    try:
        user, system = _ticks(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return user / tick, system / tick


def median_call_split(total: Sequence[float], user: Sequence[float] | None,
                      system: Sequence[float] | None) -> tuple[float | None, float | None, float | None]:
    """(total, user, system) of the median call: per-call figures (already summed over ranks),
    the call whose total is the median (with an even count, the mean of the two middle calls).

    Taking the user and system parts of that same call (not each part's own median) keeps
    ``user + system == total``.  ``user``/``system`` ``None`` (not measured): only the total."""
    if not total:
        return None, None, None
    order = sorted(range(len(total)), key=total.__getitem__)
    middle = order[(len(order) - 1) // 2: len(order) // 2 + 1]  # one call, or the two middle ones

    def mean(values: Sequence[float] | None) -> float | None:
        return None if values is None else sum(values[i] for i in middle) / len(middle)

    return mean(total), mean(user), mean(system)
