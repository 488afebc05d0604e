"""Pipelined segments: bit-identical to the whole-tensor call, checked before sending, errors propagate.

Oracle: the same inputs with ``segment=0`` (one segment) through the same in-process switch, and
the exact / float64 sums.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
import torch

import homagg
from homagg.testing import check_within_bound, exact_sum, run_local
from homagg.transport import Stream, SwitchPort


def inputs(world: int, n: int, density: float, seed: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.where(torch.rand(n, generator=g) < density, torch.randn(n, generator=g) * 3, 0.0) for _ in range(world)]
    return [(x * 1000).round().to(dtype) if not dtype.is_floating_point else x.to(dtype) for x in xs]


@pytest.mark.parametrize("scheme", homagg.SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_segments_are_bit_identical_to_one_segment(scheme: str, dtype: torch.dtype) -> None:
    xs = inputs(3, 70_001, 0.05, seed=1, dtype=dtype)  # a partial last segment and a partial block
    whole = run_local(xs, scheme, segment=0)
    parts = run_local(xs, scheme, segment=16 * 1024)
    assert parts.stats[0].segments == 5 and whole.stats[0].segments == 0
    for r in parts.results:
        assert torch.equal(r, whole.results[0])
    if dtype.is_floating_point:
        check_within_bound(whole.results[0], xs)
    else:
        assert torch.equal(whole.results[0], exact_sum(xs).to(dtype))


def test_segment_rounds_down_to_whole_blocks() -> None:
    xs = inputs(2, 5000, 0.3, seed=2)
    run = run_local(xs, "dense", segment=1500, block_size=512)  # 1024 elements: two blocks each
    assert run.stats[0].segments == 5
    assert torch.equal(run.results[0], run_local(xs, "dense", segment=0, block_size=512).results[0])


class CountingPort(SwitchPort):
    """A real in-process port that records every round it combined (and can fail the k-th)."""

    def __init__(self, inner: SwitchPort, fail_at: int | None = None) -> None:
        self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size
        self.rounds = 0
        self.fail_at = fail_at

    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        self.rounds += 1
        if self.fail_at is not None and self.rounds == self.fail_at:
            raise homagg.TransportError(f"link to the switch lost at round {self.rounds}")
        return self.inner.combine(streams)


def _run(ports: list[CountingPort], xs: list[torch.Tensor], switch: homagg.InProcessSwitch) -> list[BaseException | None]:
    errors: list[BaseException | None] = [None] * len(ports)

    def work(r: int) -> None:
        try:
            homagg.allreduce(xs[r], ports[r], scheme="dense", segment=8192)
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            errors[r] = exc
            switch.fail(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(ports))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a pipelined allreduce hung"
    return errors


def test_non_finite_in_the_last_segment_sends_nothing() -> None:
    xs = inputs(2, 50_000, 0.5, seed=3)
    xs[1][-1] = float("nan")
    switch = homagg.InProcessSwitch(2, timeout=10)
    ports = [CountingPort(switch.port(r)) for r in range(2)]
    errors = _run(ports, xs, switch)
    assert isinstance(errors[1], homagg.NonFiniteError)
    assert ports[1].rounds == 0  # the bad worker sent no word at all


def test_a_failing_round_propagates_and_nothing_hangs() -> None:
    xs = inputs(2, 50_000, 0.5, seed=4)
    switch = homagg.InProcessSwitch(2, timeout=10)
    ports = [CountingPort(switch.port(0), fail_at=3), CountingPort(switch.port(1))]
    errors = _run(ports, xs, switch)
    assert isinstance(errors[0], homagg.TransportError) and "round 3" in str(errors[0])
    assert errors[1] is not None  # the other worker learns it too (switch failed), no hang


def test_inplace_and_out_of_place_agree() -> None:
    xs = inputs(2, 40_000, 0.1, seed=5)
    want = run_local(xs, "compact", segment=0).results[0]
    switch = homagg.InProcessSwitch(2)
    targets = [x.clone() for x in xs]
    outs: list[torch.Tensor] = [torch.empty(0)] * 2

    def work(r: int) -> None:
        outs[r] = homagg.allreduce(targets[r], switch.port(r), scheme="compact", inplace=True, segment=8192)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    for r in range(2):
        assert outs[r] is targets[r] and torch.equal(targets[r], want)
    assert torch.equal(run_local(xs, "compact", segment=8192).results[0], want)  # not in place: same


def test_non_contiguous_input_is_read_not_written() -> None:
    xs = inputs(2, 30_000, 0.2, seed=6)
    views = [torch.stack([x, torch.full_like(x, 7.0)], dim=1)[:, 0] for x in xs]  # stride-2 views
    before = [v.clone() for v in views]
    got = run_local(views, "dense", segment=8192).results
    assert torch.equal(got[0], run_local(xs, "dense", segment=0).results[0])
    assert all(torch.equal(v, b) for v, b in zip(views, before))  # out of place: inputs untouched
