"""Asynchronous work for the homagg process group: a FIFO worker thread and the Work it returns.

Invariants
----------
* One :class:`FifoWorker` per process group runs tasks strictly in submission order, so every rank
  issues its switch rounds and private-gloo calls in the same order.
* A task submitted *from the worker thread itself* (a collective issued inside a future callback,
  as PowerSGD does) runs inline, before the submit returns; queueing it would deadlock.
* :meth:`FifoWorker.run_inline` runs a task in the *caller's* thread only while the worker is idle
  (nothing queued, nothing running), and the worker starts no queued task until it is done: at most
  one task runs at a time, in submission order.  It returns a :class:`CompletedWork`, whose
  callbacks run in the caller's thread after the worker is free again (a callback may issue the
  next collective).
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
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from .._errors import SwitchTimeoutError, TransportError

__all__ = ["HomaggWork", "CompletedWork", "FifoWorker", "TaskResult"]

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


class _TaskWork(dist._Work):
    """What both works answer alike from a task's outcome (``_exc``, ``_result``) and their ``wait``."""

    _exc: BaseException | None
    _result: TaskResult

    def exception(self) -> BaseException | None:  # type: ignore[override]
        return self._exc

    def result(self) -> TaskResult:
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()


class HomaggWork(_TaskWork):
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


class CompletedWork(_TaskWork):
    """Work handle of a task that already ran (in the caller's thread): what :class:`HomaggWork`
    is once completed, for every public method, without its events; the future is made on first
    :meth:`get_future` (an already completed one, so a chained callback runs at once, in the
    thread that chains it)."""

    def __init__(self, op: str, result: TaskResult | None, exc: BaseException | None = None) -> None:
        super().__init__()
        self.op = op
        self._exc = exc
        self._result: TaskResult = result if result is not None else []
        self._fut: torch.futures.Future | None = None

    def wait_settled(self, timeout_s: float) -> None:
        """Raise the task's error, if any (nothing is pending)."""
        if self._exc is not None:
            raise self._exc

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        """Return at once; raise the task's typed error if it failed."""
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self) -> torch.futures.Future:
        if self._fut is None:
            base: torch.futures.Future = torch.futures.Future()
            if self._exc is None:
                base.set_result(self._result)
                self._fut = base
            else:  # as HomaggWork's: the error reaches every chained callback (see _Failure)
                base.set_result(_Failure(self._exc))
                self._fut = base.then(_unwrap)
        return self._fut

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return self._exc is None


#: how long :meth:`FifoWorker.run_inline` waits for a worker that is finishing a task (and nothing is
#: queued) before it queues the call instead
SETTLE_S = 0.005


class FifoWorker:
    """One daemon thread running a group's collectives in submission order."""

    def __init__(
        self, name: str, timeout_s: float, on_error: Callable[[BaseException], None] | None = None
    ) -> None:
        self._timeout_s = timeout_s
        self._on_error = on_error
        #: the condition's own lock: ``with self._lock`` is ``with self._cond`` less its Python-level
        #: ``__enter__``/``__exit__`` (run_inline takes it twice per call)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: collections.deque[tuple[Callable[[], TaskResult], HomaggWork]] = collections.deque()
        self._closed = False
        self._busy = False  # a task runs (on the worker, or inline in a caller's thread)
        self._inline: threading.Thread | None = None  # the caller's thread running a task inline
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

    def run_inline(self, op: str, fn: Callable[[], TaskResult]) -> CompletedWork | None:
        """Run ``fn`` now in the calling thread (not the worker's) if nothing is queued or running;
        None (nothing done) otherwise.  The worker starts no task meanwhile; the returned work is
        completed after the worker is free again.  ``fn``'s error goes to ``on_error`` and into
        the work, as on the worker; an interrupt (a ``BaseException``) propagates, and
        ``on_error`` gets a :class:`~homagg.TransportError` (the ranks may be out of step)."""
        me = threading.current_thread()
        with self._lock:
            if me is not self._thread and self._busy and not self._queue and self._inline is None:
                # the worker is finishing a task, often the one the caller has just waited for (its
                # completion wakes the caller before the worker is free: a barrier, then this call);
                # a short wait saves queueing behind it (a hand-off to the worker and a wake-up back)
                self._cond.wait_for(lambda: not self._busy or self._queue or self._closed, SETTLE_S)
            if self._closed:
                raise TransportError(f"homagg {op}: the process group has been shut down")
            if self._queue or self._busy or me is self._thread:
                return None
            self._busy, self._inline = True, me
        exc: BaseException | None = None
        result: TaskResult | None = None
        try:
            result = fn()
        except Exception as err:  # noqa: BLE001 - delivered to the caller (and on_error), not swallowed
            exc = err
            self._failed(err)
        except BaseException as err:
            self._failed(TransportError(f"homagg {op}: interrupted ({type(err).__name__}) in the caller's "
                                        "thread; the ranks may be out of step"))
            raise
        finally:
            with self._lock:
                self._busy, self._inline = False, None
                if self._queue or self._closed:  # only then does a thread wait for this (an idle
                    self._cond.notify_all()  # worker woken for nothing costs a GIL hand-off per call)
        return CompletedWork(op, result, exc)

    def _failed(self, exc: BaseException) -> None:
        on_error = self._on_error
        if on_error is not None:
            on_error(exc)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while (not self._queue or self._busy) and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                fn, work = self._queue.popleft()
                self._busy = True
            try:
                self._run(fn, work)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()  # a caller may wait in run_inline (no waiter: no syscall)

    def _run(self, fn: Callable[[], TaskResult], work: HomaggWork) -> None:
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - delivered to the waiter (and on_error), not swallowed
            self._failed(exc)
            work._complete(None, exc)
        else:
            work._complete(result)

    def close(self, join_timeout_s: float = 10.0) -> bool:
        """Stop after the running task (on the worker or inline in another thread: both waited for
        within ``join_timeout_s`` in all); fail queued ones; return True if both ended."""
        deadline = time.monotonic() + join_timeout_s
        me = threading.current_thread()
        with self._cond:
            self._closed = True
            self._on_error = None  # break the group <-> worker reference cycle
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for _, work in pending:
            work._complete(None, TransportError(f"homagg {work.op}: process group shut down before it ran"))
        with self._cond:
            inline_done = self._cond.wait_for(lambda: self._inline in (None, me), join_timeout_s)
        if me is self._thread:
            return False
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return inline_done and not self._thread.is_alive()
