"""Every collective of the ``homagg`` process group, with 2 and 4 rank processes.

One launch per world size runs all collectives (``tests/_dist_scripts/collectives.py``); the rank
script only returns what it got.  The tests below rebuild every rank's input here and judge the
returned values against their own oracle: exact sums and README's error bound
(:func:`homagg.testing.check_within_bound`), exact integer sums, the value each delegated op must
produce (and gloo's result, returned beside, must be identical).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from homagg.testing import check_within_bound, exact_sum

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import check_values, launch, make_input, tensor_from_json  # noqa: E402

REDUCTIONS = ["sum_float32", "avg_float32", "sum_float64", "sum_float16", "sum_bfloat16", "sum_large",
              "sum_int32", "sum_int64"]
_cache: dict[int, list[dict[str, Any]]] = {}


def results(world: int) -> list[dict[str, Any]]:
    if world not in _cache:
        _cache[world] = launch("collectives.py", world, timeout=240)[0]
    return _cache[world]


def outcome(world: int, check: str) -> list[Any]:
    """Every rank's returned value of ``check`` (a rank that raised fails here, with its traceback)."""
    return check_values(results(world), check)


def assert_reduction(world: int, per_rank: list[dict[str, Any]]) -> None:
    """Every rank's result: the input's dtype and shape, within the bound of the exact sum, all identical."""
    spec = per_rank[0]["input"]
    inputs = [make_input(r, spec) for r in range(world)]
    got = [tensor_from_json(v["result"]) for v in per_rank]
    for rank, (y, v) in enumerate(zip(got, per_rank)):
        assert v["input"] == spec, "ranks used different input specs"
        assert y.dtype == inputs[0].dtype and y.shape == inputs[0].shape, (rank, y.dtype, y.shape)
        check_within_bound(y, inputs, divisor=v["divisor"])
        assert torch.equal(y, got[0]), f"rank {rank} differs from rank 0"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("check", REDUCTIONS)
def test_allreduce_against_exact_sum(world: int, check: str) -> None:
    assert_reduction(world, outcome(world, check))


@pytest.mark.parametrize("world", [2, 4])
def test_identity_and_functional_collective(world: int) -> None:
    for value in outcome(world, "identity"):
        assert value["backend"] == "homagg" and value["name"]
        assert torch.equal(tensor_from_json(value["functional"]), torch.full((4,), float(world)))


def _delegated_oracle(world: int, rank: int, spec: dict[str, Any]) -> dict[str, Callable[[], list[torch.Tensor]]]:
    xs = [make_input(r, spec["x"]) for r in range(world)]
    bits = [make_input(r, spec["bits"]).abs() for r in range(world)]
    stack = torch.stack(xs)
    band = bits[0].clone()
    for b in bits[1:]:
        band &= b
    chunk = lambda src, dst: torch.full((4,), float(10 * src + dst))  # noqa: E731 - rank src's chunk for dst
    return {
        "max": lambda: [stack.amax(0)],
        "min": lambda: [stack.amin(0)],
        "band": lambda: [band],
        "uint8_sum": lambda: [sum((b % 9).to(torch.int64) for b in bits).remainder(256).to(torch.uint8)],
        "broadcast": lambda: [xs[world - 1]],
        "all_gather": lambda: xs,
        "all_gather_into_tensor": lambda: [torch.cat(xs)],
        "gather": lambda: xs if rank == 0 else [],
        "scatter": lambda: [chunk(0, rank)],
        "all_to_all": lambda: [chunk(src, rank) for src in range(world)],
        "all_to_all_single": lambda: [torch.cat([chunk(src, rank) for src in range(world)])],
    }


@pytest.mark.parametrize("world", [2, 4])
def test_delegated_ops_give_the_right_values(world: int) -> None:
    for rank, value in enumerate(outcome(world, "delegated")):
        oracle = _delegated_oracle(world, rank, value)
        for name in [*oracle, "product", "reduce"]:
            mine = [tensor_from_json(t) for t in value[name]["homagg"]]
            theirs = [tensor_from_json(t) for t in value[name]["gloo"]]
            assert len(mine) == len(theirs) and all(torch.equal(a, b) for a, b in zip(mine, theirs)), (rank, name)
            if name in oracle:
                want = oracle[name]()
                assert len(mine) == len(want) and all(torch.equal(a, b) for a, b in zip(mine, want)), (rank, name)
        xs = [make_input(r, value["x"]) for r in range(world)]
        prod = torch.stack(xs).double().prod(0)
        torch.testing.assert_close(tensor_from_json(value["product"]["homagg"][0]).double(), prod, rtol=1e-5, atol=0)
        if rank == 0:  # reduce's result is defined on dst only
            got = tensor_from_json(value["reduce"]["homagg"][0])
            torch.testing.assert_close(got.double(), exact_sum(xs), rtol=1e-6, atol=1e-6)
        assert value["objects"] == [{"rank": r} for r in range(world)]


@pytest.mark.parametrize("world", [2, 4])
def test_send_recv_ring(world: int) -> None:
    for rank, value in enumerate(outcome(world, "send_recv")):
        assert torch.equal(tensor_from_json(value["got"]), torch.full((8,), float((rank - 1) % world)))


@pytest.mark.parametrize("world", [2, 4])
def test_sparse_coo_allreduce(world: int) -> None:
    """Sparse COO SUM (through the codec since 749aca1): the dense view equals the exact sum, as gloo's does."""
    want = torch.zeros(16)
    for r in range(world):
        want[r] += 1.0
        want[7] += 2.0
    for value in outcome(world, "sparse_tensor"):
        assert value["is_sparse"]
        assert torch.equal(tensor_from_json(value["homagg"]), want)
        assert torch.equal(tensor_from_json(value["gloo"]), want)


@pytest.mark.parametrize("world", [2, 4])
def test_async_work_and_futures(world: int) -> None:
    for value in outcome(world, "async_futures"):
        assert all(value["done"]) and all(value["in_place"]), value
        for spec, res in zip(value["inputs"], value["values"]):
            inputs = [make_input(r, spec) for r in range(world)]
            check_within_bound(tensor_from_json(res), inputs)
        first = [make_input(r, value["inputs"][0]) for r in range(world)]
        check_within_bound(tensor_from_json(value["chained"]) / 2, first)  # then(): twice the first result


@pytest.mark.parametrize("world", [2, 4])
def test_two_groups_concurrently(world: int) -> None:
    per_rank = outcome(world, "two_groups")
    for key in ("a", "b"):
        assert_reduction(world, [v[key] for v in per_rank])
    for value in per_rank:
        assert value["jobs"] == per_rank[0]["jobs"]
        assert value["jobs"][0] != value["jobs"][1], "the second group must get its own switch job"


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_switch_fallback(world: int) -> None:
    per_rank = outcome(world, "gloo_switch")
    assert_reduction(world, per_rank)
    assert_reduction(world, [v["ints"] for v in per_rank])


@pytest.mark.parametrize("world", [2, 4])
def test_typed_errors_are_homagg_types(world: int) -> None:
    for rank, got in enumerate(outcome(world, "typed_errors")):
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
