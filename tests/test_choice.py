"""auto's choice (homagg.codec._schemes.choose) is remembered per cost-model fields: every field
is part of what it is remembered by, so configurations that differ in one field, asked in turn,
get each its own answer (the uncached cost model's)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from homagg import CodecConfig
from homagg.codec import _schemes

#: (field, its two values, numel, union fraction, other fields): the cost model's answer differs
#: between the two values (checked below, so each row tests something)
FLIPS = [
    ("bandwidth_gbps", (0.01, 10.0), 1 << 16, 0.001, {}),
    ("rtt_us", (0.0, 100.0), 1 << 16, 0.001, {}),
    ("sketch_cells", (None, 3_000_000), 1 << 16, 0.001, {}),
    ("sketch_overhead", (1.4, 1000.0), 1 << 16, 0.001, {"peel_ns": 0.0}),
    ("dense_ns", (0.0, 2.0), 1 << 16, 0.1, {}),
    ("compact_ns", (20.0, 10_000.0), 1 << 16, 0.01, {}),
    ("peel_ns", (300.0, 100_000.0), 1 << 16, 0.001, {}),
    ("bitmap_levels", (1, 2), 1 << 16, 0.01, {}),
]


def uncached(numel: int, union: float, limbs: int, cfg: CodecConfig) -> str:
    return _schemes._choice.__wrapped__(numel, union, limbs, cfg.bandwidth_gbps, cfg.rtt_us, cfg.sketch_cells,
                                        cfg.sketch_overhead, cfg.dense_ns, cfg.compact_ns, cfg.peel_ns,
                                        cfg.bitmap_levels)


def test_every_cost_model_field_is_part_of_the_key() -> None:
    key = list(inspect.signature(_schemes._choice).parameters)[3:]  # after numel, union, limbs
    assert {f for f, *_ in FLIPS} == set(key)
    assert set(key) <= {f.name for f in dataclasses.fields(CodecConfig)}


@pytest.mark.parametrize(("field", "values", "numel", "fraction", "others"), FLIPS)
def test_configurations_differing_in_one_field_get_their_own_choice(field: str, values: tuple, numel: int,
                                                                   fraction: float, others: dict) -> None:
    cfgs = [dataclasses.replace(CodecConfig(**others), **{field: v}) for v in values]
    union = numel * fraction
    want = [uncached(numel, union, 1, cfg) for cfg in cfgs]
    assert want[0] != want[1], f"{field}: both values give {want[0]}; the row tests nothing"
    _schemes._choice.cache_clear()
    for _ in range(2):  # asked in turn, each remembered answer is its own
        assert [_schemes.choose(numel, union, 1, cfg) for cfg in cfgs] == want
        assert [_schemes.choose(numel, union, 1, cfg) for cfg in reversed(cfgs)] == want[::-1]
