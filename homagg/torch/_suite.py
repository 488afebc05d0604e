"""``homagg torchsuite``: PyTorch's own distributed test suite against homagg and against gloo.

Runs ``DistributedTest._DistTestBase`` from the installed torch wheel once per backend, test by
test (gloo, then homagg), in a driver process (:mod:`homagg.torch._suite_gates`, which also
documents the gates), and fails on any test that passes for gloo and fails for homagg unless it
is a documented exception (:data:`~homagg.torch._suite_gates.EXCEPTIONS`) failing for its
documented reason.

Every wait is bounded: the suite's own per-test join timeout is ``--timeout``; a driver that
reports nothing for ``--timeout`` + 60 s is killed (its whole process group), the test it was
running is recorded as ``timeout`` and the driver restarts with the remaining tests.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .._errors import ConfigError, HomAggError
from ._suite_gates import BACKENDS, exception_reason

__all__ = ["QUICK", "configure_parser", "run", "select", "compare", "run_suite"]

#: the CI subset: all_reduce variants (coalesced included), DDP on CPU, barrier, broadcast,
#: get_future, no_sync, and test_get_backend (proves the homagg run's groups are homagg).
#: Regexes over test names; left out: CUDA variants and the ``*_group`` variants (a subgroup of
#: ranks 1..W-1), which the suite skips below world size 8 (``--world 8 -k _group`` runs them).
QUICK = (
    r"^test_all_reduce_(?!.*cuda)(?!(coalesced_)?group_)",
    r"^test_DistributedDataParallelCPU",
    r"^test_barrier(_full_group)?$",
    r"^test_broadcast(_full_group)?$",
    r"^test_get_future$",
    r"no_sync",
    r"^test_get_backend$",
)
_GRACE_S = 60.0  # beyond --timeout before the driver is presumed hung
_START_S = 300.0  # importing torch's suite on a loaded machine


class SuiteError(HomAggError):
    """The suite could not be listed or driven (not a test failure)."""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="the CI subset: all_reduce variants incl. coalesced, DDP on CPU, barrier, broadcast, "
                             "get_future, no_sync, get_backend (no CUDA or *_group variants; ~35 tests)")
    parser.add_argument("--world", type=int, default=3, help="WORLD_SIZE (default 3)")
    parser.add_argument("-k", dest="patterns", action="append", default=[], metavar="PATTERN",
                        help="only tests whose name contains PATTERN (or matches it as a glob); repeatable")
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write every test's outcome per backend here")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one test may take per backend (default 180)")
    parser.add_argument("--start-method", choices=("fork", "spawn"), default="fork",
                        help="how worker processes start: fork (default, ~1 s a test) or spawn (upstream's; ~30 s a test)")
    parser.add_argument("--log-dir", help="keep each test's worker output here (default: a temporary directory)")
    parser.add_argument("--list", action="store_true", help="print the selected tests and exit")
    parser.add_argument("--gates", action="store_true", help="print the suite's name gates that differ for homagg and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (one line per test instead)")


def _driver_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "homagg.torch._suite_gates", *args]


def describe(world: int, gates: bool = False, timeout_s: float = 600.0) -> dict[str, Any]:
    """The suite's test names (and, with ``gates``, its gates) from a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="homagg-torchsuite-") as tmp:
        out = os.path.join(tmp, "info.json")
        try:
            proc = subprocess.run(_driver_cmd("--gates" if gates else "--list", out, str(world)),
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise SuiteError(f"listing torch's distributed suite took over {timeout_s:.0f}s") from exc
        if proc.returncode != 0:
            raise SuiteError(f"cannot import torch's distributed suite (is expecttest installed?):\n{proc.stderr[-3000:]}")
        with open(out) as f:
            return json.load(f)


def select(tests: list[str], quick: bool, patterns: list[str]) -> list[str]:
    """The tests ``--quick`` and ``-k`` keep (in suite order)."""
    chosen = [t for t in tests if not quick or any(re.search(p, t) for p in QUICK)]
    if patterns:
        chosen = [t for t in chosen if any(p in t or fnmatch.fnmatchcase(t, p) for p in patterns)]
    return chosen


def _read_events(path: str, offset: int) -> tuple[list[dict[str, Any]], int]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill the driver and everything it started (its own process group), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired as exc:
        raise SuiteError(f"driver {proc.pid} did not exit after SIGKILL") from exc


def run_suite(pairs: list[tuple[str, str]], *, world: int, timeout_s: float, start_method: str, log_dir: str,
              on_event: Any = None) -> list[dict[str, Any]]:
    """Run ``[test, backend]`` pairs in driver processes; one result record per pair."""
    results: list[dict[str, Any]] = []
    remaining = list(pairs)
    restarts = 0
    while remaining:
        round_dir = os.path.join(log_dir, f"driver{restarts}")
        os.makedirs(round_dir, exist_ok=True)
        plan = {"world": world, "timeout_s": timeout_s, "start_method": start_method,
                "temp_dir": os.path.join(round_dir, "tmp"), "log_dir": log_dir, "pairs": remaining}
        os.makedirs(plan["temp_dir"], exist_ok=True)
        plan_path, events_path = os.path.join(round_dir, "plan.json"), os.path.join(round_dir, "events.jsonl")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        with open(os.path.join(round_dir, "driver.log"), "wb") as log:
            proc = subprocess.Popen(_driver_cmd(events_path, plan_path), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        offset, current, deadline = 0, None, time.monotonic() + _START_S
        try:
            while True:
                events, offset = _read_events(events_path, offset)
                for ev in events:
                    if ev["event"] == "start":
                        current = (ev["test"], ev["backend"])
                        deadline = time.monotonic() + timeout_s + _GRACE_S
                    elif ev["event"] == "result":
                        results.append({k: v for k, v in ev.items() if k != "event"})
                        remaining.remove((ev["test"], ev["backend"]))
                        current = None
                        deadline = time.monotonic() + _GRACE_S
                    if on_event is not None:
                        on_event(ev)
                if not remaining:
                    break
                rc = proc.poll()
                if rc is not None or time.monotonic() > deadline:
                    if _read_events(events_path, offset)[0]:  # written just before it exited: handle them first
                        continue
                    hung = rc is None
                    _stop(proc)
                    if current is None:
                        what = "did not start" if hung else f"exited {rc} between tests"
                        raise SuiteError(f"test driver {what}; see {round_dir}/driver.log")
                    test, backend = current
                    why = (f"no result within {timeout_s + _GRACE_S:.0f}s; driver killed" if hung
                           else f"driver exited {rc} during the test")
                    rec = {"test": test, "backend": backend, "outcome": "timeout" if hung else "fail",
                           "seconds": None, "message": why, "log": os.path.join(log_dir, f"{test}.{backend}.log")}
                    results.append(rec)
                    remaining.remove(current)
                    if on_event is not None:
                        on_event({"event": "result", **rec})
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None and not remaining:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    _stop(proc)
            elif proc.poll() is None:
                _stop(proc)
        restarts += 1
    return results


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts per backend, regressions (gloo pass, homagg fail), documented exceptions."""
    by_test: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        by_test.setdefault(r["test"], {})[r["backend"]] = r
    counts = {b: {"pass": 0, "fail": 0, "skip": 0, "timeout": 0} for b in BACKENDS}
    for r in results:
        counts[r["backend"]][r["outcome"]] += 1
    regressions, exceptions, homagg_only, both_fail = [], [], [], []
    for test, per in by_test.items():
        g, h = per.get("gloo", {}).get("outcome"), per.get("homagg", {}).get("outcome")
        if g == "pass" and h in ("fail", "timeout"):
            message = per["homagg"].get("message", "")
            reason = exception_reason(test, message)
            entry = {"test": test, "message": message, "log": per["homagg"].get("log")}
            if reason is None:
                regressions.append(entry)
            else:
                exceptions.append({**entry, "reason": reason})
        elif h == "pass" and g in ("fail", "timeout"):
            homagg_only.append({"test": test, "message": per["gloo"].get("message", "")})
        elif g in ("fail", "timeout") and h in ("fail", "timeout"):
            both_fail.append({"test": test, "gloo": per["gloo"].get("message", ""), "homagg": per["homagg"].get("message", "")})
    return {"counts": counts, "regressions": regressions, "exceptions": exceptions,
            "homagg_only_passes": homagg_only, "both_fail": both_fail, "tests": by_test}


def _print_gates(info: dict[str, Any]) -> None:
    runs_for_gloo = [t for t in info["tests"] if t not in info["skipped_for_gloo"]]
    print(f"{len(info['tests'])} tests; {len(runs_for_gloo)} not skipped by a decorator for BACKEND=gloo.")
    print(f"Both runs import the suite with BACKEND=gloo. Under the name 'homagg' its decorators would skip "
          f"{len(info['static'])} more:")
    by_reason: dict[str, list[str]] = {}
    for name, why in sorted(info["static"].items()):
        by_reason.setdefault(why, []).append(name)
    for why, names in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(names):3d} x {why!r}: {', '.join(names)}")
    body = [t for t in info["body"] if t in runs_for_gloo]
    print(f"{len(body)} tests that run for gloo read BACKEND in their body (and see 'gloo'): {', '.join(body)}")
    for name, why in info["names"].items():
        print(f"Body sees the real name 'homagg': {name} ({why})")
    reasons = sorted(set(info["exceptions"].values()))
    for why in reasons:
        names = [n for n, r in info["exceptions"].items() if r == why]
        print(f"Documented exceptions ({why}): {', '.join(names)}")


def _report(summary: dict[str, Any], console: Any) -> None:
    from rich.markup import escape as esc
    from rich.table import Table

    table = Table(title="torch distributed suite")
    table.add_column("backend")
    for col in ("pass", "fail", "skip", "timeout"):
        table.add_column(col, justify="right")
    for b in BACKENDS:
        c = summary["counts"][b]
        table.add_row(b, *(str(c[k]) for k in ("pass", "fail", "skip", "timeout")))
    console.print(table)
    for e in summary["exceptions"]:
        console.print(f"[yellow]documented exception[/] {e['test']}: {esc(e['message'])}\n    reason: {esc(e['reason'])}")
    for e in summary["homagg_only_passes"]:
        console.print(f"[green]passes for homagg only[/] {e['test']} (gloo: {esc(e['message'])})")
    for e in summary["both_fail"]:
        console.print(f"[dim]fails for both[/] {e['test']}: gloo: {esc(e['gloo'])} | homagg: {esc(e['homagg'])}")
    for e in summary["regressions"]:
        console.print(f"[red]REGRESSION[/] {e['test']}: {esc(e['message'])}\n    log: {esc(str(e['log']))}")
    n = len(summary["regressions"])
    console.print(f"[{'red' if n else 'green'}]{n} regression(s)[/] (gloo passes, homagg fails), "
                  f"{len(summary['exceptions'])} documented exception(s)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)
    if args.world < 2:
        raise ConfigError(f"--world must be at least 2, got {args.world}")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    info = describe(args.world, gates=args.gates)
    if args.gates:
        _print_gates(info)
        return 0
    tests = select(info["tests"], args.quick, args.patterns)
    if args.list:
        print("\n".join(tests))
        return 0
    if not tests:
        raise ConfigError("no test of torch's distributed suite matches the selection")
    pairs = [(t, b) for t in tests for b in BACKENDS]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="homagg-torchsuite-")
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results = _run_with_progress(pairs, args, log_dir, console)
    summary = compare(results)
    _report(summary, console)
    console.print(f"{len(tests)} tests x {len(BACKENDS)} backends, world {args.world}, "
                  f"{args.start_method}, {time.monotonic() - t0:.0f}s; worker logs in {log_dir}", markup=False)
    if args.json_out:
        import torch

        doc = {"world": args.world, "start_method": args.start_method, "timeout_s": args.timeout,
               "torch": torch.__version__, "suite_backend": "gloo", "quick": args.quick, "patterns": args.patterns,
               "seconds": round(time.monotonic() - t0, 1), "log_dir": log_dir, **summary}
        Path(args.json_out).write_text(json.dumps(doc, indent=1, sort_keys=True))
    return 1 if summary["regressions"] else 0


def _run_with_progress(pairs: list[tuple[str, str]], args: argparse.Namespace, log_dir: str,
                       console: Any) -> list[dict[str, Any]]:
    from rich.markup import escape as esc
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    show_bar = not args.no_progress and console.is_terminal
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=not show_bar) as progress:
        task = progress.add_task("starting", total=len(pairs))
        seen: dict[str, str] = {}

        def on_event(ev: dict[str, Any]) -> None:
            if ev["event"] == "start":
                progress.update(task, description=esc(f"{ev['test']} [{ev['backend']}]"))
            elif ev["event"] == "result":
                progress.advance(task)
                seen[f"{ev['test']}/{ev['backend']}"] = ev["outcome"]
                if ev["backend"] == "homagg" and ev["outcome"] != "pass" and seen.get(f"{ev['test']}/gloo") == "pass":
                    progress.console.print(f"[red]homagg {ev['outcome']}[/] {ev['test']}: {esc(ev.get('message', ''))}")
                if not show_bar:
                    secs = ev.get("seconds")
                    progress.console.print(f"{ev['outcome']:>7} {ev['backend']:>6} {ev['test']}"
                                           + (f" ({secs:.1f}s)" if secs is not None else ""))

        return run_suite(pairs, world=args.world, timeout_s=args.timeout, start_method=args.start_method,
                         log_dir=log_dir, on_event=on_event)
