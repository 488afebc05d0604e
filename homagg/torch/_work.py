"""Asynchronous work for the homagg process group: a FIFO worker thread and the Work it returns.

Invariants
----------
* One :class:`FifoWorker` per process group runs tasks strictly in submission order, so every rank
  issues its switch rounds and private-gloo calls in the same order.
* A task submitted *from the worker thread itself* (a collective issued inside a future callback,
  as PowerSGD does) runs inline, before the submit returns; queueing it would deadlock.
* Every :class:`HomaggWork` completes exactly once, with a result or an exception.  Errors reach the
  caller from :meth:`HomaggWork.wait` (as the original typed homagg error), from
  ``get_future().wait()`` and from every chained callback (DDP's reducer): never swallowed.
  ``torch.futures.Future.set_exception`` is not used because C++ sees it as a value; instead the
  base future carries a traceback-free copy of the error and a ``then`` stage raises it.
* :meth:`HomaggWork.wait_settled` returns only after every callback chained on the work's future
  ran (nested collectives included), which is what the backward guard of the process group needs.
* Every wait is bounded: :meth:`HomaggWork.wait` by its timeout, :meth:`FifoWorker.close` by its
  join timeout; queued tasks that never ran are failed when the worker closes.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from .._errors import SwitchTimeoutError, TransportError

__all__ = ["HomaggWork", "FifoWorker", "TaskResult"]

TaskResult = list[torch.Tensor]


class _Failure:
    """What the C++ future holds for a failed task: a traceback-free template of the error.

    The future is invisible to Python's cycle collector, so it must not reference frames (a
    traceback's frames reference the work, the group and their futures: an uncollectable cycle
    that would keep gloo threads alive).  Each ``raise`` gets a fresh copy.
    """

    __slots__ = ("template",)

    def __init__(self, exc: BaseException) -> None:
        self.template = _bare_copy(exc)

    def fresh(self) -> BaseException:
        return _bare_copy(self.template)


def _bare_copy(exc: BaseException) -> BaseException:
    """Same type, args and attributes as ``exc``; no traceback, cause or context."""
    copy = type(exc).__new__(type(exc))
    copy.args = exc.args
    copy.__dict__.update(getattr(exc, "__dict__", {}))
    return copy


def _unwrap(fut: torch.futures.Future) -> TaskResult:
    value = fut.value()
    if isinstance(value, _Failure):
        raise value.fresh()
    return value


class HomaggWork(dist._Work):
    """Work handle of one collective; completed by the worker with a tensor list or an exception."""

    def __init__(self, op: str, timeout_s: float) -> None:
        super().__init__()
        self.op = op
        self._timeout_s = timeout_s
        self._done = threading.Event()
        self._settled = threading.Event()  # set once every chained callback has run
        self._exc: BaseException | None = None
        self._result: TaskResult = []
        self._base: torch.futures.Future = torch.futures.Future()
        self._fut: torch.futures.Future = self._base.then(_unwrap)

    def _complete(self, result: TaskResult | None, exc: BaseException | None = None) -> None:
        """Finish this work once; runs chained callbacks in the calling thread."""
        if self._done.is_set():
            return
        self._exc = exc
        self._result = result if result is not None else []
        self._done.set()
        try:
            self._base.set_result(_Failure(exc) if exc is not None else self._result)
        finally:
            self._settled.set()

    def wait_settled(self, timeout_s: float) -> None:
        """Wait (bounded) until done and every chained callback ran; raise the task's error."""
        if not self._settled.wait(timeout_s):
            raise SwitchTimeoutError(f"homagg {self.op}: not completed within {timeout_s:.1f}s")
        if self._exc is not None:
            raise self._exc

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Block until done (bounded); raise the task's typed error if it failed."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
        bound = seconds if seconds > 0 else self._timeout_s
        if not self._done.wait(bound):
            raise SwitchTimeoutError(f"homagg {self.op}: not completed within {bound:.1f}s")
        if self._exc is not None:
            raise self._exc
        self._fut.wait()  # callbacks chained on the base stage have run
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self) -> BaseException | None:  # type: ignore[override]
        return self._exc

    def result(self) -> TaskResult:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()


class FifoWorker:
    """One daemon thread running a group's collectives in submission order."""

    def __init__(
        self, name: str, timeout_s: float, on_error: Callable[[BaseException], None] | None = None
    ) -> None:
        self._timeout_s = timeout_s
        self._on_error = on_error
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[Callable[[], TaskResult], HomaggWork]] = collections.deque()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def submit(self, op: str, fn: Callable[[], TaskResult]) -> HomaggWork:
        """Queue ``fn`` (inline when called from the worker thread); return its work handle."""
        work = HomaggWork(op, self._timeout_s)
        if threading.current_thread() is self._thread:
            self._run(fn, work)
            return work
        with self._cond:
            if self._closed:
                raise TransportError(f"homagg {op}: the process group has been shut down")
            self._queue.append((fn, work))
            self._cond.notify()
        return work

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                fn, work = self._queue.popleft()
            self._run(fn, work)

    def _run(self, fn: Callable[[], TaskResult], work: HomaggWork) -> None:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - delivered to the waiter (and on_error), not swallowed
            if self._on_error is not None:
                self._on_error(exc)
            work._complete(None, exc)
        else:
            work._complete(result)

    def close(self, join_timeout_s: float = 10.0) -> bool:
        """Stop after the running task; fail queued ones; return True if the thread ended."""
        with self._cond:
            self._closed = True
            self._on_error = None  # break the group <-> worker reference cycle
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for _, work in pending:
            work._complete(None, TransportError(f"homagg {work.op}: process group shut down before it ran"))
        if threading.current_thread() is self._thread:
            return False
        self._thread.join(join_timeout_s)
        return not self._thread.is_alive()
