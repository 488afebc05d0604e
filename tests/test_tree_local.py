"""Aggregation trees in-process (docs/trees.md): real switch pipelines in every role, no sockets.

Oracles: the reference ``combine_words`` of all ranks' words (the one-switch result, which has no
32-worker limit in-process), :func:`homagg.testing.local_allreduce` (the in-process switch), the
exact sum; and the switches' counters: every member combined exactly once per use at every level.
"""

from __future__ import annotations

import pytest
import torch

from homagg import ConfigError
from homagg.jobs import JobSpec, WorkerAddr
from homagg.testing import HOPS, HopFaults, TreeNetwork, local_allreduce, run_tree_local, sparse_tensors
from homagg.transport import Stream, combine_words
from homagg.tree import MAX_TREE_RANKS, plan_tree
from homagg.wire import CombineOp

SCHEMES = ("auto", "sketch", "compact", "dense")


# -- planning ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("world,per_switch,levels,switches", [
    (1, 32, 1, 1), (32, 32, 1, 1), (33, 32, 2, 3), (64, 8, 2, 9), (1024, 32, 2, 33), (40, 4, 3, 14)])
def test_plan_places_every_rank_once(world: int, per_switch: int, levels: int, switches: int) -> None:
    plan = plan_tree(world, per_switch=per_switch, max_levels=3)
    assert (plan.levels, len(plan.switches)) == (levels, switches)
    seen = set()
    for r in range(world):
        leaf, wid = plan.place(r)
        s = plan.switches[leaf]
        assert s.is_leaf and s.ranks is not None and s.ranks[wid] == r and 0 <= wid < s.members <= per_switch
        seen.add((leaf, wid))
    assert len(seen) == world
    for s in plan.switches[1:]:
        parent = plan.switches[s.parent]  # type: ignore[index]
        assert parent.level == s.level - 1 and 0 <= s.child_id < parent.members
        assert [c.child_id for c in plan.children(parent.index)] == list(range(parent.members))
    sizes = [s.members for s in plan.leaves]
    assert max(sizes) - min(sizes) <= 1  # balanced


def test_plan_refuses_beyond_two_levels_naming_the_limit() -> None:
    assert plan_tree(MAX_TREE_RANKS).levels == 2
    with pytest.raises(ConfigError, match="1025 exceeds 1024 ranks.*2 levels"):
        plan_tree(1025)
    with pytest.raises(ConfigError, match="per_switch 33"):
        plan_tree(8, per_switch=33)
    with pytest.raises(ConfigError):
        plan_tree(0)


def test_jobspec_tree_fields_validate_and_round_trip() -> None:
    spec = JobSpec(3, 2, 0, 8, 32, (WorkerAddr(0, "10.0.0.1", 1), WorkerAddr(1, "10.0.0.2", 1)), token=9,
                   parent=("10.0.9.9", 18497), child_id=5).validate()
    assert spec.is_child and JobSpec.from_json(spec.to_json()) == spec
    assert spec.to_dict()["parent"] == "10.0.9.9:18497"
    assert not JobSpec(3, 2).is_child
    with pytest.raises(ConfigError, match="without a parent"):
        JobSpec(3, 2, child_id=1).validate()
    with pytest.raises(ConfigError, match="child_id 32 outside"):
        JobSpec(3, 2, parent=("10.0.9.9", 1), child_id=32).validate()
    with pytest.raises(ConfigError, match="also one of its workers"):
        JobSpec(3, 1, workers=(WorkerAddr(0, "10.0.9.9", 1),), parent=("10.0.9.9", 1)).validate()


# -- words through the tree: every op, up to 1024 ranks -----------------------------------------------
def _round(net: TreeNetwork, data: list[list[torch.Tensor]], ops: list[CombineOp]) -> list[torch.Tensor]:
    return net.combine([[Stream(f"s{i}", op, d[i]) for i, op in enumerate(ops)] for d in data])


@pytest.mark.parametrize("world,per_switch,levels", [(1024, 32, 2), (64, 8, 2), (27, 3, 3), (5, 32, 1)])
def test_every_op_equals_one_switch(world: int, per_switch: int, levels: int) -> None:
    g = torch.Generator().manual_seed(world)
    ops = [CombineOp.ADD, CombineOp.OR, CombineOp.MAX]
    data = [[torch.randint(-2**31, 2**31, (n,), generator=g, dtype=torch.int64).to(torch.int32) for n in (70, 33, 5)]
            for _ in range(world)]
    plan = plan_tree(world, per_switch=per_switch, max_levels=3)
    assert plan.levels == levels
    net = TreeNetwork(plan, words_per_packet=16, n_slots=4)
    got = _round(net, data, ops)
    for i, op in enumerate(ops):
        assert torch.equal(got[i], combine_words(op, [d[i] for d in data])), op.name
    uses = sum(-(-n // 16) for n in (70, 33, 5))
    for s, c in zip(plan.switches, net.counters()):
        assert c["accepted"] == uses * s.members  # every member combined once per use, at every level
        assert c["completed"] == uses
        assert c["up"] == (0 if s.parent is None else uses)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32,
                                   torch.int64])
def test_codec_through_a_tree_is_bit_identical(scheme: str, dtype: torch.dtype) -> None:
    xs = [t.to(dtype) if dtype.is_floating_point else (t * 1000).round().to(dtype)
          for t in sparse_tensors(40, 3000, 0.05, seed=7)]
    ref = local_allreduce(xs, scheme)
    res, net = run_tree_local(xs, scheme)
    assert net.plan.levels == 2 and len(net.plan.leaves) == 2
    for r in res:
        assert torch.equal(r, ref[0])
    if not dtype.is_floating_point:
        assert torch.equal(res[0], torch.stack(xs).sum(0))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_1024_ranks_in_two_levels_exact(scheme: str) -> None:
    xs = sparse_tensors(1024, 2048, 0.02, seed=3)
    ref = local_allreduce(xs, scheme)
    res, net = run_tree_local(xs, scheme)
    assert [len(net.plan.leaves), net.plan.levels] == [32, 2]
    assert all(torch.equal(r, ref[0]) for r in res)
    exact = torch.stack([x.double() for x in xs]).sum(0)
    bound = 1024 * 2.0**-21 * max(x.abs().max().item() for x in xs)  # W * 2**-(P+1), P = 31 - 10
    assert (res[0].double() - exact).abs().max().item() <= bound


def test_three_level_tree_codec() -> None:
    xs = sparse_tensors(27, 4000, 0.1, seed=5)
    ref = local_allreduce(xs, "auto")
    res, net = run_tree_local(xs, "auto", per_switch=3, max_levels=3)
    assert net.plan.levels == 3
    assert all(torch.equal(r, ref[0]) for r in res)


# -- loss on every hop -----------------------------------------------------------------------------
@pytest.mark.parametrize("hop", HOPS)
@pytest.mark.parametrize("rate", [0.01, 0.10])
def test_loss_on_each_hop_stays_exact(hop: str, rate: float) -> None:
    xs = sparse_tensors(12, 6000, 0.2, seed=11)
    ref = local_allreduce(xs, "auto")
    res, net = run_tree_local(xs, "auto", per_switch=4, max_levels=3,
                              network={"faults": HopFaults(drop=rate, duplicate=rate / 2, late=rate / 2, seed=2,
                                                           hops=(hop,))})
    assert all(torch.equal(r, ref[0]) for r in res)
    for c in net.counters():
        assert c["rx"] == c["dropped"] + c["accepted"] + c["retransmit_answered"] + c["retransmit_up"] + c["result_down"]


# -- forced sequences: each row of the state table --------------------------------------------------
def _forced(script_hop: str, action: str, nth: int = 0) -> tuple[TreeNetwork, list[torch.Tensor], list[list[torch.Tensor]]]:
    plan = plan_tree(4, per_switch=2)  # root + 2 leaves of 2 workers
    fired = []

    def script(hop: str, n: int, header: tuple[int, ...]) -> str | None:
        if hop == script_hop and n == nth:
            fired.append(header)
            return action
        return None

    net = TreeNetwork(plan, words_per_packet=8, n_slots=2, script=script)
    g = torch.Generator().manual_seed(1)
    data = [[torch.randint(-1000, 1000, (8,), generator=g, dtype=torch.int32)] for _ in range(4)]
    got = _round(net, data, [CombineOp.ADD])
    assert fired, f"the script never saw datagram {nth} on {script_hop}"
    assert torch.equal(got[0], combine_words(CombineOp.ADD, [d[0] for d in data]))
    return net, got, data


def test_lost_up_packet_is_sent_again_on_a_retransmission() -> None:
    net, _, _ = _forced("child_parent", "drop")
    root, leaf1, leaf2 = net.counters()
    assert leaf1["retransmit_up"] + leaf2["retransmit_up"] >= 1
    assert root["accepted"] == 2 and root["completed"] == 1  # each child combined once
    assert leaf1["result_down"] == 1 and leaf2["result_down"] == 1


@pytest.mark.parametrize("action", ["dup", "late"])
def test_duplicate_or_late_up_copy_is_never_counted_twice(action: str) -> None:
    net, _, _ = _forced("child_parent", action)
    root = net.counters()[0]
    assert root["accepted"] == 2 and root["completed"] == 1
    if action == "dup":
        assert root["drop_duplicate"] + root["drop_stale"] == 1


def test_lost_result_down_is_answered_by_the_parent() -> None:
    net, _, _ = _forced("parent_child", "drop")
    root, leaf1, leaf2 = net.counters()
    ups = leaf1["retransmit_up"] + leaf2["retransmit_up"]
    assert ups == 2  # each worker of the leaf that lost it retransmits; the leaf asks upward each time
    assert root["retransmit_answered"] == ups  # every flagged up copy is answered by unicast
    assert leaf1["result_down"] == 1 and leaf2["result_down"] == 1
    assert leaf1["drop_stale_result"] + leaf2["drop_stale_result"] == ups - 1  # the second answer
    assert root["accepted"] == 2


def test_duplicate_result_down_is_dropped() -> None:
    net, _, _ = _forced("parent_child", "dup")
    _root, leaf1, leaf2 = net.counters()
    assert leaf1["drop_stale_result"] + leaf2["drop_stale_result"] == 1
    assert leaf1["result_down"] == 1 and leaf2["result_down"] == 1


def test_lost_result_to_a_worker_is_answered_by_its_leaf() -> None:
    net, _, _ = _forced("leaf_worker", "drop")
    root, leaf1, leaf2 = net.counters()
    assert leaf1["retransmit_answered"] + leaf2["retransmit_answered"] == 1
    assert leaf1["retransmit_up"] + leaf2["retransmit_up"] == 0  # its result was down: no trip upward
    assert root["rx"] == 2


def test_lost_contribution_is_added_on_retransmission() -> None:
    net, _, _ = _forced("worker_leaf", "drop")
    root, leaf1, leaf2 = net.counters()
    assert leaf1["accepted"] + leaf2["accepted"] == 4 and root["accepted"] == 2
