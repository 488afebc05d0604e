"""One worker's codec, timed alone: a job's rounds recorded once, then replayed to worker 0.

``homagg bench gpu`` wants worker 0's encode and decode on a device without the other workers'
kernels on the same device and without a switch's time.  :func:`record` runs the whole job (W
workers on threads, the in-process switch, one :class:`~homagg.History` each, ``calls`` calls
of the same inputs, in place as the torch backend calls) and keeps what worker 0's port returned;
:class:`ReplayPort` hands those words back to worker 0 alone, call after call, with the same
history, so worker 0 runs exactly the protocol it ran in the job (the port checks every round's
streams against the recording and raises :class:`~homagg.ProtocolError` where they differ).

Timing: the port synchronises the device when a round is handed to it (so the span before it is
the encode of that round, device work included) and returns at once; the span after the last
round is the decode.  Those synchronisations are the port's, outside the codec: the counted run
(:func:`counted_call`) uses a port that makes none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import _errors
from ..codec._history import History
from ..codec._protocol import allreduce
from ..codec._stats import WorkerStats
from ..transport import InProcessSwitch, Stream, SwitchPort

__all__ = ["Recording", "record", "ReplayPort", "timed_call", "replay_call", "CallTimes"]


@dataclass
class Recording:
    """Worker 0's rounds of each call: ``(names, lengths)`` sent, and the words returned."""

    rounds: list[list[tuple[list[tuple[str, int]], list[torch.Tensor]]]]
    results: list[torch.Tensor]  #: worker 0's result of each call
    stats: WorkerStats


class _RecordingPort(SwitchPort):
    def __init__(self, inner: SwitchPort, sink: list[tuple[list[tuple[str, int]], list[torch.Tensor]]]) -> None:
        self._inner, self.sink = inner, sink
        self.rank, self.world_size = inner.rank, inner.world_size

    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        out = self._inner.combine(streams)
        self.sink.append(([(s.name, s.length) for s in streams], [t.clone() for t in out]))
        return out


def record(tensors: Sequence[torch.Tensor], scheme: str, calls: int, **options: Any) -> Recording:
    """Run ``calls`` in-place allreduces of ``tensors`` (one per worker, cloned for each call)."""
    world = len(tensors)
    switch = InProcessSwitch(world, timeout=600)
    rounds: list[list[tuple[list[tuple[str, int]], list[torch.Tensor]]]] = []
    results: list[torch.Tensor] = []
    errors: list[BaseException] = []
    stats = WorkerStats()

    def work(rank: int) -> None:
        try:
            history, port = History(), switch.port(rank)
            for _ in range(calls):
                x = tensors[rank].clone()
                if rank == 0:
                    rounds.append([])
                    port = _RecordingPort(switch.port(0), rounds[-1])
                out = allreduce(x, port, scheme=scheme, history=history, key="bench", inplace=True,
                                stats=stats if rank == 0 else None, **options)
                if rank == 0:
                    results.append(out.clone())
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            switch.fail(exc)

    threads = [threading.Thread(target=work, args=(r,), name=f"homagg-bench-{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return Recording(rounds, results, stats)


@dataclass
class CallTimes:
    """One replayed call: seconds before each round was handed over (encode) and after the last
    (decode)."""

    encode_s: float = 0.0
    decode_s: float = 0.0
    rounds: int = 0
    marks: list[tuple[float, float]] = field(default_factory=list)  #: (handed, returned) per round


class ReplayPort(SwitchPort):
    """Worker 0's port for one recorded call: each round's recorded words (fresh copies made
    before the call), after checking the streams sent are those recorded."""

    def __init__(self, recorded: list[tuple[list[tuple[str, int]], list[torch.Tensor]]], world_size: int,
                 sync: Callable[[], None] | None) -> None:
        self.rank, self.world_size = 0, world_size
        self._rounds = [(sig, [t.clone() for t in words]) for sig, words in recorded]
        self._sync = sync
        self.marks: list[tuple[float, float]] = []

    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        if self._sync is not None:
            self._sync()
        handed = time.perf_counter()
        if not self._rounds:
            raise _errors.ProtocolError("replay: more rounds than the recorded call")
        sig, words = self._rounds.pop(0)
        sent = [(s.name, s.length) for s in streams]
        if sent != sig:
            raise _errors.ProtocolError(f"replay: worker 0 sent {sent}, the job sent {sig}")
        self.marks.append((handed, time.perf_counter()))
        return words


def timed_call(x: torch.Tensor, recorded: list[tuple[list[tuple[str, int]], list[torch.Tensor]]], world: int,
               history: History, scheme: str, sync: Callable[[], None], **options: Any) -> tuple[CallTimes, torch.Tensor]:
    """Replay one call to worker 0 (``x`` is consumed: the call runs in place), timed."""
    port = ReplayPort(recorded, world, sync)
    sync()
    start = time.perf_counter()
    out = allreduce(x, port, scheme=scheme, history=history, key="bench", inplace=True, **options)
    sync()
    end = time.perf_counter()
    times = CallTimes(rounds=len(port.marks), marks=port.marks)
    last = start
    for handed, returned in port.marks:
        times.encode_s += handed - last
        last = returned
    times.decode_s = end - last
    return times, out


def replay_call(x: torch.Tensor, port: ReplayPort, history: History, scheme: str, **options: Any) -> torch.Tensor:
    """Replay one call to worker 0 through ``port`` (a :class:`ReplayPort` without ``sync``, made
    beforehand: its copies of the words are not the call's), for counting and profiling."""
    return allreduce(x, port, scheme=scheme, history=history, key="bench", inplace=True, **options)
