"""Timers of the stage profile (:mod:`homagg.bench._stages`): the stages and the functions each holds,
exclusive wall/thread-CPU time per wrapped function and thread, the gaps, and the per-call table."""

from __future__ import annotations

import functools
import statistics
import sys
import threading
import time
from collections import defaultdict
from typing import Any

__all__ = ["STAGES", "GAPS", "WAIT", "TOTAL", "Timers", "install", "per_call", "stage_table"]

#: stage -> the wrapped functions ("module:Class.attr" or "module:function") whose exclusive time it holds
STAGES: dict[str, tuple[str, ...]] = {
    "caller: PG.allreduce, Work, submit": (
        "homagg.torch._process_group:ProcessGroupHomagg.allreduce", "homagg.torch._process_group:ProcessGroupHomagg._submit",
        "homagg.torch._work:FifoWorker.submit", "homagg.torch._work:HomaggWork.__init__",
        "homagg.torch._process_group:ProcessGroupHomagg._submit_small", "homagg.torch._work:FifoWorker.run_inline"),
    "codec set-up (Worker, local exponents, history, choice)": (
        "homagg.codec._worker:Worker.__init__", "homagg.codec._schemes:_prepare", "homagg.codec._schemes:choose",
        "homagg.codec._history:History.get", "homagg.codec._history:History.put", "homagg.codec._pipeline:segment_length",
        "homagg.codec._schemes:_changed", "homagg.codec._schemes:_guess_pays"),
    "exponents: guess / agreement / settle": (
        "homagg.codec._worker:Worker.guess", "homagg.codec._worker:Worker.guess_streams",
        "homagg.codec._worker:Worker.exponent_streams", "homagg.codec._worker:Worker.settle",
        "homagg.codec._worker:Worker.set_exponents", "homagg.codec._worker:Worker.union_sample",
        "homagg.codec._worker:Worker.nnz", "homagg.codec._worker:Worker.quantize"),
    "stream building (values, descriptor)": (
        "homagg.codec._worker:Worker.dense_stream", "homagg.codec._descriptor:describe"),
    "port: streams to chunk table, buffers, round set-up": (
        "homagg.transport._udp:UdpSwitchPort.combine", "homagg.transport._udp:UdpSwitchPort._run",
        "homagg.transport._udp:UdpSwitchPort.combine_arrays", "homagg.transport._roundplan:RoundPlan.run",
        "homagg.transport._udp:UdpSwitchPort.own_round", "homagg.transport._roundplan:PlanRound.run",
        "homagg.transport._roundloop:chunk_table", "homagg.transport._roundloop:RoundLoop.__init__",
        "homagg.transport._fastpath:NativeDatapath.__init__", "homagg.transport._fastpath:NativeRound.__init__",
        "homagg.transport._roundloop:RoundLoop.finish"),
    "datagram I/O: C round loop (send, wait, receive); local: the in-process switch": (
        "homagg.transport._inprocess:_InProcessPort.combine",
        "homagg.transport._fastpath:NativeRound.step", "homagg.transport._roundloop:RoundLoop.run_native",
        "homagg.transport._roundplan:RoundPlan.run_small", "homagg.transport._roundplan:RoundPlan._run_native",
        "homagg.transport._roundloop:RoundLoop.run_python", "homagg.transport._roundloop:RoundLoop.verify_early"),
    "decode (read sums, result, descriptor check)": (
        "homagg.codec._decoding:Decoding.read_dense", "homagg.codec._decoding:Decoding.dense_result",
        "homagg.codec._decoding:Decoding.result", "homagg.codec._decoding:Decoding.result_at_bits",
        "homagg.codec._descriptor:check"),
    "protocol glue (generators, codec.allreduce, path port)": (
        "homagg.codec._protocol:allreduce", "homagg.codec._protocol:_allreduce", "homagg.torch._fallback:PathPort.combine",
        "homagg.torch._fallback:PathPort.own_round", "homagg.torch._path_round:PathRound.run",
        "homagg.torch._fallback:PathPort.at_call_boundary", "homagg.torch._fallback:PathPort.end_call",
        "homagg.torch._switch_calls:SwitchCalls._codec_allreduce", "homagg.torch._switch_calls:SwitchCalls._on_port",
        "homagg.torch._work:FifoWorker._run"),
    "completion: Work._complete (futures, events); inline: CompletedWork": (
        "homagg.torch._work:HomaggWork._complete", "homagg.torch._work:CompletedWork.__init__",
        "homagg.torch._work:CompletedWork.wait"),
    "small path: codec (values, exponent, guess, quantise, decode, history)": (
        "homagg.codec._small:allreduce", "homagg.codec._small:_float_call", "homagg.codec._small:int_call",
        "homagg.codec._small_ints:IntSteady.run",
        "homagg.codec._small:_Steady.call", "homagg.codec._small:local_exponent", "homagg.codec._small:quantize",
        "homagg.codec._small:dequantize", "homagg.codec._small:_Call.round", "homagg.codec._descriptor:words",
        "homagg.codec._small:_Steady.native"),
    "mid-size path: codec (exponents, guess, quantise, settle, decode, history)": (
        "homagg.codec._mid:allreduce", "homagg.codec._mid:_named_round"),
}
TOTAL = "total (median call, caller's wall)"
#: wrapped for the gaps and the caller's CPU, not summed (the caller waits there while the worker runs)
WAIT = "homagg.torch._work:HomaggWork.wait"
#: gaps between two timestamps (wall only), see the module docstring
GAPS = ("hand-off: submit -> worker runs the task", "wake-up: Work._complete's end -> caller's wait returns",
        "torch dispatch: dist.all_reduce -> PG.allreduce")


class Timers:
    """Exclusive wall/thread-CPU time per wrapped function, per thread; timestamps for the gaps."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.wall: dict[str, int] = defaultdict(int)
        self.cpu: dict[str, int] = defaultdict(int)
        self.marks: dict[str, int] = {}
        self.gaps: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)  #: wrapped calls per function (the timers' own cost)

    def wrap(self, name: str, fn: Any) -> Any:
        timers = self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = getattr(timers.local, "stack", None)
            if stack is None:
                stack = timers.local.stack = []
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            stack.append([0, 0])  # children's wall, cpu
            try:
                return fn(*args, **kwargs)
            finally:
                w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                kids = stack.pop()
                with timers.lock:
                    timers.wall[name] += w1 - w0 - kids[0]
                    timers.cpu[name] += c1 - c0 - kids[1]
                    timers.calls[name] += 1
                if stack:
                    stack[-1][0] += w1 - w0
                    stack[-1][1] += c1 - c0
                timers.after(name, w0, w1)

        return timed

    def after(self, name: str, start: int, end: int) -> None:
        """Gap bookkeeping: remember when submit returned / _complete started; charge the gaps."""
        if name.endswith("FifoWorker.submit"):
            self.marks["submitted"] = end
        elif name.endswith("FifoWorker._run") and "submitted" in self.marks:
            self.gaps[GAPS[0]] += max(0, start - self.marks.pop("submitted"))
        elif name.endswith("HomaggWork._complete"):
            self.marks["completed"] = end
        elif name == WAIT and "completed" in self.marks:
            self.gaps[GAPS[1]] += max(0, end - self.marks.pop("completed"))
        elif name.endswith("ProcessGroupHomagg.allreduce") and "issued" in self.marks:
            self.gaps[GAPS[2]] += max(0, start - self.marks.pop("issued"))

    def snapshot(self) -> dict[str, tuple[int, int]]:
        with self.lock:
            out = {k: (v, self.cpu[k]) for k, v in self.wall.items()}
            out.update({k: (v, 0) for k, v in self.gaps.items()})
            out["wrapped calls"] = (sum(self.calls.values()), 0)
            return out


def _resolve(path: str) -> tuple[Any, str]:
    import importlib

    module_name, _, attr = path.partition(":")
    owner: Any = importlib.import_module(module_name)
    *outer, last = attr.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, last


def install(timers: Timers) -> list[str]:
    """Wrap every function of :data:`STAGES` that exists; return those that do not (renamed?)."""
    missing = []
    for names in (*STAGES.values(), (WAIT,)):
        for path in names:
            try:
                owner, attr = _resolve(path)
                raw = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
            except (ImportError, AttributeError, KeyError):
                missing.append(path)
                continue
            if isinstance(raw, (staticmethod, classmethod)):
                missing.append(path)
                continue
            setattr(owner, attr, timers.wrap(path, raw))
    # modules that imported a wrapped function by name keep the original: point them at the wrapper
    import homagg.codec._protocol as proto
    import homagg.codec._schemes as schemes
    import homagg.testing._local as local
    import homagg.transport._roundplan as plans

    proto.protocol = schemes.protocol
    local.allreduce = proto.allreduce
    plans.chunk_table = sys.modules["homagg.transport._roundloop"].chunk_table
    return missing


def per_call(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {k: (v[0] - before.get(k, (0, 0))[0], v[1] - before.get(k, (0, 0))[1]) for k, v in after.items()}


def stage_table(calls: list[dict[str, tuple[int, int]]], totals: list[int]) -> dict[str, dict[str, float]]:
    """Per stage (and gap): median over calls of its per-call wall and CPU (us); ``other``: the
    median call's wall less the stages' medians."""
    out: dict[str, dict[str, float]] = {}
    for stage, names in [*STAGES.items(), *((g, (g,)) for g in GAPS)]:
        wall = [sum(c.get(n, (0, 0))[0] for n in names) for c in calls]
        cpu = [sum(c.get(n, (0, 0))[1] for n in names) for c in calls]
        out[stage] = {"wall_us": statistics.median(wall) / 1e3, "cpu_us": statistics.median(cpu) / 1e3,
                      "wall_mean_us": statistics.fmean(wall) / 1e3}
    for name in sorted({n for c in calls for n in c if n not in out and n != "wrapped calls"}):
        wall = [c.get(name, (0, 0))[0] for c in calls]
        cpu = [c.get(name, (0, 0))[1] for c in calls]
        out[f"  fn {name.partition(':')[2]}"] = {"wall_us": statistics.median(wall) / 1e3,
                                                "cpu_us": statistics.median(cpu) / 1e3,
                                                "wall_mean_us": statistics.fmean(wall) / 1e3}
    total = statistics.median(totals) / 1e3
    summed = sum(v["wall_us"] for k, v in out.items() if not k.startswith("  fn "))
    out["other (not wrapped)"] = {"wall_us": total - summed, "cpu_us": 0.0,
                                  "wall_mean_us": 0.0}
    out["(wrapped calls per call: the timers' cost, ~1 us each)"] = {
        "wall_us": 0.0, "cpu_us": 0.0, "wall_mean_us": statistics.fmean(c.get("wrapped calls", (0, 0))[0] for c in calls)}
    waits = [c.get(WAIT, (0, 0))[1] for c in calls]
    out["(caller's CPU in Work.wait; not in the sum)"] = {"wall_us": 0.0, "cpu_us": statistics.median(waits) / 1e3,
                                                        "wall_mean_us": 0.0}
    out[TOTAL] = {"wall_us": total, "cpu_us": 0.0, "wall_mean_us": statistics.fmean(totals) / 1e3}
    return out
