"""Run one function per rank in worker *processes* (demo, benchmark, tests).

Processes come from a ``forkserver`` that has imported torch and homagg once, so starting W
workers costs milliseconds, not W torch imports, and no parent threads are forked.  A worker's
return value (picklable) or exception comes back through a queue; :meth:`Workers.join` waits with
a bounded timeout and kills stragglers.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RankFailure", "Workers", "context"]

_CTX: Any = None


def context() -> Any:
    """The shared forkserver context (preloads torch, the codec and the UDP port; homagg.transport
    itself imports its ports lazily)."""
    global _CTX
    if _CTX is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "numpy", "homagg", "homagg.codec._protocol", "homagg.transport._udp"])
        _CTX = ctx
    return _CTX


@dataclass
class RankFailure:
    """What a rank raised: exception type name, message, traceback text, and its attributes."""

    rank: int
    type: str
    message: str
    traceback: str
    attrs: dict[str, Any] = field(default_factory=dict)


def _entry(target: Callable[..., Any], rank: int, args: tuple[Any, ...], q: Any) -> None:
    try:
        q.put((rank, True, target(rank, *args)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        attrs = {k: v for k, v in vars(exc).items() if isinstance(v, (int, str, float, list, type(None)))}
        q.put((rank, False, RankFailure(rank, type(exc).__name__, str(exc), traceback.format_exc(), attrs)))


class Workers:
    """``W`` processes running ``target(rank, *args)``; :meth:`join` collects results by rank."""

    def __init__(self, target: Callable[..., Any], world_size: int, *args: Any) -> None:
        ctx = context()
        self.queue = ctx.Queue()
        self.args = args  # keeps semaphores/queues passed to the children alive until they started
        self.procs = [ctx.Process(target=_entry, args=(target, r, args, self.queue), daemon=True)
                      for r in range(world_size)]
        for p in self.procs:
            p.start()

    def join(self, timeout: float) -> list[Any]:
        """Results (or :class:`RankFailure`) by rank; ranks that died without a word get a failure too."""
        out: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        n = len(self.procs)
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, _ok, value = self.queue.get(timeout=min(left, 0.2))
                out[rank] = value
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if r not in out and p.exitcode is not None]
                if dead and all(r in out or self.procs[r].exitcode is not None for r in range(n)):
                    time.sleep(0.2)  # let queued results drain
                    while True:
                        try:
                            rank, _ok, value = self.queue.get_nowait()
                            out[rank] = value
                        except queue.Empty:
                            break
                    for r in dead:
                        out.setdefault(r, RankFailure(r, "Died", f"exit code {self.procs[r].exitcode}", ""))
        self.terminate()
        for r in range(n):
            out.setdefault(r, RankFailure(r, "Timeout", f"no result within {timeout}s", ""))
        return [out[r] for r in range(n)]

    def terminate(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(5)

