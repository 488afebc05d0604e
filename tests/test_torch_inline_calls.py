"""Small synchronous allreduces run in the caller's thread (issue 39), with 2 and 3 rank processes.

One launch per world size (``tests/_dist_scripts/inline_calls.py``); the rank script returns what it
got, the tests judge it: exact sums (README's bound for floats), gloo's result, FIFO order across
ranks with worker calls queued before, callbacks that issue collectives, calls during backward on
the worker, and a failing small call typed exactly as on the worker path.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from homagg.testing import check_within_bound

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import check_values, launch, make_input, tensor_from_json  # noqa: E402

_cache: dict[int, list[dict[str, Any]]] = {}


def outcome(world: int, check: str) -> list[Any]:
    """Every rank's returned value of ``check`` (a rank that raised fails here, with its traceback)."""
    if world not in _cache:
        _cache[world] = launch("inline_calls.py", world, timeout=240)[0]
    return check_values(_cache[world], check)


@pytest.mark.parametrize("world", [2, 3])
def test_small_sync_call_returns_completed_work_with_the_sum(world: int) -> None:
    per_rank = outcome(world, "completed")
    for name in ("float32", "float64", "int64", "avg_float32"):
        first = tensor_from_json(per_rank[0][name]["result"])
        for rank, value in enumerate(v[name] for v in per_rank):
            assert value["completed"] and value["future_done"] and value["success"], (rank, name, value)
            spec = value["input"]
            inputs = [make_input(r, spec) for r in range(world)]
            got = tensor_from_json(value["result"])
            assert got.dtype == inputs[0].dtype and got.shape == inputs[0].shape
            if got.dtype == torch.int64:
                assert torch.equal(got, sum(inputs)), (rank, name)
                assert torch.equal(got, tensor_from_json(value["gloo"])), (rank, name)
            else:
                check_within_bound(got, inputs, divisor=value["divisor"])
                torch.testing.assert_close(got, tensor_from_json(value["gloo"]), rtol=1e-6, atol=1e-6)
            assert torch.equal(got, first), f"rank {rank} differs from rank 0 ({name})"
            api = tensor_from_json(value["api"])  # a second call: its exponents may differ (history)
            if api.is_floating_point():
                check_within_bound(api, inputs, divisor=value["divisor"])
            else:
                assert torch.equal(api, got), (rank, name)
            assert torch.equal(got, tensor_from_json(value["value"])), (rank, name)


@pytest.mark.parametrize("world", [2, 3])
def test_small_calls_keep_fifo_order_behind_worker_calls(world: int) -> None:
    ranks_sum = float(sum(range(world)))
    for value in outcome(world, "fifo"):
        for it, got in enumerate(value["iterations"]):
            assert got["big"] == [ranks_sum + world * it] * 2, (it, got)
            assert got["small"] == float(sum(range(1, world + 1))), (it, got)
            assert got["small2"] == 10 * sum(range(world)), (it, got)
            assert got["b"] == [float(it % world)] * 2, (it, got)


@pytest.mark.parametrize("world", [2, 3])
def test_callback_on_small_call_issues_collectives(world: int) -> None:
    x = float(sum(range(1, world + 1)))
    for value in outcome(world, "chained"):
        assert value["x"] == x
        assert value["y"] == 2 * x * world and value["z"] == float(world)
        assert value["final"] == 2 * x * world + 1
        assert value["after"] == 3.0 * world


@pytest.mark.parametrize("world", [2, 3])
def test_small_call_during_backward_goes_to_the_worker(world: int) -> None:
    values = outcome(world, "backward")
    assert values[0]["completed_at_return"] == [False]  # rank 1 issues it 0.3 s later: still pending
    for value in values:
        assert value["grad"] == [float(sum(range(1, world + 1)))] * 3


@pytest.mark.parametrize("world", [2, 3])
def test_synchronous_gloo_side_ops_run_inline(world: int) -> None:
    for rank, value in enumerate(outcome(world, "gloo_side")):
        assert value["barrier"] and value["broadcast"] and value["max"], (rank, value)
        assert value["b"] == [1.0] * 3 and value["m"] == [float(world - 1), 0.0] and value["late"] == [0.0] * 2
        if rank:
            assert not value["async_completed_at_return"]  # rank 0 sends 0.2 s later: on the worker


@pytest.mark.parametrize("world", [2, 3])
def test_a_barrier_is_one_switch_round(world: int) -> None:
    """A barrier is one switch round (after switch rounds or not; gloo's barrier is never asked
    for), and it holds every rank until the last one arrives (the ranks enter 0.15 s apart)."""
    values = outcome(world, "barrier_round")
    for value in values:
        assert value["path"] == "switch" and value["sum"] == [float(world)], value
        assert value["gloo_barriers"] == 0, value
        assert value["after_switch"]["switch_rounds"] == value["again"]["switch_rounds"] == 1, value
    for which in ("after_switch", "again"):
        last_in = max(v[which]["entered"] for v in values)
        assert min(v[which]["left"] for v in values) >= last_in, (which, values)


@pytest.mark.parametrize("world", [2, 3])
def test_allgather_without_options(world: int) -> None:
    """``group.allgather(outs, ins)`` and ``_allgather_base`` with no options: torch's default
    options (an ``AttributeError`` before: ``torch.distributed`` does not re-export them)."""
    for value in outcome(world, "allgather"):
        assert value["outs"] == [[float(r)] * 2 for r in range(world)], value
        assert value["single"] == [float(r) for r in range(world) for _ in range(2)], value


@pytest.mark.parametrize("world", [2, 3])
def test_failing_small_call_is_typed_as_on_the_worker(world: int) -> None:
    for value in outcome(world, "failure"):
        inline, worker, want = value["inline"], value["worker"], value["nonfinite"]
        assert inline["completed_at_return"]
        typed = f"{want} (non-finite)"
        for key in ("wait", "later_allreduce", "later_large", "later_broadcast", "api"):
            assert inline[key] == typed, (key, inline)
        assert inline["exception"] == want and inline["is_success"] is False
        # torch's futures make every error a RuntimeError (the worker's too), carrying the message
        assert inline["future_wait"] == inline["chained_wait"] == "RuntimeError (non-finite)", inline
        worker.pop("completed_at_return")
        inline.pop("completed_at_return")
        assert inline == worker


def test_a_rank_late_for_the_barrier_is_waited_for() -> None:
    """Rank 1 enters the barrier 3 s after rank 0, three times the switch's progress timeout: rank 0
    waits for it, with no fallback and no warning; the RTO is unchanged."""
    results, _ = launch("late_barrier.py", 2, env={"HOMAGG_TIMEOUT": "1", "LATE_S": "3"}, timeout=120)
    assert min(r["left"] for r in results) >= max(r["entered"] for r in results), results
    assert results[0]["left"] - results[0]["entered"] >= 2.5, results[0]
    for rank, res in enumerate(results):
        assert res["path"] == "switch" and res["transitions"] == [] and res["warnings"] == [], (rank, res)
        assert res["rto_after"] == res["rto"] and res["after"] == [3.0] * 3, (rank, res)


def test_a_rank_that_never_comes_to_the_barrier_is_named_at_the_group_timeout() -> None:
    """Rank 1 is alive but never enters the barrier: rank 0's barrier raises RankTimeoutError
    (a RuntimeError too, as gloo's timeout is) naming rank 1 at the group's timeout (4 s), past
    the switch's (1 s), and once: no fallback to the host path (which would wait a second time)."""
    results, _ = launch("absent_barrier.py", 2, env={"HOMAGG_TIMEOUT": "1", "GROUP_TIMEOUT_S": "4"}, timeout=120)
    res = results[0]
    error = res["error"]
    assert error is not None and error["type"] == "RankTimeoutError" and error["ranks"] == [1], res
    assert error["is_runtime_error"] and "did not arrive" in error["message"], error
    assert 4.0 <= res["seconds"] < 7.0, res
    assert res["warnings"] == [] and res["transitions"] == [], res
