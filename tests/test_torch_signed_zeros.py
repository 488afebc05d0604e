"""Signed zeros through the ``homagg`` process group (2 rank processes on loopback, in place).

Each rank holds zeros of random signs and a few nonzeros (``tests/_dist_scripts/signed_zeros.py``,
one group per scheme).  Oracle: every rank's result equals every other rank's bit for bit, and
the in-process dense scheme's (out of place) on the same inputs, which is +0.0 wherever the exact
sum is zero (``tests/test_signed_zeros.py`` covers the codec's paths in process).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from homagg.testing import exact_sum, local_allreduce

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import check_values, launch, tensor_from_json  # noqa: E402

GROUPS = ["dense", "sketch", "compact", "auto-sketch", "auto-compact"]
DTYPES = ["float16", "bfloat16", "float32", "float64"]
_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16}
_cache: list[dict[str, Any]] = []


def outcome(group: str) -> list[Any]:
    if not _cache:
        _cache.extend(launch("signed_zeros.py", 2, timeout=240)[0])
    return check_values(_cache, group)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", GROUPS)
def test_every_rank_holds_dense_bits(group: str, dtype: str) -> None:
    ran = outcome(group)
    assert all(v["schemes"] == {group.removeprefix("auto-"): len(DTYPES)} for v in ran), [v["schemes"] for v in ran]
    per_rank = [v[dtype] for v in ran]
    inputs = [tensor_from_json(v["input"]) for v in per_rank]
    want = local_allreduce(inputs, "dense")[0]
    zero = exact_sum(inputs) == 0
    assert zero.any() and not torch.signbit(want[zero]).any()
    assert any(torch.signbit(x[zero]).any() for x in inputs)  # some rank held a -0.0 there
    for rank, v in enumerate(per_rank):
        got = tensor_from_json(v["result"])
        assert torch.equal(got.view(_BITS[got.dtype]), want.view(_BITS[want.dtype])), (
            rank, torch.nonzero(got.view(_BITS[got.dtype]) != want.view(_BITS[want.dtype])).squeeze(1)[:10])
