"""``ProcessGroupHomagg.monitored_barrier``: gloo's semantics, typed errors naming the late ranks (issue 13).

One launch per world size (``tests/_dist_scripts/monitored_barrier.py``); the rank script only
reports what each barrier did, the tests below judge it: every rank on time -> no error; late
ranks -> every rank that arrived gets :class:`homagg.RankTimeoutError` (a HomAggError and a
TimeoutError) naming the first late rank, or all of them with ``wait_all_ranks=True``, after about
the timeout; the group stays usable for a later barrier.  torch's own ``dist.monitored_barrier``
refuses the homagg group by name, which is why the README points at the group's method.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import launch  # noqa: E402

TIMEOUT_S = 2.5
_cache: dict[int, list[dict[str, Any]]] = {}


def results(world: int) -> list[dict[str, Any]]:
    if world not in _cache:
        _cache[world] = launch("monitored_barrier.py", world, timeout=180)[0]
    return _cache[world]


@pytest.mark.parametrize("world", [3, 4])
def test_all_ranks_on_time_pass(world: int) -> None:
    for rank, res in enumerate(results(world)):
        for scenario in ("all", "all_wait_all", "after"):
            assert res[scenario]["outcome"] == "ok", (rank, scenario, res[scenario])
            assert res[scenario]["seconds"] < TIMEOUT_S, (rank, scenario, res[scenario])


@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize(("scenario", "late", "named"), [
    ("one_late", lambda w: {w - 1}, lambda w: [w - 1]),
    ("two_late_first", lambda w: {1, w - 1}, lambda w: [1]),
    ("two_late_all", lambda w: {1, w - 1}, lambda w: [1, w - 1]),
])
def test_late_ranks_are_named(world: int, scenario: str, late: Any, named: Any) -> None:
    for rank, res in enumerate(results(world)):
        got = res[scenario]
        if rank in late(world):
            continue  # arrives after the others gave up: everyone did arrive, so it passes
        assert got["outcome"] == "RankTimeoutError" and got["is_timeout"], (rank, got)
        assert got["ranks"] == named(world), (rank, got)
        words = "rank " + str(named(world)[0]) if len(named(world)) == 1 else "ranks " + ", ".join(map(str, named(world)))
        assert words in got["message"], (rank, got["message"])
        assert TIMEOUT_S - 0.1 <= got["seconds"] < TIMEOUT_S + 5.0, (rank, got)


@pytest.mark.parametrize("world", [3])
def test_torch_monitored_barrier_refuses_homagg_by_name(world: int) -> None:
    for res in results(world):
        assert "gloo" in res["torch_api"].lower() and res["torch_api"] != "accepted", res["torch_api"]
