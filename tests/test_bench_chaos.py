"""The chaos soak's parts that need no DDP run (the soak itself: tests/test_bench_faults.py).

Oracles: the schedule's stated properties; the watchdog against real rank processes, one of which
really stops making progress (its name, phase, step and stack must be reported, and the launcher
must fail, not wait).
"""

from __future__ import annotations

import itertools
import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from homagg import HomAggError
from homagg.cli import main
from homagg.bench._chaos_faults import KINDS, Chaos, Fault, schedule
from homagg.bench._chaos_rank import PROGRESS_MARK
from homagg.bench._ranks import launch_ranks
from homagg.wire import MAX_WORKERS
from tests.test_cli_bad_input import _homagg, _refused


def _kill_times(plan: list[Fault]) -> list[float]:
    ends = itertools.accumulate(f.gap_s + f.hold_s for f in plan)  # a kill's hold is 0: its end is its time
    return [t for t, f in zip(ends, plan) if f.kind == "kill"]


@pytest.mark.parametrize("kill_gap", [0.0, 70.0])
def test_schedule_is_seeded_covers_every_kind_spaces_kills_and_ends_before_the_run(kill_gap: float) -> None:
    plan = schedule(7, 600.0, 4, (3.0, 10.0), kill_gap)
    assert plan == schedule(7, 600.0, 4, (3.0, 10.0), kill_gap) != schedule(8, 600.0, 4, (3.0, 10.0), kill_gap)
    for i in range(0, len(plan) - len(KINDS) + 1, len(KINDS)):  # each cycle has every kind once
        assert sorted(f.kind for f in plan[i:i + len(KINDS)]) == sorted(KINDS)
    assert sum(f.gap_s + f.hold_s for f in plan) <= 600.0 - 10.0 and len(plan) >= 40
    kills = _kill_times(plan)
    assert len(kills) >= 7 and min(b - a for a, b in itertools.pairwise(kills)) >= kill_gap - 1e-9
    if kill_gap:  # the unspaced schedule of this seed has kills closer than that: the spacing did it
        assert min(b - a for a, b in itertools.pairwise(_kill_times(schedule(7, 600.0, 4, (3.0, 10.0))))) < kill_gap
    for f in plan:
        assert 3.0 <= f.gap_s <= 10.0 or (f.kind == "kill" and f.gap_s <= kill_gap)
        if f.kind in ("loss", "reorder", "duplicate"):
            assert 0.05 <= f.rate <= 0.30 and 2.0 <= f.hold_s <= 6.0
        elif f.kind == "stall":
            assert f.hold_s == 2.0 and 0 <= f.rank < 4
        else:
            assert (f.rate, f.hold_s, f.rank) == (0.0, 0.0, -1)


_RANK = textwrap.dedent("""
    import faulthandler, json, os, signal, sys, time
    PROGRESS_MARK = sys.argv[2]  # not imported from homagg: no torch import, a fast start
    rank, out = int(os.environ["RANK"]), sys.argv[1]
    faulthandler.register(signal.SIGUSR1, file=open(f"{out}/rank{rank}.stack", "w"), all_threads=True)
    def say(**kw):
        print(PROGRESS_MARK + json.dumps(kw), flush=True)
    def waits_for_a_peer_that_never_answers():
        time.sleep(3600)
    say(phase="ready", pid=os.getpid(), rank=rank)
    for step in range(1, 600):
        say(phase="step", step=step, path="switch")
        if rank == 1 and step == 3:
            waits_for_a_peer_that_never_answers()
        time.sleep(0.1)
""")


def test_watchdog_names_the_hung_rank_with_its_stack_and_fails_the_run(tmp_path: Path) -> None:
    chaos = Chaos([], tmp_path, world=2, seed=0, hang_s=3.0).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(HomAggError, match=r"rank 1 \(killed by signal 9\)"):
            launch_ranks([sys.executable, "-c", _RANK, str(tmp_path), PROGRESS_MARK], 2, label="watchdog test", stall_timeout=60,
                         on_line=chaos.on_line)
    finally:
        chaos.stop()
    assert time.monotonic() - t0 < 30  # the watchdog's bound, not the launcher's stall timeout
    hang = chaos.hang
    assert hang is not None and hang["ranks"] == [1]
    where = hang["where"][1]
    assert (where["phase"], where["step"], where["path"]) == ("step", 3, "switch") and where["silent_s"] > 3.0
    assert "waits_for_a_peer_that_never_answers" in hang["stacks"][1]
    assert "waits_for_a_peer_that_never_answers" not in hang["stacks"][0]


_CHAOS = ["bench", "faults", "--chaos", "--duration", "5", "--chaos-world", "2", "--chaos-width", "8"]


@pytest.mark.parametrize("extra,words", [
    (["--chaos-world", "0"], ["--chaos-world 0", f"1..{MAX_WORKERS}"]),
    (["--chaos-world", str(MAX_WORKERS + 1)], [f"--chaos-world {MAX_WORKERS + 1}", f"1..{MAX_WORKERS}"]),
    (["--chaos-width", "0"], ["--chaos-width 0", "at least 1"]),
    (["--chaos-step-s", "-1"], ["--chaos-step-s -1", "[0, inf)"]),
    (["--chaos-step-s", "nan"], ["--chaos-step-s nan", "[0, inf)"]),
    (["--chaos-probe", "0"], ["--chaos-probe 0", "> 0"]),
    (["--chaos-gap", "5"], ["--chaos-gap '5'", "MIN,MAX"]),
    (["--chaos-gap", "3,1"], ["--chaos-gap '3,1'", "MIN,MAX"]),
    (["--chaos-gap", "0,1"], ["--chaos-gap '0,1'", "MIN,MAX"]),
    (["--chaos-gap", "nan,1"], ["--chaos-gap 'nan,1'", "MIN,MAX"]),
    (["--chaos-kill-gap", "nan"], ["--chaos-kill-gap nan", "[0, inf)"]),
    (["--chaos-hang-s", "0"], ["--chaos-hang-s 0", "> 0"]),
])
def test_bad_chaos_options_refused_before_anything_starts(extra: list[str], words: list[str]) -> None:
    _refused(_homagg(*_CHAOS, *extra, timeout=120), *words)


def test_a_hang_fails_the_soak_even_when_the_ranks_finish(tmp_path: Path) -> None:
    """Ranks silent past a 0.5 s bound at startup: the watchdog kills those whose pid it knows by
    then (a rank's first line gives it) and the run fails; a rank it could not kill may finish,
    and then the recorded hang must fail the run all the same (before: it passed)."""
    out = tmp_path / "chaos.json"
    assert main(["bench", "faults", "--chaos", "--duration", "3", "--chaos-world", "2", "--chaos-width", "8",
                 "--chaos-hang-s", "0.5", "--json", str(out)]) == 1
    ch = json.loads(out.read_text())["chaos"]
    assert ch["hang"] is not None and ch["hang"]["ranks"] and "hang" in ch["failures"] and ch["ok"] is False
    assert all(w["phase"] in ("launch", "init") for w in ch["hang"]["where"].values())
