"""Compression turned on with one process-group option: DDP's buckets are compressed (fewer bytes,
ranks stay identical, training still learns), every other all_reduce stays exact."""

from __future__ import annotations

import pytest

from tests._dist_scripts._launch import launch


def _run(spec: str, scheme: str) -> list[dict]:
    results, outputs = launch("compress_pg.py", 2, args=[spec, scheme], timeout=240)
    return results


@pytest.mark.parametrize("spec", ["topk:0.05", "onebit"])
def test_pg_option_compresses_ddp_buckets_only(spec: str) -> None:
    # compact: a 17k-parameter model is small enough that auto would pick dense (two round trips
    # cost more than the bytes saved), which is right, but hides what top-k saves
    exact, squeezed = _run("none", "dense"), _run(spec, "compact")
    for res in exact + squeezed:
        assert res["plain_ok"], res  # a plain all_reduce under compression is still the exact sum
    assert exact[0]["compressor"] == "None" and squeezed[0]["compressor"] != "None"
    assert len({r["digest"] for r in squeezed}) == 1  # every rank applied the same update
    assert squeezed[0]["bytes"] < exact[0]["bytes"] / 4, (squeezed[0]["bytes"], exact[0]["bytes"])
    losses = squeezed[0]["losses"]
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])  # still learns (error feedback)
