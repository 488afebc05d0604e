"""A tree of three BMv2 switches (2 leaves x 2 ranks under a spine) on veth pairs: every scheme
through ``p4/tree.p4`` in both roles, live, bit-identical to the emulator's tree and to one switch.

Markers ``bmv2`` (the tools) and root (veth pairs, packet sockets: skipped otherwise).  The ranks'
codec runs on threads (:func:`homagg.testing.run_local`); its rounds are combined by
:class:`tests._bmv2_tree.Bmv2Tree` (the ranks' frames into the leaves, results back from them; the
leaves send each completed use up to the spine, the spine's results come down).  Oracles:
:func:`homagg.testing.local_tree_allreduce` (the emulator's pipelines in the same tree),
:func:`homagg.testing.local_allreduce` (one switch) and, for integers, the exact sum; the switches'
counters: every use went up once from each leaf and came down once to it.  Then the same tree
with 5% loss and 2% duplicates on every hop (the links between the switches run through the test
process, :class:`~homagg.testing.HopFaults`): still bit-identical, the leaves having sent uses up
again (``retransmit_up``) live.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from homagg.testing import HopFaults, local_allreduce, local_tree_allreduce, run_local, sparse_tensors
from homagg.transport import InProcessSwitch
from homagg.tree import plan_tree

SCHEMES = ("auto", "sketch", "compact", "dense")
K, SLOTS = 32, 8


def _tree(folder: Path, **kwargs: object):  # noqa: ANN202
    from homagg.p4._build import build
    from homagg.p4._pcap_switch import missing_tools
    from tests._bmv2_tree import Bmv2Tree

    if missing_tools():
        pytest.skip(f"BMv2 tools missing: {missing_tools()}")
    if os.geteuid() != 0:
        pytest.skip("needs root (veth pairs, packet sockets)")
    net = Bmv2Tree(plan_tree(4, per_switch=2), build(folder / "build", werror=True), folder, words_per_packet=K,
                   n_slots=SLOTS, **kwargs)
    try:
        yield net
    finally:
        net.stop()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    yield from _tree(tmp_path_factory.mktemp("bmv2tree"))


@pytest.fixture(scope="module")
def agents_tree(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    yield from _tree(tmp_path_factory.mktemp("bmv2agents"), via_agents=True, prefix="hta", grpc_base=50620)


@pytest.fixture(scope="module")
def lossy_tree(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    yield from _tree(tmp_path_factory.mktemp("bmv2lossy"), faults=HopFaults(drop=0.05, duplicate=0.02, seed=5),
                     prefix="htl", grpc_base=50640, rto=0.25)


def _through(tree, xs: list[torch.Tensor], scheme: str) -> list[torch.Tensor]:  # noqa: ANN001
    switch = InProcessSwitch(len(xs), timeout=300, combiner=tree.combine)
    return run_local(xs, scheme, timeout=300, switch=switch).results


@pytest.mark.bmv2
@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_bit_identical_to_the_emulator_tree(tree, scheme: str) -> None:  # noqa: ANN001
    xs = sparse_tensors(4, 3000, 0.05, seed=17)
    before = [c.get("up", 0) for c in tree.counters()]
    got = _through(tree, xs, scheme)
    emu = local_tree_allreduce(xs, scheme, per_switch=2, network={"words_per_packet": K, "n_slots": SLOTS})
    one = local_allreduce(xs, scheme)
    for r in range(4):
        assert torch.equal(got[r], emu[r]) and torch.equal(got[r], one[0]), (scheme, r)
    counters = tree.counters()
    spine, leaves = counters[0], counters[1:]
    ups = [c["up"] - b for c, b in zip(counters[1:], before[1:])]
    assert ups[0] == ups[1] > 0  # every use went up once from each leaf
    assert spine["up"] == 0 and all(c["result_down"] == c["up"] for c in leaves)
    for c in counters:
        assert c.get("drop_stale_result", 0) == 0 and c.get("drop_result_flag", 0) == 0
        assert c.get("drop_token", 0) == 0 and c.get("drop_conflict", 0) == 0


@pytest.mark.bmv2
def test_integers_exact(tree) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(3)
    xs = [torch.randint(-2**40, 2**40, (1500,), generator=g, dtype=torch.int64) for _ in range(4)]
    got = _through(tree, xs, "dense")
    for r in got:
        assert torch.equal(r, torch.stack(xs).sum(0))


@pytest.mark.bmv2
@pytest.mark.parametrize("scheme", ["auto", "dense"])
def test_loss_and_duplicates_on_every_hop_stay_bit_identical(lossy_tree, scheme: str) -> None:  # noqa: ANN001
    xs = sparse_tensors(4, 6000, 0.05, seed=23)
    got = _through(lossy_tree, xs, scheme)
    one = local_allreduce(xs, scheme)
    assert all(torch.equal(r, one[0]) for r in got)
    assert all(n > 0 for n in lossy_tree.faulted.values()), lossy_tree.faulted
    counters = lossy_tree.counters()
    assert sum(c["retransmit_up"] for c in counters[1:]) > 0  # a leaf asked its parent again
    assert all(c["result_down"] == c["up"] > 0 for c in counters[1:])  # each use came down once to each leaf


@pytest.mark.bmv2
def test_tree_admitted_through_the_control_agents(agents_tree) -> None:  # noqa: ANN001
    """Each switch's job admitted over the control protocol by its BMv2 agent (the spine with its
    leaves as workers given at admission, each leaf as a child with its ranks), as the process
    group's rank 0 admits a tree: the same results."""
    xs = sparse_tensors(4, 3000, 0.05, seed=29)
    got = _through(agents_tree, xs, "auto")
    one = local_allreduce(xs, "auto")
    assert all(torch.equal(r, one[0]) for r in got)
    assert [c["up"] > 0 for c in agents_tree.counters()] == [False, True, True]
