"""``homagg bench faults --parts crash``: a DDP run through a switch that crashes and comes back.

``--crash-world`` ranks (processes, the embedded emulator on loopback) train an MLP for
``--crash-steps`` steps twice: undisturbed, then with the emulator SIGKILLed before step
``--crash-at`` (rank 0 kills it); the group falls back to the host path and starts a new emulator
at its next probe (``--crash-probe`` seconds).  The record gives, measured:

* ``steps_per_path``: the steps whose allreduces all took the switch, and those on the host path
  (a step that lost the switch midway counts as host);
* ``detect_s`` / ``agree_s``: from the start of the round that failed to the fallback decision,
  and the agreement over gloo; ``readmit_s``: the return (new job, every rank re-registered);
  ``host_s``: the time spent on the host path;
* ``lost_s``: the disturbed run's wall time minus the undisturbed run's, both summed over steps
  (slowest rank per step): what the crash cost the run;
* ``params_match_across_ranks`` and ``params_match_undisturbed`` (parameter digests), and
  ``losses_match_undisturbed``: the host path runs the same codec, so the runs are bit-identical.

Invariant: both runs see the same data and model; every rank process is gone when this returns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from ._ranks import launch_ranks, one_record_per_rank

__all__ = ["configure_parser", "crash"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--crash-world", type=int, default=4, help="crash part: ranks")
    p.add_argument("--crash-steps", type=int, default=60, help="crash part: DDP steps per run")
    p.add_argument("--crash-at", type=int, default=20, help="crash part: the emulator is killed before this step")
    p.add_argument("--crash-probe", type=float, default=1.0, help="crash part: seconds between probes of the switch")
    p.add_argument("--crash-width", type=int, default=512, help="crash part: MLP width (3 layers)")
    p.add_argument("--crash-step-s", type=float, default=0.05, help="crash part: simulated compute per step")


def _run(args: argparse.Namespace, kill_at: int | None) -> list[dict[str, Any]]:
    cfg = {"seed": args.seed, "width": args.crash_width, "steps": args.crash_steps, "step_s": args.crash_step_s,
           "kill_at": kill_at}
    env = {**os.environ, "HOMAGG_PROBE_INTERVAL": str(args.crash_probe), "HOMAGG_TIMEOUT": str(args.timeout)}
    label = "bench faults crash" + (" (disturbed)" if kill_at is not None else " (undisturbed)")
    outs = launch_ranks([sys.executable, "-m", "homagg.bench._crash_rank", json.dumps(cfg)], args.crash_world,
                        label=label, stall_timeout=max(60.0, 4 * args.timeout), env=env)
    return one_record_per_rank(outs, label)


def crash(args: argparse.Namespace) -> dict[str, Any]:
    quiet = _run(args, None)
    loud = _run(args, args.crash_at)
    slowest = [max(col) for col in zip(*(r["step_s"] for r in loud))]
    base = [max(col) for col in zip(*(r["step_s"] for r in quiet))]
    first = loud[0]
    moves = [t for t in first["transitions"] if t["from"] != t["to"]]
    fallback = next((t for t in moves if t["to"] == "host"), {})
    back = next((t for t in moves if t["to"] == "switch"), {})
    digests = {r["param_digest"] for r in loud}
    switch_steps = [s for s, p in zip(slowest, first["paths"]) if p == "switch"]
    return {
        "world": args.crash_world, "steps": args.crash_steps, "killed_before_step": args.crash_at,
        "params": first["params"], "probe_interval_s": args.crash_probe, "simulated_compute_s": args.crash_step_s,
        "steps_per_path": {p: first["paths"].count(p) for p in ("switch", "host")},
        "calls_per_path": first["stats_paths"],
        "transitions": [(t["from"], t["to"]) for t in moves],
        "cause": fallback.get("cause"),
        "detect_s": fallback.get("detect_s"), "agree_s": fallback.get("agree_s"),
        "readmit_s": back.get("readmit_s"), "host_s": back.get("host_s"),
        "median_step_switch_s": round(statistics.median(switch_steps), 4) if switch_steps else None,
        "median_step_host_s": round(statistics.median(
            [s for s, p in zip(slowest, first["paths"]) if p == "host"] or [0.0]), 4),
        "run_s": round(sum(slowest), 3), "undisturbed_run_s": round(sum(base), 3),
        "lost_s": round(sum(slowest) - sum(base), 3),
        "params_match_across_ranks": len(digests) == 1,
        "params_match_undisturbed": digests == {quiet[0]["param_digest"]},
        "losses_match_undisturbed": all(a["losses"] == b["losses"] for a, b in zip(loud, quiet, strict=True)),
    }
