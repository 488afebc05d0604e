"""MAX and MIN all_reduce through the ``homagg`` process group (``tests/_dist_scripts/extremum.py``:
2 and 3 rank processes on loopback) against gloo's result of the same inputs, bit for bit.

Synchronous calls of small tensors of the dtypes :mod:`homagg.codec._extremum` takes run through the
switch (one round; int64 two where the ranks' high words differ); a NaN or a negative zero on any
rank sends the call on to gloo after that round (gloo's operand order decides those); float64 and
``async_op=True`` calls stay on gloo (no switch round).  int16, which gloo refuses, is judged
against the extremum of the inputs gathered over gloo.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import check_values, launch  # noqa: E402

_cache: dict[int, list[dict[str, Any]]] = {}


def outcome(world: int, check: str = "extremum") -> list[dict[str, Any]]:
    if world not in _cache:
        _cache[world] = launch("extremum.py", world, timeout=300)[0]
    return check_values(_cache[world], check)


def test_on_the_host_path_gloo_maxes_the_same_keys() -> None:
    """``switch="gloo"`` (the path a fallback takes): the rounds combined by gloo, gloo's results."""
    for rank, res in enumerate(outcome(2, "host path")):
        assert res.pop("rounds") > 0
        assert all(res.values()), (rank, res)


@pytest.mark.parametrize("world", [2, 3])
def test_results_are_gloos_and_the_switch_carries_what_it_takes(world: int) -> None:
    ranks = outcome(world)
    assert len(ranks[0]) == 10 * 3 * 5 * 2 - 3 * 2  # dtypes x sizes x cases x ops, less int16's async
    for key in ranks[0]:
        dtype, case = key.split()[0], " ".join(key.split()[2:-1])
        for rank, res in enumerate(ranks):
            got = res[key]
            assert got["same"], (rank, key)  # gloo's result, bit for bit
            if dtype == "float64" or case == "async":
                assert got == {"same": True, "rounds": 0, "switch_calls": 0}, (rank, key)
            else:
                wide_apart = dtype == "int64" and case == "apart"
                assert got["switch_calls"] == 1 and got["rounds"] == (2 if wide_apart else 1), (rank, key, got)
