"""The homagg group's :class:`FifoWorker` and its works, in one process (no network needed).

Tasks run in a caller's thread (``run_inline``) only while the worker is idle, and the worker
starts nothing meanwhile; ``close`` waits (bounded) for an inline task; a :class:`CompletedWork`
answers every public method as a completed :class:`HomaggWork` does.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch

from homagg import NonFiniteError, TransportError
from homagg.torch._work import CompletedWork, FifoWorker, HomaggWork


def _worker(errors: list[BaseException] | None = None) -> FifoWorker:
    return FifoWorker("test-fifo", 5.0, on_error=None if errors is None else errors.append)


def test_inline_runs_only_while_the_worker_is_idle_and_holds_its_order() -> None:
    worker, order = _worker(), []
    gate, started = threading.Event(), threading.Event()

    def slow() -> list[torch.Tensor]:
        started.set()
        gate.wait(5)
        order.append("queued 1")
        return []

    queued = worker.submit("slow", slow)
    assert started.wait(5)
    assert worker.run_inline("small", lambda: order.append("inline refused") or []) is None  # a task runs
    gate.set()
    queued.wait()
    assert worker.run_inline("small", lambda: order.append("inline 1") or []) is not None

    inline_gate, inline_started = threading.Event(), threading.Event()

    def blocking_inline() -> None:
        def fn() -> list[torch.Tensor]:
            inline_started.set()
            inline_gate.wait(5)
            order.append("inline 2")
            return []
        worker.run_inline("small", fn)

    caller = threading.Thread(target=blocking_inline)
    caller.start()
    assert inline_started.wait(5)
    later = worker.submit("later", lambda: order.append("queued 2") or [])
    time.sleep(0.1)
    assert not later.is_completed(), "the worker started a task while an inline one ran"
    assert worker.run_inline("small", lambda: order.append("inline refused") or []) is None  # one is queued
    inline_gate.set()
    caller.join(5)
    later.wait()
    assert order == ["queued 1", "inline 1", "inline 2", "queued 2"]
    assert worker.close(2.0)


def test_a_call_right_after_a_worker_task_runs_inline() -> None:
    """The caller wakes when the worker's task completes, before the worker is free (here: a
    callback chained on the work that takes 1 ms, as a barrier's completion races the worker's
    bookkeeping); the next small call still runs in the caller's thread, after the worker."""
    worker, order = _worker(), []
    for _ in range(20):
        work = worker.submit("barrier", lambda: [])
        work.get_future().then(lambda fut: time.sleep(0.001) or order.append("callback"))
        work.wait()
        done = worker.run_inline("small", lambda: order.append("inline") or [])
        assert isinstance(done, CompletedWork), "queued behind a worker that was finishing"
        assert order[-2:] == ["callback", "inline"]
    worker.close()


def test_close_waits_for_an_inline_task_bounded() -> None:
    worker, gate, started = _worker(), threading.Event(), threading.Event()
    done: list[Any] = []

    def fn() -> list[torch.Tensor]:
        started.set()
        gate.wait(10)
        return [torch.ones(1)]

    caller = threading.Thread(target=lambda: done.append(worker.run_inline("small", fn)))
    caller.start()
    assert started.wait(5)
    t0 = time.monotonic()
    assert worker.close(0.3) is False  # the inline task still runs: not waited for beyond the bound
    assert 0.25 <= time.monotonic() - t0 < 2.0
    gate.set()
    caller.join(5)
    assert isinstance(done[0], CompletedWork) and done[0].result()[0].item() == 1.0
    with pytest.raises(TransportError):
        worker.run_inline("small", lambda: [])

    worker2, gate2, started2 = _worker(), threading.Event(), threading.Event()
    caller2 = threading.Thread(target=lambda: worker2.run_inline("small", lambda: started2.set() or gate2.wait(5) or []))
    caller2.start()
    assert started2.wait(5)
    threading.Timer(0.2, gate2.set).start()
    t0 = time.monotonic()
    assert worker2.close(5.0) is True  # ends once the inline task did
    assert 0.15 <= time.monotonic() - t0 < 4.0
    caller2.join(5)


def test_inline_errors_reach_on_error_and_the_work() -> None:
    errors: list[BaseException] = []
    worker = _worker(errors)
    work = worker.run_inline("allreduce", lambda: (_ for _ in ()).throw(NonFiniteError("input holds 1 NaN")))
    assert work is not None and errors and isinstance(errors[0], NonFiniteError)
    with pytest.raises(NonFiniteError):
        work.wait()

    def interrupted() -> list[torch.Tensor]:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        worker.run_inline("allreduce", interrupted)
    assert isinstance(errors[1], TransportError) and "interrupted" in str(errors[1])
    assert worker.run_inline("allreduce", lambda: []) is not None  # the worker is free again
    assert worker.close(2.0)


def _behaviour(work: Any) -> dict[str, Any]:
    """Every public method of a completed work, as comparable values."""
    def outcome(fn: Any) -> Any:
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - compared
            return (type(exc).__name__, str(exc).splitlines()[0])  # (torch's futures add a traceback)
        return [t.tolist() for t in value] if isinstance(value, list) else value

    chained = work.get_future().then(lambda f: [t * 2 for t in f.value()])
    return {
        "wait": outcome(work.wait), "wait_timeout": outcome(lambda: work.wait(timedelta(seconds=1))),
        "is_completed": work.is_completed(), "is_success": work.is_success(),
        "exception": outcome(lambda: work.exception() and (_ for _ in ()).throw(work.exception())),
        "result": outcome(work.result), "synchronize": outcome(work.synchronize),
        "wait_settled": outcome(lambda: work.wait_settled(1.0)),
        "future_done": work.get_future().done(), "future": outcome(work.get_future().wait),
        "future_value": outcome(work.get_future().value), "chained": outcome(chained.wait),
        "same_future": work.get_future() is work.get_future(),
    }


@pytest.mark.parametrize("failed", [False, True])
def test_completed_work_behaves_as_a_completed_homagg_work(failed: bool) -> None:
    exc = NonFiniteError("input holds 1 non-finite value(s); nothing was sent") if failed else None
    result = None if failed else [torch.tensor([1.0, 2.0])]
    old = HomaggWork("allreduce", 5.0)
    old._complete(result, exc)
    new = CompletedWork("allreduce", result, exc)
    assert isinstance(new, torch.distributed._Work)
    assert _behaviour(new) == _behaviour(old)
