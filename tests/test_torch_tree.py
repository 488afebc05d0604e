"""The ``homagg`` process group beyond one switch (33..1024 ranks): a tree of switches (docs/trees.md).

Rank scripts: ``tests/_dist_scripts/tree_collectives.py`` (all_reduce of every codec dtype, SUM,
AVG and MAX; optionally a tree switch killed mid-run) and ``tree_ddp.py`` (DDP beside gloo).  The
oracles are computed here: exact integer sums (and gloo's result), README's error bound around the
exact float64 sum for floats, gloo's MAX, gloo's DDP training.  40 ranks on a 2-core machine are
slow: tensors and steps are small and the timeouts generous.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from homagg.testing import check_within_bound, exact_sum
from homagg.tree import plan_tree

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _ddp_model import reference  # noqa: E402
from _launch import check_values, launch, make_input, tensor_from_json  # noqa: E402

REDUCTIONS = ["sum_float32", "avg_float32", "sum_float64", "sum_float16", "sum_bfloat16", "sum_int32", "sum_int64",
              "max_float32"]
_cache: dict[int, list[dict[str, Any]]] = {}


def results(world: int) -> list[dict[str, Any]]:
    if world not in _cache:
        _cache[world] = launch("tree_collectives.py", world, timeout=900)[0]
    return _cache[world]


def assert_reduction(world: int, per_rank: list[dict[str, Any]]) -> None:
    """Every rank's result within the bound of the exact sum (integers: equal to it and to gloo's;
    MAX: gloo's), of the input's dtype and shape, the same on every rank."""
    spec = per_rank[0]["input"]
    inputs = [make_input(r, spec) for r in range(world)]
    got = [tensor_from_json(v["result"]) for v in per_rank]
    for rank, (y, v) in enumerate(zip(got, per_rank, strict=True)):
        assert v["input"] == spec, "ranks used different input specs"
        assert y.dtype == inputs[0].dtype and y.shape == inputs[0].shape, (rank, y.dtype, y.shape)
        assert torch.equal(y, got[0]), f"rank {rank} differs from rank 0"
        if "gloo" in v:
            assert torch.equal(y, tensor_from_json(v["gloo"])), f"rank {rank}: homagg != gloo"
    if spec["seed"] == 8:  # MAX: gloo's is the oracle, and the elementwise max of the inputs
        assert torch.equal(got[0], torch.stack(inputs).amax(0))
    elif not inputs[0].dtype.is_floating_point:
        assert torch.equal(got[0].to(torch.int64), exact_sum(inputs)), "integer sum not exact"
    else:
        check_within_bound(got[0], inputs, divisor=per_rank[0]["divisor"])


@pytest.mark.parametrize("world", [33, 40])
def test_embedded_tree_is_planned_started_and_stopped(world: int) -> None:
    """Rank 0 started the plan's switches (2 leaves + a root), every rank sits at its leaf as the
    plan places it with the whole job's world size, and destroy stopped every emulator."""
    per_rank = results(world)
    plan = plan_tree(world)
    infos = check_values(per_rank, "tree")
    for rank, info in enumerate(infos):
        leaf, worker = plan.place(rank)
        assert info["kind"] == "embedded", info
        assert info["port_world"] == world, info  # the codec's headroom follows the whole job
        assert info["parent"] and info["leaf_world"] == plan.switches[leaf].members, (rank, info)
        assert info["worker_id"] == worker, (rank, info)
        assert info["emulators"] == (len(plan.switches) if rank == 0 else 0), (rank, info)
        assert info["token"] == infos[0]["token"] != 0, "one token for the whole tree"
    assert per_rank[0]["emulators_exited"] == [True] * len(plan.switches)
    for res in per_rank:
        assert res["transitions"] == [] and res["path_warnings"] == [], res["transitions"]


@pytest.mark.parametrize("world", [33, 40])
@pytest.mark.parametrize("check", REDUCTIONS)
def test_embedded_tree_allreduce_against_exact_sum_and_gloo(world: int, check: str) -> None:
    assert_reduction(world, check_values(results(world), check))


@pytest.mark.parametrize("victim", ["leaf", "root"])
def test_a_killed_tree_switch_sends_the_group_to_the_host_path_and_back(victim: str) -> None:
    """Rank 0 SIGKILLs one emulator of the tree after 2 calls: every call stays right (the host
    path), found well before the 60 s progress timeout, then the group returns on a new tree."""
    world = 33
    per_rank, outputs = launch("tree_collectives.py", world, timeout=900,
                               env={"KILL": victim, "KILL_AFTER": "2", "CALLS": "8", "N": "1000",
                                    "HOMAGG_TIMEOUT": "60", "HOMAGG_PROBE_INTERVAL": "0.2"})
    calls = check_values(per_rank, "calls")
    for n in range(len(calls[0])):
        assert_reduction(world, [c[n] for c in calls])
    for rank, res in enumerate(per_rank):
        paths = [c["path"] for c in calls[rank]]
        moves = [(t["from"], t["to"]) for t in res["transitions"]]
        assert moves[:2] == [("switch", "host"), ("host", "switch")], (rank, res["transitions"])
        # rank 0 kills the switch when its call KILL_AFTER (2) starts: every rank had finished call 0
        # by then (its call 1 was complete at the root), but a rank under the killed leaf may still
        # be waiting for call 1's result, which it then gets on the host path
        assert paths[0] == "switch" and paths[-1] == "switch" and "host" in paths, (rank, paths)
        assert res["transitions"][0]["detect_s"] < 20, (rank, res["transitions"][0])
    assert per_rank[0]["emulators_exited"] == [True] * 3  # the new tree, stopped at destroy


def test_ddp_forty_ranks_on_the_embedded_tree_trains_like_gloo() -> None:
    """DDP, world_size 40, the embedded default (a tree of 3 emulators): the same training as DDP
    over gloo, within the codec's rounding, on every rank."""
    per_rank, _ = launch("tree_ddp.py", 40, timeout=900)
    mine = [tensor_from_json(r["homagg"]) for r in per_rank]
    theirs = [tensor_from_json(r["gloo"]) for r in per_rank]
    start = tensor_from_json(per_rank[0]["start"])
    for rank, (m, t) in enumerate(zip(mine, theirs, strict=True)):
        assert torch.equal(m, mine[0]), f"rank {rank}: parameters differ across ranks"
        assert float((m - t).abs().max()) <= 1e-5, f"rank {rank}: max |homagg - gloo| = {float((m - t).abs().max())}"
    assert float((mine[0] - start).abs().max()) > 1e-3, "the model did not train"
    want = reference(40, "basic")  # the one-process replay of the same steps (DDP averages gradients)
    assert float((mine[0] - want).abs().max()) <= 1e-5, float((mine[0] - want).abs().max())
    for res in per_rank:
        assert res["calls"] > 0 and res["paths"].get("host", 0) == 0, res["paths"]
        assert res["kind"] == "embedded" and res["leaf_world"] == 20


def test_tree_job_file_with_external_switches(tmp_path: Path) -> None:
    """A tree job file names external switches (here emulators this test starts: 2 leaves, a
    root): 34 ranks aggregate through them, each switch admits the job with the file's token and
    job id, the file's words per packet, the ``slots`` option's slots (an option wins)."""
    import switch_emulator
    from homagg.transport import ControlClient

    secret = "tree-file-test-secret-0123456789"
    switches = [switch_emulator.spawn(secret=secret, engine="python") for _ in range(3)]
    try:
        doc = {"world_size": 34, "token": "0x5eed1e55", "job_id": 4242, "n_slots": 16, "words_per_packet": 2048,
               "switches": [
                   {"name": "spine", "data": _addr(switches[0].data_addr), "control": _addr(switches[0].control_addr)},
                   {"name": "leaf0", "data": _addr(switches[1].data_addr), "control": _addr(switches[1].control_addr),
                    "parent": "spine", "child_id": 0, "ranks": "0-16"},
                   {"name": "leaf1", "data": _addr(switches[2].data_addr), "control": _addr(switches[2].control_addr),
                    "parent": "spine", "child_id": 1, "ranks": "17-33"}]}
        path = tmp_path / "tree.json"
        path.write_text(json.dumps(doc))
        per_rank, _ = launch("tree_collectives.py", 34, timeout=900,
                             env={"HOMAGG_SWITCH": str(path), "HOMAGG_SWITCH_SECRET": secret, "N": "1000",
                                  "HOMAGG_SLOTS": "8"})
        for check in ("sum_float32", "sum_int64"):
            assert_reduction(34, check_values(per_rank, check))
        for info in check_values(per_rank, "tree"):
            assert info["kind"] == "external" and info["port_world"] == 34 and info["leaf_world"] == 17
            assert info["token"] == 0x5EED1E55 and info["job_id"] == 4242, info
            assert (info["n_slots"], info["words_per_packet"]) == (8, 2048), info  # the slots option wins
        for sw in switches:  # every switch counted the job's datagrams and no foreign token
            with ControlClient(sw.control_addr, secret=secret) as ctl:
                counters = ctl.status()["counters"]
                assert counters.get("drop_token", 0) == 0 and counters.get("rx", 0) > 0, counters
                assert ctl.status()["jobs"] == [] or all(j["job_id"] != 4242 for j in ctl.status()["jobs"])
    finally:
        for sw in switches:
            sw.stop()


def _addr(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"



def test_tree_watch_finds_a_dead_ancestor_and_tells_the_other_ranks() -> None:
    """A port's watch in a tree: its own leaf alive, its root's control port closed: a reason at the
    first scan after the minimum stall, published in the store, where a rank under another (live)
    leaf whose ancestors all answer finds it (before the watch: both waited for the progress timeout)."""
    import socket

    import torch.distributed as dist

    from homagg.torch._tree_link import TreeWatch
    from homagg.transport._liveness import Liveness

    leaf = socket.create_server(("127.0.0.1", 0))
    root = socket.create_server(("127.0.0.1", 0))
    root_addr = root.getsockname()[:2]
    store = dist.HashStore()
    try:
        mine = TreeWatch(Liveness(leaf.getsockname()[:2]), [("switch0", root_addr)], store, "tree/gone")
        other = TreeWatch(Liveness(leaf.getsockname()[:2]), [], store, "tree/gone")
        assert mine.gone(10.0, 1.0, 0) is None and other.gone(10.0, 1.0, 0) is None  # all alive
        assert mine.gone(10.1, 0.1, 0) is None  # not stalled long enough: not even asked
        root.close()
        why = mine.gone(20.0, 1.0, 0)
        assert why is not None and "switch switch0 is gone" in why and "refuses connections" in why, why
        told = other.gone(20.0, 1.0, 0)
        assert told is not None and "another rank found a switch of the tree gone" in told, told
        assert mine.interval_s == 0.25 and mine.control == leaf.getsockname()[:2]  # the inner probe's attributes
    finally:
        leaf.close()
        root.close()
