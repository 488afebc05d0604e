"""Every collective of the ``homagg`` process group against gloo, with 2 and 4 rank processes.

One launch per world size runs all checks (``tests/_dist_scripts/collectives.py``); each test
below asserts one of them on every rank, so a failure names the collective.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import launch  # noqa: E402

CHECKS = [
    "identity", "sum_float32", "avg_float32", "sum_float64", "sum_float16", "sum_bfloat16", "sum_large",
    "sum_int32", "sum_int64", "delegated", "send_recv", "sparse_tensor", "async_futures", "two_groups",
    "gloo_switch", "typed_errors",
]
_cache: dict[int, list[dict[str, Any]]] = {}


def results(world: int) -> list[dict[str, Any]]:
    if world not in _cache:
        _cache[world] = launch("collectives.py", world, timeout=240)[0]
    return _cache[world]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("check", CHECKS)
def test_collective(world: int, check: str) -> None:
    for rank, res in enumerate(results(world)):
        value = res[check]
        assert not (isinstance(value, str) and value.startswith("FAILED")), f"rank {rank}: {value}"


@pytest.mark.parametrize("world", [2, 4])
def test_typed_errors_are_homagg_types(world: int) -> None:
    for rank, res in enumerate(results(world)):
        got = res["typed_errors"]
        # the rank with the NaN fails before sending; the others time out waiting for it
        assert got["nan"] == ("NonFiniteError" if rank == 0 else "SwitchTimeoutError"), got
        assert got["after"] == got["nan"] and got["overflow"] == "IntegerOverflowError"


@pytest.mark.parametrize("world", [2, 4])
def test_destroy_leaves_no_threads(world: int) -> None:
    for rank, res in enumerate(results(world)):
        assert res["threads_after_destroy"] == ["MainThread"], res["threads_after_destroy"]
        before, after = res["os_threads"]
        assert after <= before + 1, (rank, res["os_thread_names"])  # +1: torch's intra-op pool
        assert res["live_groups"] == 0


def test_second_group_gets_its_own_job() -> None:
    jobs = results(2)[0]["two_groups"]["jobs"]
    assert len(set(jobs)) == 2
