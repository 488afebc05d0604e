"""PyTorch's distributed suite against homagg: the gates, the two test classes and the driver.

The suite (``torch/testing/_internal/distributed/distributed_test.py``) reads ``BACKEND`` from the
environment at import and gates tests on that *name* in three places:

* decorators evaluated at import: ``skip_but_pass_in_sandcastle_if(BACKEND != "gloo", ...)``,
  ``require_backend_is_available({"gloo", ...})``, ``BACKEND not in DistTestCases.backend_feature
  ["ddp" | "subgroup" | ...]``, ``BACKEND in DistTestCases.skip_collective[...]``;
* test bodies reading the module global ``BACKEND`` (``test_accumulate_gradients_no_sync*`` only
  bind their model for gloo/mpi/nccl);
* ``TestDistBackend._run``, which calls ``init_process_group(backend=BACKEND)``.

Both runs therefore import the suite with ``BACKEND=gloo``: every decorator and body gate is
evaluated exactly as for gloo, so the same tests run.  The homagg run differs only in its worker
processes (:meth:`HomaggSuite._run`): before the test, ``torch.distributed.init_process_group`` and
``torch.distributed.new_group`` are wrapped so that a backend named gloo (``"gloo"``,
``Backend.GLOO``, ``"cpu:gloo"``) and the default group's ``backend=None`` are created as
``homagg`` (a default group that is not homagg then fails the test); ``new_group(backend=None)``
inherits homagg from the default group.  What the suite asserts about the backend's *name* is
evaluated with the real name (:data:`NAME_TESTS`).  :func:`static_gates` lists the decorator gates
that differ between the names; :func:`body_gates` the tests whose body reads ``BACKEND``.

Worker processes start with ``fork`` by default (upstream's ``test_distributed_spawn.py`` uses
spawn, ~30x slower here: every worker re-imports torch and the suite); the driver process never
creates a group or runs a tensor op before forking.

Run as ``python -m homagg.torch._suite_gates EVENTS PLAN`` (by :mod:`homagg.torch._suite`): runs the
``[test, backend]`` pairs of the JSON file PLAN in order and appends one JSON line per event to
EVENTS; each test's worker output goes to ``<log_dir>/<test>.<backend>.log``.
``--list OUT WORLD`` / ``--gates OUT WORLD`` write the suite's tests (and gates) as JSON.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import time
import traceback
import unittest
from typing import Any

__all__ = [
    "SUITE_BACKEND", "BACKENDS", "NAME_TESTS", "EXCEPTIONS", "prepare_environment", "suite_tests",
    "static_gates", "body_gates", "exception_reason", "summarize",
]

SUITE_BACKEND = "gloo"  # the name every gate of the suite is evaluated with
BACKENDS = ("gloo", "homagg")

#: tests that assert the backend's *name* against ``BACKEND``: the homagg run shows their body
#: ``BACKEND = "homagg"`` (the name it really has), not the gating name
NAME_TESTS: dict[str, str] = {
    "test_get_backend": "asserts dist.get_backend() == BACKEND.lower(); a homagg group is named homagg",
}

_MONITORED = (
    "torch's dist.monitored_barrier() raises 'only implemented for GLOO backend' for any group whose "
    "backend name is not gloo (a name check in distributed_c10d, before the group is called); call "
    "the homagg group's own monitored_barrier instead (issue 13 item 3)"
)
#: documented exceptions: test -> (regex the homagg failure must match, reason).  A failure that
#: does not match its regex (or a test not listed) is a regression.
EXCEPTIONS: dict[str, tuple[str, str]] = {
    name: (r"only implemented for GLOO backend", _MONITORED)
    for name in (
        "test_monitored_barrier_allreduce_hang",
        "test_monitored_barrier_allreduce_hang_wait_all_ranks",
        "test_monitored_barrier_failure_order",
        "test_monitored_barrier_gloo",
        "test_monitored_barrier_gloo_rank_0_timeout",
        "test_monitored_barrier_gloo_subgroup",
        "test_monitored_barrier_wait_all_ranks",
    )
}


def exception_reason(test: str, message: str) -> str | None:
    """The documented reason when ``test``'s homagg failure ``message`` is a known exception."""
    entry = EXCEPTIONS.get(test)
    if entry is None or not re.search(entry[0], message or ""):
        return None
    return entry[1]


def prepare_environment(world: int, temp_dir: str, timeout_s: float, backend: str = SUITE_BACKEND) -> None:
    """The variables the suite reads at import (must be set before it is imported)."""
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world)
    os.environ["TEMP_DIR"] = temp_dir
    os.environ.setdefault("INIT_METHOD", "env://")
    os.environ["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"  # its repro line names the wrong file
    # the suite's own per-test join timeout (read at import by common_distributed)
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(int(timeout_s))


def _suite() -> Any:
    from torch.testing._internal.distributed import distributed_test

    return distributed_test


def suite_tests() -> list[str]:
    """Every test name of ``DistributedTest._DistTestBase`` (sorted)."""
    base = _suite().DistributedTest._DistTestBase
    return sorted(n for n in dir(base) if n.startswith("test_") and callable(getattr(base, n)))


def statically_skipped() -> dict[str, str]:
    """Tests whose import-time decorators skip them under the current ``BACKEND``: name -> reason."""
    base = _suite().DistributedTest._DistTestBase
    out = {}
    for name in suite_tests():
        fn = getattr(base, name)
        if getattr(fn, "__unittest_skip__", False):
            out[name] = str(getattr(fn, "__unittest_skip_why__", ""))
    return out


def static_gates(world: int) -> dict[str, str]:
    """Tests that the suite's decorators skip under the name "homagg" but run under "gloo" (each
    name evaluated in a fresh interpreter): test -> the skip reason given for "homagg"."""
    import subprocess
    import tempfile

    skipped = {}
    for backend in (SUITE_BACKEND, "homagg"):
        with tempfile.TemporaryDirectory(prefix="homagg-gates-") as tmp:
            env = dict(os.environ)
            code = (
                "import json,sys,homagg.torch._suite_gates as g;"
                f"g.prepare_environment({world}, {tmp!r}, 300, {backend!r});"
                "json.dump(g.statically_skipped(), sys.stdout)"
            )
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError(f"listing the suite's gates for {backend} failed:\n{out.stderr[-2000:]}")
            skipped[backend] = json.loads(out.stdout)
    return {n: r for n, r in skipped["homagg"].items() if n not in skipped[SUITE_BACKEND]}


def body_gates() -> list[str]:
    """Tests whose body (or a helper it names ``_test_<rest>``) reads the global ``BACKEND``."""
    base = _suite().DistributedTest._DistTestBase
    names = []
    for name in suite_tests():
        fns = [getattr(base, name)] + [getattr(base, h) for h in (f"_{name}",) if hasattr(base, h)]
        for fn in fns:
            try:
                src = inspect.getsource(inspect.unwrap(fn))
            except (OSError, TypeError):
                continue
            body = src.split(":\n", 1)[-1]
            if re.search(r"\bBACKEND\b", body):
                names.append(name)
                break
    return names


def _as_homagg(backend: Any) -> Any:
    """A backend argument naming gloo, renamed homagg (``None`` and other names unchanged)."""
    if backend is None:
        return None
    text = str(backend)
    renamed = re.sub(r"(?i)(?<![\w])gloo(?![\w])", "homagg", text)
    return renamed if renamed != text else backend


def _route_to_homagg(test_name: str) -> None:
    """In a homagg worker process: groups the suite asks of gloo (or of no backend, for the default
    group) are created as homagg, and a default group that is not homagg is an error."""
    import torch.distributed as dist

    from . import _backend

    _backend.register()
    for attr in ("init_process_group", "new_group"):
        original = getattr(dist, attr)
        if getattr(original, "_homagg_routed", False):
            continue
        signature = inspect.signature(original)

        @functools.wraps(original)
        def routed(*args: Any, _orig: Any = original, _sig: Any = signature, _attr: str = attr, **kwargs: Any) -> Any:
            bound = _sig.bind_partial(*args, **kwargs)
            backend = bound.arguments.get("backend")
            if backend is None and _attr == "init_process_group":
                backend = "homagg"  # torch's default for CPU would be gloo
            bound.arguments["backend"] = _as_homagg(backend)
            result = _orig(*bound.args, **bound.kwargs)
            if _attr == "init_process_group" and dist.get_backend() != "homagg":
                raise RuntimeError(f"homagg torchsuite: default group is {dist.get_backend()!r}, not homagg")
            return result

        routed._homagg_routed = True  # type: ignore[attr-defined]
        setattr(dist, attr, routed)
    if test_name in NAME_TESTS:
        _suite().BACKEND = "homagg"


def _start_method() -> str:
    return os.environ.get("HOMAGG_TORCHSUITE_START", "spawn")


def _build_classes() -> dict[str, type]:
    dt = _suite()
    import torch.multiprocessing as tmp

    class GlooSuite(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        """Upstream's ``TestDistBackendWithSpawn``: the suite against gloo."""

        real_backend = "gloo"

        def setUp(self) -> None:
            super().setUp()
            self._start_processes(tmp.get_context(_start_method()).Process)

    class HomaggSuite(GlooSuite):
        """The same tests; their worker processes create homagg groups where gloo is asked for."""

        real_backend = "homagg"

        @classmethod
        def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any) -> None:
            _route_to_homagg(test_name)
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    classes = {"GlooSuite": GlooSuite, "HomaggSuite": HomaggSuite}
    for name, cls in classes.items():  # importable by name: spawn pickles the class by reference
        cls.__qualname__ = cls.__name__ = name
        cls.__module__ = "homagg.torch._suite_gates"
    return classes


_CLASSES: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name in ("GlooSuite", "HomaggSuite"):
        if not _CLASSES:
            _CLASSES.update(_build_classes())
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def summarize(text: str) -> str:
    """One line from a failed test's report: the first failing process's final exception line."""
    chunks = re.split(r"Process \d+ exited with error code \d+ and exception:\n", text or "")
    body = chunks[1] if len(chunks) > 1 else chunks[0]
    lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
    pat = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Timeout)\b")
    hits = [ln for ln in lines if pat.match(ln) and not ln.startswith("Traceback")]
    line = hits[-1] if hits else (lines[-1] if lines else "")
    return line[:300]


def _log_tail(path: str, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _run_one(test: str, backend: str, log_path: str) -> dict[str, Any]:
    cls = __getattr__("HomaggSuite" if backend == "homagg" else "GlooSuite")
    result = unittest.TestResult()
    t0 = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "wb") as log:  # this test's workers inherit fds 1 and 2
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            cls(test).run(result)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    record: dict[str, Any] = {"test": test, "backend": backend, "seconds": round(time.monotonic() - t0, 2),
                              "log": log_path}
    if result.skipped:
        record.update(outcome="skip", message=str(result.skipped[0][1])[:300])
    elif result.failures or result.errors:
        text = (result.failures or result.errors)[0][1]
        if "Process " not in text:  # no worker raised (an exit code, a timeout): the log tells why
            text += "\n--- worker output (tail) ---\n" + _log_tail(log_path)
            message = summarize(_log_tail(log_path)) or summarize(text)
        else:
            message = summarize(text)
        record.update(outcome="fail", message=message, detail=text[-8000:])
    elif result.expectedFailures:
        record.update(outcome="skip", message="expected failure")
    else:
        record.update(outcome="pass", message="")
    return record


def _emit(events: Any, record: dict[str, Any]) -> None:
    events.write(json.dumps(record) + "\n")
    events.flush()
    os.fsync(events.fileno())


def _describe(out_path: str, world: int, with_gates: bool) -> int:
    """``--list``/``--gates``: the suite's tests (and the gates that differ by name) as JSON."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="homagg-suite-") as tmp:
        prepare_environment(world, tmp, 300)
        info: dict[str, Any] = {"tests": suite_tests(), "skipped_for_gloo": statically_skipped()}
        if with_gates:
            info.update(static=static_gates(world), body=body_gates(),
                        names=NAME_TESTS, exceptions={k: v[1] for k, v in EXCEPTIONS.items()})
    with open(out_path, "w") as f:
        json.dump(info, f)
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("--list", "--gates"):
        return _describe(argv[1], int(argv[2]), argv[0] == "--gates")
    events_path, plan_path = argv
    with open(plan_path) as f:
        plan = json.load(f)
    world, timeout_s, pairs = plan["world"], plan["timeout_s"], plan["pairs"]
    os.environ["HOMAGG_TORCHSUITE_START"] = plan.get("start_method", "spawn")
    prepare_environment(world, plan["temp_dir"], timeout_s)
    from torch.testing._internal import common_distributed as cd

    for key, value in list(cd.TIMEOUT_OVERRIDE.items()):  # no test may outlast the per-test limit
        cd.TIMEOUT_OVERRIDE[key] = min(value, int(timeout_s))
    with open(events_path, "a") as events:
        _emit(events, {"event": "ready", "pid": os.getpid()})
        for test, backend in pairs:
            _emit(events, {"event": "start", "test": test, "backend": backend})
            log_path = os.path.join(plan["log_dir"], f"{test}.{backend}.log")
            try:
                record = _run_one(test, backend, log_path)
            except Exception:  # noqa: BLE001 - a harness error is this test's failure, reported
                text = traceback.format_exc()
                record = {"test": test, "backend": backend, "outcome": "fail", "seconds": 0.0,
                          "message": summarize(text), "detail": text[-6000:]}
            _emit(events, {"event": "result", **record})
    return 0


if __name__ == "__main__":  # run through the importable module, so spawn finds its classes
    from homagg.torch import _suite_gates

    sys.exit(_suite_gates.main(sys.argv[1:]))
