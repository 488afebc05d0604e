"""The chaos soak's launcher side: a seeded fault schedule, the thread that injects it, and the
watchdog that fails the run when a rank stops making progress (:mod:`._chaos`).

Faults (one at a time, in the order of a seeded schedule: every kind once per shuffled cycle of
:data:`KINDS`, separated by seeded gaps):

* ``kill``: the group's embedded emulator SIGKILLed (the group falls back to the host path and
  starts a new emulator when its probe next runs);
* ``loss`` / ``reorder`` / ``duplicate``: a burst (seconds) of that fault injection at a seeded
  rate in [5%, 30%], set on the emulator the group uses through its control port (the emulator
  allows it: ``HOMAGG_EMULATOR_FAULTS=1``), then set back to none;
* ``stall``: one rank SIGSTOPped for 2 s, then SIGCONTed.

The emulator the group uses comes from rank 0's ``emulator.json`` (:mod:`._chaos_rank`).  An
emulator fault waits (bounded) for the group to be on the switch path; if it is not, the fault is
counted as skipped.  The emulator's own ``injected_*`` / ``drop_injected*`` counters are polled
during bursts and before a kill, and summed over the emulators the run used.

Watchdog: every rank prints a progress line per step; a rank silent for ``hang_s`` seconds is
hung.  The watchdog records which rank, in which phase and step, has every rank dump its threads'
stacks (SIGUSR1: :mod:`faulthandler`), reads them, and SIGKILLs the hung rank so the launcher
raises.  Invariant: after :meth:`Chaos.stop` no fault is active (bursts reset, stalled rank
continued) and both threads have ended.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import HomAggError
from ._chaos_rank import PROGRESS_MARK
from ._ranks import RECORD_MARK

__all__ = ["KINDS", "COUNTERS", "Fault", "schedule", "Chaos"]

KINDS = ("kill", "loss", "stall", "reorder", "duplicate")
#: the emulator's fault-injection counters the record sums
COUNTERS = ("drop_injected", "drop_injected_egress", "injected_duplicate", "injected_reorder")
STALL_S = 2.0
_RATE = (0.05, 0.30)
_BURST_S = (2.0, 6.0)
_SWITCH_WAIT_S = 30.0  # how long an emulator fault waits for the group to be on the switch path
_CTL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Fault:
    """One planned fault: ``gap_s`` after the previous one ended."""

    gap_s: float
    kind: str
    rate: float = 0.0  #: loss / reorder / duplicate: the rate per datagram
    hold_s: float = 0.0  #: bursts and stalls: how long the fault lasts
    rank: int = -1  #: stall: the rank stopped

    def describe(self) -> dict[str, Any]:
        """The fields that apply to this kind."""
        if self.kind == "stall":
            return {"kind": self.kind, "hold_s": self.hold_s, "rank": self.rank}
        if self.kind == "kill":
            return {"kind": self.kind}
        return {"kind": self.kind, "rate": self.rate, "hold_s": self.hold_s}


def schedule(seed: int, duration_s: float, world: int, gap_s: tuple[float, float],
             kill_gap_s: float = 0.0) -> list[Fault]:
    """The seeded faults of a run of ``duration_s`` (planned end of the last one < ``duration_s``
    minus one maximal gap, so the run ends undisturbed for a while).

    Kills are at least ``kill_gap_s`` apart (planned; the real spacing is only longer, since an
    injection can only be late): a kill due sooner moves to the end of its cycle, and when it is
    the cycle's last fault, its gap grows."""
    rng = random.Random(seed)
    out: list[Fault] = []
    cycle: list[str] = []
    t, last_kill = 0.0, -math.inf
    while True:
        if not cycle:
            cycle = list(KINDS)
            rng.shuffle(cycle)
        kind = cycle.pop()
        gap = rng.uniform(*gap_s)
        if kind == "kill" and t + gap - last_kill < kill_gap_s:
            if cycle:
                cycle.insert(0, kind)
                kind = cycle.pop()
            else:
                gap = kill_gap_s - (t - last_kill)
        if kind in ("loss", "reorder", "duplicate"):
            f = Fault(gap, kind, rate=round(rng.uniform(*_RATE), 3), hold_s=round(rng.uniform(*_BURST_S), 2))
        elif kind == "stall":
            f = Fault(gap, kind, hold_s=STALL_S, rank=rng.randrange(world))
        else:
            f = Fault(gap, kind)
            last_kill = t + gap
        t += gap + f.hold_s
        if t > duration_s - gap_s[1]:
            return out
        out.append(f)


class Chaos:
    """Injects :func:`schedule`'s faults into a running group and watches its ranks (see the
    module docstring).  Feed it every stdout line (:meth:`on_line`); :meth:`start` after launch."""

    def __init__(self, faults: list[Fault], out_dir: Path, world: int, seed: int, hang_s: float) -> None:
        self.faults, self.out_dir, self.world, self.seed, self.hang_s = faults, out_dir, world, seed, hang_s
        self.events: list[dict[str, Any]] = []  #: what was injected, when (s after all ranks were ready)
        self.skipped: dict[str, int] = {}
        self.errors: list[str] = []  #: the injector's own failures (e.g. a control request refused)
        self.hang: dict[str, Any] | None = None
        self.load: list[float] = []  #: the machine's 1-minute load, sampled every 10 s
        self.counters: dict[int, dict[str, int]] = {}  # emulator pid -> its last counters read
        self._lock = threading.Lock()
        self._pids: dict[int, int] = {}
        self._seen: dict[int, dict[str, Any]] = {}  # rank -> {"t", "phase", "step", "path"}
        self._done: set[int] = set()
        self._ready = threading.Event()
        self._stop = threading.Event()  # no new faults
        self._end = threading.Event()  # the ranks are gone: both threads end
        self._t0 = 0.0
        self._threads = [threading.Thread(target=self._inject, name="chaos-inject", daemon=True),
                         threading.Thread(target=self._watch, name="chaos-watchdog", daemon=True)]

    # ------------------------------------------------------------------ ranks' lines
    def on_line(self, rank: int, line: str) -> None:
        now = time.monotonic()
        with self._lock:
            if RECORD_MARK in line:
                self._done.add(rank)
            if PROGRESS_MARK not in line:
                return
            p = json.loads(line.partition(PROGRESS_MARK)[2])
            if "pid" in p:
                self._pids[rank] = p["pid"]
            self._seen[rank] = {"t": now, **{k: p.get(k, self._seen.get(rank, {}).get(k)) for k in
                                             ("phase", "step", "path")}}
            if p["phase"] == "closing":
                self._stop.set()  # the run is over: no new faults
            if not self._ready.is_set() and sum(s["phase"] != "init" for s in self._seen.values()) == self.world:
                self._t0 = now
                self._ready.set()

    def start(self) -> Chaos:
        self._launched = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """After the ranks are gone: end any fault still active, end both threads (bounded)."""
        self._stop.set()
        self._end.set()
        for t in self._threads:
            t.join(_SWITCH_WAIT_S + 2 * _CTL_TIMEOUT_S + 10)

    # ------------------------------------------------------------------ injection
    def _inject(self) -> None:
        while not self._ready.wait(0.2):
            if self._stop.is_set():
                return
        for f in self.faults:
            if self._stop.wait(f.gap_s):
                return
            try:
                self._one(f)
            except Exception as exc:  # noqa: BLE001 - recorded: the report says what the injector could not do
                self.errors.append(f"{f.kind} at {self._now():.1f}s: {type(exc).__name__}: {exc}")

    def _now(self) -> float:
        """Seconds since every rank was ready (before that: since the launch)."""
        return time.monotonic() - (self._t0 if self._ready.is_set() else self._launched)

    def _record(self, f: Fault, **extra: Any) -> None:
        self.events.append({"at_s": round(self._now(), 2), **f.describe(), **extra})

    def _one(self, f: Fault) -> None:
        if f.kind == "stall":
            pid = self._pids[f.rank]
            self._record(f)
            os.kill(pid, signal.SIGSTOP)
            try:
                self._end.wait(f.hold_s)
            finally:
                _signal(pid, signal.SIGCONT)
            return
        emu = self._emulator()
        if emu is None:
            self.skipped[f.kind] = self.skipped.get(f.kind, 0) + 1
            return
        if f.kind == "kill":
            self._poll_counters(emu)
            self._record(f, emulator_pid=emu["pid"])
            os.kill(emu["pid"], signal.SIGKILL)
            return
        rates = {"loss": "drop", "reorder": "reorder", "duplicate": "duplicate"}
        self._set_faults(emu, **{rates[f.kind]: f.rate})
        self._record(f, emulator_pid=emu["pid"])
        end = time.monotonic() + f.hold_s
        try:
            while time.monotonic() < end and not self._stop.is_set():
                time.sleep(min(0.5, max(0.0, end - time.monotonic())))
                self._poll_counters(emu)
        finally:
            try:
                self._set_faults(emu)
                self._poll_counters(emu)
            except (HomAggError, OSError) as exc:
                # the group may have given the emulator up meanwhile (a fallback stops it)
                self.events[-1]["ended"] = f"emulator gone before the burst ended: {type(exc).__name__}"

    def _emulator(self) -> dict[str, Any] | None:
        """Rank 0's current emulator while the group is on the switch path (waits, bounded)."""
        deadline = time.monotonic() + _SWITCH_WAIT_S
        while not self._stop.is_set():
            try:
                info = json.loads((self.out_dir / "emulator.json").read_text())
            except (OSError, ValueError):
                info = {}
            if info.get("path") == "switch" and info.get("pid") and _alive(info["pid"]):
                return info
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
        return None

    def _set_faults(self, emu: dict[str, Any], **rates: float) -> None:
        from ..transport import ControlClient

        with ControlClient(tuple(emu["control"]), timeout=_CTL_TIMEOUT_S, secret=emu["secret"]) as ctl:
            ctl.set_faults(seed=self.seed + len(self.events), **rates)

    def _poll_counters(self, emu: dict[str, Any]) -> None:
        from ..transport import ControlClient

        try:
            with ControlClient(tuple(emu["control"]), timeout=_CTL_TIMEOUT_S, secret=emu["secret"]) as ctl:
                c = ctl.status()["counters"]
        except (HomAggError, OSError):
            return  # gone (killed or stopped by the group): its last reading stands
        self.counters[emu["pid"]] = {k: int(c.get(k, 0)) for k in COUNTERS}

    def injected_counters(self) -> dict[str, int]:
        return {k: sum(c[k] for c in self.counters.values()) for k in COUNTERS}

    # ------------------------------------------------------------------ watchdog
    def _watch(self) -> None:
        next_load = 0.0
        while not self._end.wait(0.5):
            now = time.monotonic()
            if now >= next_load:
                self.load.append(round(os.getloadavg()[0], 2))
                next_load = now + 10.0
            with self._lock:
                silent = {r: now - self._seen.get(r, {}).get("t", self._launched) for r in range(self.world)
                          if r not in self._done}
                hung = sorted(r for r, s in silent.items() if s > self.hang_s)
                last = {r: dict(self._seen.get(r, {"phase": "launch"})) for r in hung}
            if hung:
                self._fail(hung, silent, last)
                return

    def _fail(self, hung: list[int], silent: dict[int, float], last: dict[int, dict[str, Any]]) -> None:
        """Name what hung, collect every rank's stacks, kill the hung ranks (the launcher raises)."""
        for pid in self._pids.values():
            _signal(pid, signal.SIGCONT)  # a stopped rank cannot dump its stack
            _signal(pid, signal.SIGUSR1)
        time.sleep(1.5)
        stacks = {}
        for r in range(self.world):
            try:
                stacks[r] = (self.out_dir / f"rank{r}.stack").read_text()[-6000:]
            except OSError:
                stacks[r] = ""
        self.hang = {
            "ranks": hung, "after_s": round(self._now(), 1), "hang_bound_s": self.hang_s,
            "where": {r: {"phase": last[r].get("phase"), "step": last[r].get("step"), "path": last[r].get("path"),
                          "silent_s": round(silent[r], 1)} for r in hung},
            "last_fault": self.events[-1] if self.events else None, "stacks": stacks,
        }
        for r in hung:
            if r in self._pids:
                _signal(self._pids[r], signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed, not yet reaped by rank 0) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
