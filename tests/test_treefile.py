"""Tree job files (:mod:`homagg._treefile`): the format, every refusal, and the process group's use.

Oracles: the file's own content (switches, ranks, placement) and :func:`homagg.tree.plan_tree`
(the embedded tree's layout built from a plan places every rank where the plan does).  A running
tree of external switches: tests/test_torch_tree.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import homagg
from homagg._treefile import TreeJob, is_tree_file, load_tree_file, parse_ranks, tree_from_dict
from homagg.tree import plan_tree

TOML = """
world_size = 40
token = "0x5eed1e55"
n_slots = 16

[[switches]]
name = "spine"
data = "10.0.0.1:18497"

[[switches]]
name = "leaf0"
data = "10.0.1.1:18497"
control = "10.0.1.1:19000"
parent = "spine"
child_id = 0
ranks = "0-19"

[[switches]]
name = "leaf1"
data = "10.0.2.1:18497"
parent = "spine"
child_id = 1
ranks = "20-39"
"""

BASE: dict[str, Any] = {
    "world_size": 4,
    "switches": [{"name": "root", "data": "10.0.0.1:1000"},
                 {"name": "a", "data": "10.0.0.2:1000", "parent": "root", "child_id": 0, "ranks": [0, 1]},
                 {"name": "b", "data": "10.0.0.3:1000", "parent": "root", "child_id": 1, "ranks": [2, 3]}],
}


def test_toml_file_describes_the_tree(tmp_path: Path) -> None:
    path = tmp_path / "tree.toml"
    path.write_text(TOML)
    tree = load_tree_file(path)
    assert tree.world_size == 40 and tree.token == 0x5EED1E55 and tree.n_slots == 16 and tree.words_per_packet == 32
    assert [s.name for s in tree.switches] == ["spine", "leaf0", "leaf1"]
    assert tree.switches[0].control == ("10.0.0.1", 18498)  # data port + 1 by default
    assert tree.switches[1].control == ("10.0.1.1", 19000)
    assert tree.place(0) == (1, 0) and tree.place(19) == (1, 19) and tree.place(20) == (2, 0)
    root = tree.spec(0, job_id=7, token=1, slot_base=32)
    assert root.parent is None and root.world_size == 2
    assert [(w.worker_id, w.addr) for w in root.workers] == [(0, ("10.0.1.1", 18497)), (1, ("10.0.2.1", 18497))]
    leaf = tree.spec(2, job_id=7, token=1, slot_base=32)
    assert leaf.parent == ("10.0.0.1", 18497) and leaf.child_id == 1 and leaf.world_size == 20
    assert (leaf.job_id, leaf.token, leaf.slot_base, leaf.n_slots) == (7, 1, 32, 16)


def test_json_file_and_the_switch_option(tmp_path: Path) -> None:
    from homagg.torch._config import BackendConfig

    path = tmp_path / "tree.json"
    path.write_text(json.dumps(BASE))
    assert is_tree_file(str(path)) and not is_tree_file("10.0.0.1:18497")
    config = BackendConfig.resolve(None, env={"HOMAGG_SWITCH": str(path)})
    assert config.tree_file == str(path) and config.external_address is None
    config.check_world(4)
    with pytest.raises(homagg.ConfigError, match=r"world_size 5 differs from the 4 ranks of the tree job file"):
        config.check_world(5)


def test_the_embedded_layout_places_ranks_as_the_plan_does() -> None:
    for world in (33, 64, 100, 1024):
        plan = plan_tree(world)
        addrs = [(("127.0.0.1", 2 * i + 1000), ("127.0.0.1", 2 * i + 1001)) for i in range(len(plan.switches))]
        tree = TreeJob.from_plan(plan, addrs, n_slots=16, words_per_packet=16000)
        for rank in range(world):
            assert tree.place(rank) == plan.place(rank), (world, rank)


def test_ranks_as_ranges_or_lists() -> None:
    assert parse_ranks("0-3,7", source="s") == (0, 1, 2, 3, 7)
    assert parse_ranks([5, 1], source="s") == (1, 5)
    for bad in ("3-1", "a-b", "1,1", [1, True], 3):
        with pytest.raises(homagg.ConfigError):
            parse_ranks(bad, source="s")


def _broken(edit: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    edit(doc)
    return doc


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["switches"][2].update(ranks=[1, 2, 3]), r"rank 1 is served by 'a' and 'b'"),
    (lambda d: d["switches"][2].update(ranks=[2]), r"missing \[3\]"),
    (lambda d: d.update(world_size=3), r"outside \[3\]"),
    (lambda d: d["switches"][2].update(child_id=0), r"child ids \[0, 0\]"),
    (lambda d: d["switches"][2].update(child_id=2), r"child ids \[0, 2\]"),
    (lambda d: d["switches"][1].pop("child_id"), r"child_id .* is required"),
    (lambda d: d["switches"][2].update(parent="nowhere"), r"parent 'nowhere' is not a switch listed before it"),
    (lambda d: d["switches"].reverse(), r"parent 'root' is not a switch listed before it"),
    (lambda d: d["switches"][0].update(ranks=[0]), r"serves ranks and has children"),
    (lambda d: d["switches"][2].update(data="10.0.0.2:1000"), r"data addresses must be unique"),
    (lambda d: d["switches"][2].update(name="a"), r"names must be unique"),
    (lambda d: d.update(extra=1), r"unknown keys \['extra'\]"),
    (lambda d: d["switches"][1].update(port=3), r"unknown keys \['port'\]"),
    (lambda d: d["switches"][1].pop("data"), r"'data' \(HOST:PORT\) is required"),
    (lambda d: d.update(token="0x100000000"), r"token .* outside"),
    (lambda d: d.update(world_size=1025), r"world_size 1025 outside 1..1024"),
    (lambda d: d.update(world_size=40, switches=[{"name": "r", "data": "h:1", "ranks": "0-39"}]),
     r"has 40 members; a switch combines 1..32"),
])
def test_a_bad_tree_file_is_a_config_error_naming_what_is_wrong(edit: Any, message: str) -> None:
    with pytest.raises(homagg.ConfigError, match=message):
        tree_from_dict(_broken(edit))


def test_a_missing_or_bad_file_is_refused_when_the_group_is_configured(tmp_path: Path) -> None:
    from homagg.torch._config import BackendConfig

    with pytest.raises(homagg.ConfigError, match=r"cannot read jobs from .*nowhere.toml"):
        BackendConfig.resolve({"switch": str(tmp_path / "nowhere.toml")})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_broken(lambda d: d["switches"][2].update(ranks=[2]))))
    with pytest.raises(homagg.ConfigError, match=r"bad.json: the leaves must serve ranks 0..3 exactly"):
        BackendConfig.resolve(None, env={"HOMAGG_SWITCH": str(bad)})


def test_the_fallback_probe_of_a_tree_file_asks_every_switch(tmp_path: Path) -> None:
    """On the host path rank 0 returns to a tree of external switches only when every switch's
    control port takes a connection (one leaf down: stay)."""
    import socket

    from homagg.torch._config import BackendConfig
    from homagg.torch._link import SwitchLink
    from homagg.torch._switch_setup import probe_switch

    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    try:
        doc = copy.deepcopy(BASE)
        for sw, ls in zip(doc["switches"], listeners, strict=True):
            sw["control"] = f"127.0.0.1:{ls.getsockname()[1]}"
        path = tmp_path / "tree.json"
        path.write_text(json.dumps(doc))
        config = BackendConfig.resolve({"switch": str(path)})
        link = SwitchLink(port=None, kind="external", control=("127.0.0.1", listeners[1].getsockname()[1]))  # type: ignore[arg-type]
        assert probe_switch(config, link)
        listeners.pop().close()  # leaf b's control port now refuses
        assert not probe_switch(config, link)
    finally:
        for ls in listeners:
            ls.close()
