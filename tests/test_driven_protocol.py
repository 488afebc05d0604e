"""``homagg.allreduce`` drives the protocol on the port itself (:func:`homagg.codec._schemes.drive`: the
descriptor's loop given ``port.combine`` as its combining step, no generator between a round and the
port); the protocol's generator (:func:`homagg.codec._schemes.protocol`, the same loop yielding each
round: what the pipeline and the benchmarks drive) must stay the same call.

Oracle: the same inputs through both, each with its own in-process switch and histories, over a
first call, steady calls, a jump of the exponents (a redo round) and two jumps in a row (the
exponents agreed first): every round's streams (names, ops, words), every result (bit for bit),
the statistics and the history records are equal; the results are within the float64 bound.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import homagg
from homagg.codec import CodecConfig
from homagg.codec._schemes import protocol
from homagg.testing import check_within_bound, on_threads

World = list[tuple[torch.Tensor, homagg.WorkerStats, dict[str, object]]]


def _by_generator(x: torch.Tensor, port: object, scheme: str, stats: homagg.WorkerStats,
                  history: homagg.History, cfg: CodecConfig) -> torch.Tensor:
    stats.calls += 1  # as allreduce counts it
    gen = protocol(x, port.world_size, scheme, cfg, stats, True, history, "k")  # type: ignore[attr-defined]
    try:
        streams = next(gen)
        while True:
            streams = gen.send(port.combine(streams))  # type: ignore[attr-defined]
    except StopIteration as done:
        flat: torch.Tensor = done.value
    if flat.data_ptr() != x.data_ptr():
        x.copy_(flat.reshape(x.shape))
    return x


def _by_allreduce(x: torch.Tensor, port: object, scheme: str, stats: homagg.WorkerStats,
                  history: homagg.History, cfg: CodecConfig) -> torch.Tensor:
    return homagg.allreduce(x, port, scheme=scheme, stats=stats, history=history, key="k",  # type: ignore[arg-type]
                            config=cfg, inplace=True)


class _Recording(homagg.transport.SwitchPort):
    """A port that records every round's streams (name, op, words) before combining them (a
    :class:`~homagg.transport.SwitchPort`: no own arrays, so every round, the mid-size path's
    too, goes through :meth:`combine`)."""

    def __init__(self, port: homagg.transport.SwitchPort) -> None:
        self.port, self.rank, self.world_size, self.rounds = port, port.rank, port.world_size, []

    def combine(self, streams: list[homagg.transport.Stream]) -> list[torch.Tensor]:
        self.rounds.append([(s.name, s.op, s.materialize().clone()) for s in streams])
        return self.port.combine(streams)


def _calls(call: Callable[..., torch.Tensor], inputs: list[list[torch.Tensor]], scheme: str,
           cfg: CodecConfig) -> list[World]:
    world = len(inputs[0])
    switch = homagg.InProcessSwitch(world, timeout=60)
    ports = [_Recording(switch.port(r)) for r in range(world)]
    histories = [homagg.History() for _ in range(world)]
    out: list[World] = []
    for xs in inputs:

        def work(r: int, xs: list[torch.Tensor] = xs) -> tuple[torch.Tensor, homagg.WorkerStats, dict[str, object]]:
            stats = homagg.WorkerStats()
            ports[r].rounds = []
            try:
                result = call(xs[r].clone(), ports[r], scheme, stats, histories[r], cfg)
            except BaseException as exc:  # noqa: BLE001 - the others must not wait for this one
                switch.fail(exc)
                raise
            entry = histories[r].get(("k", xs[r].numel(), xs[r].dtype, world, cfg.block_size))
            return result, stats, {"rounds": ports[r].rounds, "history": entry}

        out.append(on_threads(work, world, timeout=120))
    return out


def _inputs(dtype: torch.dtype, world: int, n: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    base = [torch.randn(n, generator=g, dtype=torch.float64) * (torch.rand(n, generator=g) < 0.3) for _ in range(world)]
    drift = [[b * (1 + 0.01 * i) for b in base] for i in range(3)]  # first call, steady calls
    jumps = [[b * 2.0 ** (20 * (i + 1)) for b in base] for i in range(2)]  # a redo, then agreed first
    calls = drift + jumps + [[b * 2.0 ** 40 for b in base]]
    if dtype.is_floating_point:
        return [[x.to(dtype) for x in xs] for xs in calls]
    return [[(x * 1000).round().to(dtype) for x in xs] for xs in calls[:3]]


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, type(a)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


@pytest.mark.parametrize("scheme", ["dense", "sketch", "compact", "auto"])
@pytest.mark.parametrize(("dtype", "precision"), [(torch.float32, "auto"), (torch.float64, "wide"), (torch.int32, "auto")])
def test_allreduce_drives_the_same_call_as_the_protocol_generator(scheme: str, dtype: torch.dtype,
                                                                  precision: str) -> None:
    world, n = 3, 4096 + 17
    cfg = CodecConfig(block_size=64, precision=precision)
    inputs = _inputs(dtype, world, n)
    driven = _calls(_by_allreduce, inputs, scheme, cfg)
    generated = _calls(_by_generator, inputs, scheme, cfg)
    redone = 0
    for xs, mine, theirs in zip(inputs, driven, generated, strict=True):
        for (out, stats, seen), (ref, ref_stats, ref_seen) in zip(mine, theirs, strict=True):
            assert _same(out, ref)
            assert stats == ref_stats
            assert _same(seen["rounds"], ref_seen["rounds"]) and len(seen["rounds"]) >= 1
            assert _same(seen["history"], ref_seen["history"]) and seen["history"] is not None
            redone += stats.redos
        if dtype.is_floating_point:
            check_within_bound(mine[0][0], xs, cfg.block_size)
        else:
            assert torch.equal(mine[0][0], torch.stack(xs).sum(0))
    if dtype.is_floating_point and scheme in ("dense", "sketch"):
        assert redone > 0  # the jump's redo round is among the calls compared
