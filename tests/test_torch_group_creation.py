"""Symmetric creation of a homagg group (issue 13): one typed error when rank 0 dies, and no rank
returns from ``new_group`` before every rank registered with the switch.

Spawned ranks (``tests/_dist_scripts/group_creation.py``) with rank 0, which hosts the embedded
emulator, dying at a chosen point (``os._exit`` in the rank script, around the real functions),
with the rendezvous store hosted by rank 0 (``env://``) or by this test process (as torchrun's
agent hosts it, so it outlives rank 0).  Oracle: every surviving rank raises exactly
:class:`homagg.GroupCreationError` (never a bare TransportError or RuntimeError), within a bound,
naming rank 0 when the store can still tell; with a slow rank, every rank's ``new_group`` returns
only after that rank's registration finished (wall clock, same machine).  A rank that gives up
inside the gloo groups' connect (gloo waits 5x its timeout there) is noticed within the bound too,
and the gloo groups still wait the group timeout in their ops.
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import homagg

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import free_port, launch  # noqa: E402

WORLD = 3
HOMAGG_TIMEOUT = "3"  # one switch round (registration) may take this long


def run(mode: str, event: str, external_store: bool = False, group_timeout_s: float = 20.0) -> list[dict[str, Any]]:
    env = {"GC_MODE": mode, "GC_EVENT": event, "HOMAGG_TIMEOUT": HOMAGG_TIMEOUT, "GC_TIMEOUT": str(group_timeout_s)}
    store = None
    if external_store:
        port = free_port()
        store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60))
        env["GC_STORE_PORT"] = str(port)
    try:
        return launch("group_creation.py", WORLD, env=env, timeout=120)[0]
    finally:
        del store


def assert_one_typed_error(results: list[dict[str, Any]], point: str, bound_s: float) -> list[dict[str, Any]]:
    assert results[0].get("died") == point, results[0]
    survivors = results[1:]
    for res in survivors:
        assert res["outcome"] == "GroupCreationError" and res["is_homagg"], res
        assert f"failed on rank {res['rank']} of {WORLD}" in res["message"], res["message"]
        assert res["seconds"] < bound_s, res
    return survivors


def test_init_rank0_dies_after_publishing_the_switch() -> None:
    """The issue's case: before, survivors got a TransportError from a half-finished registration."""
    assert_one_typed_error(run("init", "after_publish"), "after_publish", bound_s=18.0)


def test_new_group_rank0_dies_after_publishing_with_store_alive() -> None:
    """Survivors may register with the dying emulator; then the ready barrier's bounded wait names rank 0."""
    results = run("new_group", "after_publish", external_store=True, group_timeout_s=6.0)
    for res in assert_one_typed_error(results, "after_publish", bound_s=6.0 + 8.0):
        assert 0 in res["ranks"] and res["rank"] not in res["ranks"], res
        assert "rank(s) 0" in res["message"], res["message"]


def test_new_group_rank0_dies_before_the_switch_with_store_alive() -> None:
    """Nothing tells the survivors that rank 0 died: the bounded wait for its options names it."""
    results = run("new_group", "before_switch", external_store=True, group_timeout_s=6.0)
    for res in assert_one_typed_error(results, "before_switch", bound_s=6.0 + 8.0):
        assert 0 in res["ranks"], res
        assert "group rank 0" in res["message"], res["message"]


def test_new_group_rank0_dies_before_the_switch_with_its_store() -> None:
    assert_one_typed_error(run("new_group", "before_switch"), "before_switch", bound_s=18.0)


def test_new_group_peer_gives_up_inside_the_gloo_connect() -> None:
    """The last rank loses the store right after publishing its gloo address: its peers wait for it in
    gloo's connect, which waits 5x gloo's timeout (before: 5 x the group timeout, 30 s here).  Every
    rank raises within the bound; the rank that gave up names the gloo group."""
    results = run("new_group", "gloo_gives_up", group_timeout_s=6.0)
    for res in results:
        assert res["outcome"] == "GroupCreationError" and res["is_homagg"], res
        assert f"failed on rank {res['rank']} of {WORLD}" in res["message"], res["message"]
        assert res["seconds"] < 6.0 + 8.0, res
    assert "the private gloo group did not connect" in results[-1]["message"], results[-1]["message"]


def test_gloo_groups_wait_the_group_timeout_in_their_ops() -> None:
    """They connect in a watched thread, with the group timeout (gloo keeps the constructor's
    timeout for its pairs' receives): a rank joining a barrier (private gloo group) and a reduce
    (delegate) 2.5 s late is waited for."""
    results = run("new_group", "late_ops", group_timeout_s=12.0)
    for res in results:
        assert res["outcome"] == "ok", res
        assert res["gloo_timeouts"] == [12.0, 12.0], res
    assert results[0]["reduced"] == WORLD, results[0]


def test_a_rank_that_never_comes_is_named_within_the_group_timeout() -> None:
    """In this process, rank 0 of 2 alone: the barrier every rank passes before the gloo groups names rank 1."""
    from homagg.torch._config import BackendConfig
    from homagg.torch._process_group import ProcessGroupHomagg

    t0 = time.monotonic()
    with pytest.raises(homagg.GroupCreationError) as err:
        ProcessGroupHomagg(dist.HashStore(), 0, 2, datetime.timedelta(seconds=1.5), BackendConfig.resolve(None))
    assert err.value.ranks == (1,), err.value
    assert "rank 1 did not arrive within 1.5s" in str(err.value), err.value
    assert time.monotonic() - t0 < 1.5 + 5.0


def test_new_group_returns_only_when_every_rank_registered() -> None:
    results = run("new_group", "slow_register")
    for res in results:
        assert res["outcome"] == "ok", res
    registered = results[-1]["registered_at"]
    for res in results:
        assert res["returned_at"] >= registered, (res, registered)


@pytest.mark.parametrize("rank", [0, 5, 1024])
def test_more_ranks_than_a_tree_takes_is_a_config_error_on_every_rank(rank: int) -> None:
    """1025 ranks (the embedded default: a tree of two levels holds 1024): each rank refuses alone,
    at once, naming the limit, before anything is sent (33..1024 ranks aggregate in a tree:
    tests/test_torch_tree.py)."""
    from homagg.torch._config import BackendConfig
    from homagg.torch._process_group import ProcessGroupHomagg

    t0 = time.monotonic()
    with pytest.raises(homagg.ConfigError, match=r"world_size 1025 exceeds 1024 ranks, the most a tree of 2 levels"):
        ProcessGroupHomagg(dist.HashStore(), rank, 1025, datetime.timedelta(seconds=1.5), BackendConfig.resolve(None))
    assert time.monotonic() - t0 < 1.0


@pytest.mark.parametrize("rank", [0, 32])
def test_more_ranks_than_one_external_switch_takes_is_a_config_error_on_every_rank(rank: int) -> None:
    """33 ranks through one external switch (``host:port``): refused on every rank at once, naming
    the 32-worker limit and the way beyond it (a tree job file)."""
    from homagg.torch._config import BackendConfig
    from homagg.torch._process_group import ProcessGroupHomagg

    t0 = time.monotonic()
    with pytest.raises(homagg.ConfigError, match=r"world_size 33 exceeds one switch's 32 workers.*tree job file"):
        ProcessGroupHomagg(dist.HashStore(), rank, 33, datetime.timedelta(seconds=1.5),
                           BackendConfig.resolve({"switch": "127.0.0.1:9"}))
    assert time.monotonic() - t0 < 1.0
