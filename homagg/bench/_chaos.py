"""``homagg bench faults --chaos``: a DDP soak on the embedded default with faults at random
(seeded) times, then the same run undisturbed.

``--chaos-world`` ranks (processes on loopback) run ``init_process_group("homagg")`` with no
switch configured (each group's rank 0 starts its own embedded emulator) and train an MLP
(:mod:`._chaos_rank`) for ``--duration`` seconds while the launcher (:mod:`._chaos_faults`)
kills and the group restarts the emulator, injects bursts of 5-30% loss, reordering and
duplication, and SIGSTOPs a rank for 2 s.  Then the same number of steps again, undisturbed.
Both runs set ``HOMAGG_EMULATOR_FAULTS=1`` (the emulator accepts fault settings; its python engine
serves), so they differ only in the faults.

The record gives the faults injected by kind (planned, skipped, and the emulators'
``injected_*``/``drop_injected*`` counters), the calls and steps on each path and the transitions,
the run times, and the verdicts, each a failure when false:

* ``params_identical_across_ranks`` and ``params_equal_undisturbed`` (``torch.equal`` of every
  parameter: the documented bound is bit-identity, docs/reliability-and-security.md), and
  ``losses_equal_undisturbed``;
* ``hang``: ``None``, or which rank hung (no progress for ``--chaos-hang-s``), in which phase and
  step, and every rank's stacks;
* ``errors``: a rank that raised (the fallback policy lets no error surface in this run: no rank
  dies, no input is bad), an exception in a rank's thread, or the injector's own failure;
* ``every_kind_injected``: each fault kind happened at least once;
* ``gave_up_returning``: the group stayed on the host path for good (``HOMAGG_RETURN_ATTEMPTS``
  failed returns in a row).  Every restarted emulator forwards and no fault strikes the first call
  after a return by design, so a give-up here means returns failed for another reason;
* ``undisturbed_transitions``: the undisturbed run left the switch path.

Invariant: every wait is bounded (the watchdog, and the launcher's stall timeout behind it);
every rank and emulator process is gone when :func:`chaos` returns.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from .. import _options as opt
from .._errors import ConfigError, HomAggError
from ..wire import MAX_WORKERS
from ._chaos_faults import KINDS, Chaos, schedule
from ._ranks import launch_ranks, one_record_per_rank

__all__ = ["configure_parser", "check_chaos_args", "chaos"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chaos", action="store_true",
                   help="run the chaos soak alone (same as --parts chaos): --duration seconds (default 10 min) "
                        "of DDP with the embedded emulator killed, loss/reorder/duplicate bursts and a stalled rank, "
                        "then the same run undisturbed")
    p.add_argument("--chaos-world", type=int, default=4, help="chaos: ranks")
    p.add_argument("--chaos-width", type=int, default=256, help="chaos: MLP width (3 layers)")
    p.add_argument("--chaos-step-s", type=float, default=0.05, help="chaos: simulated compute per step")
    p.add_argument("--chaos-probe", type=float, default=1.0, help="chaos: seconds between probes of a failed switch")
    p.add_argument("--chaos-gap", default="3,10", help="chaos: min,max seconds between faults (seeded)")
    p.add_argument("--chaos-kill-gap", type=float, default=70.0,
                   help="chaos: seconds at least between two kills (more than the fallback's 60 s flap window: a "
                        "fallback within a minute of a return doubles the probe interval, up to 30 s; 0: no spacing)")
    p.add_argument("--chaos-hang-s", type=float, default=None,
                   help="chaos: a rank without progress this long is hung (default max(60, 4 x --timeout))")


def check_chaos_args(args: argparse.Namespace) -> None:
    """:class:`~homagg.ConfigError` naming the first ``--chaos-*`` option out of range (checked
    before any part starts, like the others: :mod:`._faults_checks`)."""
    opt.count("--chaos-world", args.chaos_world, 1, MAX_WORKERS, why="homagg's worker bitmap")
    opt.count("--chaos-width", args.chaos_width)
    opt.within("--chaos-step-s", args.chaos_step_s, "[0, inf)")
    opt.seconds("--chaos-probe", args.chaos_probe)
    _gap(args.chaos_gap)
    opt.within("--chaos-kill-gap", args.chaos_kill_gap, "[0, inf)")
    if args.chaos_hang_s is not None:
        opt.seconds("--chaos-hang-s", args.chaos_hang_s)


def _gap(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        low = high = math.nan
    if not (0 < low <= high < math.inf):
        raise ConfigError(f"--chaos-gap {text!r}: need MIN,MAX seconds with 0 < MIN <= MAX (finite)")
    return low, high


def _run(args: argparse.Namespace, out: Path, duration: float | None, steps: int | None,
         chaos: Chaos | None, label: str) -> list[dict[str, Any]]:
    cfg = {"seed": args.seed, "width": args.chaos_width, "step_s": args.chaos_step_s, "out_dir": str(out),
           "duration": duration, "steps": steps}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOMAGG_SWITCH")}  # the embedded default
    env.update(HOMAGG_EMULATOR_FAULTS="1", HOMAGG_PROBE_INTERVAL=str(args.chaos_probe),
               HOMAGG_TIMEOUT=str(args.timeout), PYTHONFAULTHANDLER="1")
    if chaos is not None:
        chaos.start()
    try:
        outs = launch_ranks([sys.executable, "-m", "homagg.bench._chaos_rank", json.dumps(cfg)], args.chaos_world,
                            label=label, stall_timeout=_hang_s(args) + 30, env=env,
                            on_line=chaos.on_line if chaos is not None else None)
    finally:
        if chaos is not None:
            chaos.stop()
    return one_record_per_rank(outs, label)


def _hang_s(args: argparse.Namespace) -> float:
    return args.chaos_hang_s if args.chaos_hang_s is not None else max(60.0, 4 * args.timeout)


def _params(out: Path, world: int) -> list[list[torch.Tensor]]:
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))


def _paths(reports: list[dict[str, Any]]) -> dict[str, Any]:
    first = reports[0]
    moves = Counter(f"{t['from']}->{t['to']}" for t in first["transitions"])
    causes = Counter(_cause(t["cause"]) for t in first["transitions"])
    down = [t for t in first["transitions"] if t["to"] == "host" and t["from"] == "switch"]
    back = [t for t in first["transitions"] if t["to"] == "switch"]
    return {
        "calls_per_path": first["stats_paths"],
        "calls_per_path_by_rank": [r["stats_paths"] for r in reports],
        "steps_per_path": {p: first["paths"].count(p) for p in ("switch", "host")},
        "transitions": dict(moves), "transition_causes": dict(causes.most_common(8)),
        "transitions_identical_across_ranks": all(
            [(t["from"], t["to"], t["at_call"]) for t in r["transitions"]]
            == [(t["from"], t["to"], t["at_call"]) for t in first["transitions"]] for r in reports),
        "detect_s_median": _median([t["detect_s"] for t in down]), "detect_s_max": _max([t["detect_s"] for t in down]),
        "readmit_s_median": _median([t["readmit_s"] for t in back]),
        "host_s_total": round(sum(t.get("host_s", 0.0) for t in back), 2),
        "final_path": first["paths"][-1] if first["paths"] else None,
        "gave_up_returning": any(t.get("gave_up") for t in first["transitions"]),
        "transition_log": [{k: v for k, v in t.items() if k != "cause"} | {"cause": _cause(t["cause"])}
                           for t in first["transitions"][:200]],
    }


def _cause(text: str) -> str:
    """A transition's cause with what differs from one to the next (addresses, numbers) left out."""
    text = re.sub(r"^rank \d+: ", "", text)
    text = re.sub(r"\b\d{1,3}(\.\d{1,3}){3}:\d+\b", "ADDR", text)
    return re.sub(r"\b\d+(\.\d+)?", "N", text)[:160]


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def _max(xs: list[float]) -> float | None:
    return round(max(xs), 4) if xs else None


def chaos(args: argparse.Namespace, duration: float) -> dict[str, Any]:
    check_chaos_args(args)
    plan = schedule(args.seed, duration, args.chaos_world, _gap(args.chaos_gap), args.chaos_kill_gap)
    rec: dict[str, Any] = {
        "world": args.chaos_world, "width": args.chaos_width, "duration_s": duration, "seed": args.seed,
        "timeout_s": args.timeout, "probe_interval_s": args.chaos_probe, "kill_gap_s": args.chaos_kill_gap, "hang_bound_s": _hang_s(args),
        "simulated_compute_s": args.chaos_step_s, "switch": "embedded (HOMAGG_EMULATOR_FAULTS=1: python engine)",
        "planned": dict(Counter(f.kind for f in plan)),
    }
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="homagg-chaos-") as tmp:
        loud_dir, quiet_dir = Path(tmp, "disturbed"), Path(tmp, "undisturbed")
        loud_dir.mkdir(mode=0o700)
        quiet_dir.mkdir(mode=0o700)
        injector = Chaos(plan, loud_dir, args.chaos_world, args.seed, _hang_s(args))
        loud: list[dict[str, Any]] | None = None
        try:
            loud = _run(args, loud_dir, duration, None, injector, "bench faults chaos (disturbed)")
        except HomAggError as exc:
            errors.append(f"disturbed run: {exc}")
        rec.update(_faults_record(injector))
        errors += [f"injector: {e}" for e in injector.errors]
        if loud is None:
            rec.update(errors=errors, ok=False, failures=["disturbed_run"] + (["hang"] if injector.hang else []))
            return rec
        steps = len(loud[0]["step_s"])
        errors += [f"rank {r['rank']}: {e}" for r in loud for e in r["thread_errors"]]
        try:
            quiet = _run(args, quiet_dir, None, steps, None, "bench faults chaos (undisturbed)")
        except HomAggError as exc:
            rec.update(errors=errors + [f"undisturbed run: {exc}"], ok=False, failures=["undisturbed_run"])
            return rec
        ploud, pquiet = _params(loud_dir, args.chaos_world), _params(quiet_dir, args.chaos_world)
    slowest = [max(col) for col in zip(*(r["step_s"] for r in loud))]
    base = [max(col) for col in zip(*(r["step_s"] for r in quiet))]
    rec.update(
        params=loud[0]["params"], steps=steps, run_s=round(sum(slowest), 2), undisturbed_run_s=round(sum(base), 2),
        lost_s=round(sum(slowest) - sum(base), 2), undisturbed_calls_per_path=quiet[0]["stats_paths"],
        undisturbed_transitions=len(quiet[0]["transitions"]), median_step_s=_median(slowest), undisturbed_median_step_s=_median(base),
        max_step_s=_max(slowest), **_paths(loud),
        params_identical_across_ranks=all(_same(ploud[0], p) for p in ploud[1:]),
        params_equal_undisturbed=all(_same(pquiet[0], p) for p in ploud),
        params_max_abs_diff_undisturbed=_max_diff(ploud[0], pquiet[0]),
        losses_equal_undisturbed=all(a["losses"] == b["losses"] for a, b in zip(loud, quiet, strict=True)),
        warnings=dict(sum((Counter(r["warnings"]) for r in loud), Counter())),
        other_warnings=sorted({w for r in loud for w in r["other_warnings"]})[:10],
        errors=errors,
    )
    failures = [k for k in ("params_identical_across_ranks", "params_equal_undisturbed", "losses_equal_undisturbed",
                            "every_kind_injected") if not rec[k]]
    failures += ["errors"] if errors else []
    failures += ["hang"] if rec["hang"] else []
    failures += ["gave_up_returning"] if rec["gave_up_returning"] else []
    failures += ["undisturbed_transitions"] if rec["undisturbed_transitions"] else []
    rec.update(ok=not failures, failures=failures)
    return rec


def _faults_record(injector: Chaos) -> dict[str, Any]:
    done = Counter(e["kind"] for e in injector.events)
    return {
        "faults_injected": {k: done.get(k, 0) for k in KINDS}, "faults_skipped": injector.skipped,
        "every_kind_injected": all(done.get(k, 0) for k in KINDS),
        "emulator_counters": injector.injected_counters(), "emulators_faulted": len(injector.counters),
        "hang": injector.hang, "events": injector.events[:300],
        "load_1min": {"min": min(injector.load), "median": statistics.median(injector.load),
                      "max": max(injector.load), "samples": len(injector.load)} if injector.load else None,
    }


def summary(rec: dict[str, Any]) -> str:
    """A few lines for a human (the JSON record has everything)."""
    lines = [f"chaos: {'OK' if rec.get('ok') else 'FAILED ' + ', '.join(rec.get('failures', []))}; "
             f"{rec['world']} ranks, {rec['duration_s']:g} s, seed {rec['seed']}",
             f"  faults injected: {rec['faults_injected']} (skipped {rec['faults_skipped'] or 'none'}); "
             f"emulator counters {rec['emulator_counters']}"]
    if "steps" in rec:
        lines += [f"  steps {rec['steps']}: per path {rec['steps_per_path']}, calls per path {rec['calls_per_path']}, "
                  f"transitions {rec['transitions']}",
                  f"  run {rec['run_s']} s vs undisturbed {rec['undisturbed_run_s']} s; params identical across ranks "
                  f"{rec['params_identical_across_ranks']}, equal to undisturbed {rec['params_equal_undisturbed']}, "
                  f"losses equal {rec['losses_equal_undisturbed']}"]
    if rec.get("hang"):
        h = rec["hang"]
        lines.append(f"  HUNG: ranks {h['ranks']} at {h['where']} (last fault {h['last_fault']})")
    lines += [f"  error: {e[:400]}" for e in rec.get("errors", [])]
    return "\n".join(lines)
