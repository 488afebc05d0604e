"""Mid-size steady calls (:mod:`homagg.codec._mid`) against the general path they shortcut, bit for
bit: the same sequences of in-place float32 calls through UDP ports on the emulator (steady
guesses, blocks that leave the window and are redone, blocks of zeros, exponents that jump), run
once with the mid path and once without it (``small_calls=False``); results, statistics and
history entries equal.  Ranks on different paths in one call meet on the wire (the rounds are the
same bytes), and a steady call holding NaN raises the general path's error before anything is sent.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import switch_emulator
from homagg import NonFiniteError
from homagg.codec import History, WorkerStats, _exponent_native, _mid, _mid_native, _native
from homagg.codec._config import CodecConfig
from homagg.codec._protocol import allreduce
from homagg.testing import on_threads
from homagg.transport import CombineOp, ControlClient, UdpSwitchPort
from homagg.transport._fastpath import AVAILABLE as DATAPATH
from homagg.transport._roundplan import OWN_WORDS
from tests.test_transport_small_rounds import _close, _ports

pytestmark = pytest.mark.skipif(not (_native.AVAILABLE and _exponent_native.AVAILABLE),
                                reason="the codec's native kernels were not built")
LOOPS = [True, False] if DATAPATH else [False]


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each call of the mid path answered (taken: True), the real function running."""
    answers: list[bool] = []
    real = _mid.allreduce

    def recorded(*args, **kwargs) -> bool:
        answers.append(real(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(_mid, "allreduce", recorded)
    return answers


def _inputs(world: int, n: int, scales: list[float], seed: int, same: bool = False) -> list[list[torch.Tensor]]:
    """Per call, per rank: float32 values whose blocks move as ``scales`` says (a per-block factor
    too, so some blocks leave the guess window while others stay), with zero blocks and zeros;
    ``same``: every rank's the same (a jump then leaves the window without a redo: every rank
    guessed its own, equal exponent)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = -(-n // 1024)
    out = []
    for s in scales:
        per_block = torch.ones(blocks, dtype=torch.float64)
        if s < 0:  # some blocks jump, the others stay
            per_block[torch.rand(blocks, generator=gen) < 0.3] = 1e4
            s = 1.0
        call = []
        for _ in range(world):
            t = torch.randn(n, generator=gen, dtype=torch.float64) * s
            t *= per_block.repeat_interleave(1024)[:n]
            t[torch.rand(n, generator=gen) < 0.2] = 0.0
            t[:1024] = 0.0 if blocks > 2 else t[:1024]  # a block of zeros
            call.append(t.to(torch.float32))
        out.append([call[0].clone() for _ in call] if same else call)
    return out


def _sequence(switch, native: list[bool], world: int, n: int, scales: list[float], mid: list[bool],
              precision: str = "auto", scheme: str = "auto", seed: int = 0, same: bool = False):
    """The calls of :func:`_inputs` in place on fresh UDP ports (``native``: each rank's datapath;
    ``mid``: whether each rank's config lets the mid path run); results, stats, histories."""
    job = ControlClient(switch.control_addr).admit(world, n_slots=8, words_per_packet=256)
    ports = [UdpSwitchPort(switch.data_addr, job=job, rank=r, control=switch.control_addr, native=native[r],
                           timeout=10.0) for r in range(world)]  # each rank's own datapath
    cfgs = [CodecConfig(precision=precision, small_calls=m) for m in mid]
    histories = [History() for _ in range(world)]
    stats = [[WorkerStats() for _ in scales] for _ in range(world)]
    inputs = _inputs(world, n, scales, seed, same)

    def rank(r: int) -> list[torch.Tensor]:
        out = []
        for i, call in enumerate(inputs):
            t = call[r].clone()
            allreduce(t, ports[r], scheme=scheme, config=cfgs[r], stats=stats[r][i], inplace=True,
                      history=histories[r])
            out.append(t)
        return out

    try:
        results = on_threads(rank, world)
        sig = _mid._signature(n, scheme, world, 1024, precision, True)
        for r, port in enumerate(ports):  # where the C kernels ran: kept with the port's own arrays
            own = port.own_round(_mid._OPS, sig.lengths) if mid[r] else None
            kept = [type(k) for k in own.kept.values()] if own is not None else []
            assert kept == ([_mid_native.MidKernel] if native[r] and mid[r] and _mid_native.AVAILABLE else []), kept
        return results, stats, histories, inputs
    finally:
        _close(ports)
        ControlClient(switch.control_addr).remove(job.job_id)


def _assert_same(a, b, world: int, calls: int) -> None:
    (ra, sa, ha, _), (rb, sb, hb, _) = a, b
    for r in range(world):
        for i in range(calls):
            assert torch.equal(ra[r][i].view(torch.int32), rb[r][i].view(torch.int32)), (r, i)
            x, y = sa[r][i], sb[r][i]
            assert (x.calls, x.rounds, x.redos, x.redone, dict(x.bytes_per_stream), dict(x.schemes)) == (
                y.calls, y.rounds, y.redos, y.redone, dict(y.bytes_per_stream), dict(y.schemes)), (r, i)
        ea, eb = list(ha[r]._entries.items()), list(hb[r]._entries.items())
        assert [k for k, _ in ea] == [k for k, _ in eb]
        for (_, p), (_, q) in zip(ea, eb, strict=True):
            assert (p.union, p.changed, p.changed_before, p.local_nnz) == (q.union, q.changed, q.changed_before,
                                                                           q.local_nnz)
            assert torch.equal(p.exponents, q.exponents)


#: the exponents' moves: steady, drift in the window, some blocks jumping, everything jumping, zeros,
#: subnormals (a grid factor beyond float32's range, a float64 decode) and huge values
SCALES = [1.0, 1.0, 1.2, -1, 1.0, 1.0, 3e4, 3e4, 1e-3, 1e-3, 0.0, 1.0, 1.0, 1e-39, 1e-39, 1e-39, 1e30, 1e30, 1.0]


@pytest.mark.parametrize("native", LOOPS)
@pytest.mark.parametrize(("world", "n", "precision", "scheme"), [
    (2, 1025, "auto", "auto"), (3, 5000, "auto", "dense"), (2, 65543, "auto", "auto"), (2, 3000, "wide", "auto")])
def test_mid_calls_are_the_general_path(switch, spy: list[bool], native: bool, world: int, n: int, precision: str,
                                        scheme: str) -> None:
    fast = _sequence(switch, [native] * world, world, n, SCALES, [True] * world, precision, scheme, seed=n)
    taken = spy.count(True)
    spy.clear()
    slow = _sequence(switch, [native] * world, world, n, SCALES, [False] * world, precision, scheme, seed=n)
    assert spy == []  # small_calls=False: never asked
    _assert_same(fast, slow, world, len(SCALES))
    # the path ran for the steady calls (every call after the first, less those after two that moved)
    assert taken >= world * (len(SCALES) - 4), taken
    assert sum(s.redos for s in fast[1][0]) > 0  # blocks left the window and were redone
    # the oracle: the exact float64 sum, on the grid's error bound (every rank the same bits)
    results, _, _, inputs = fast
    for i, call in enumerate(inputs):
        exact = torch.stack([t.to(torch.float64) for t in call]).sum(0)
        got = results[0][i].to(torch.float64)
        scale = torch.stack([t.abs().to(torch.float64) for t in call]).amax(0).max().item()
        assert (got - exact).abs().max().item() <= max(scale, 1e-30) * 2.0**-18, i
        for r in range(1, world):
            assert torch.equal(results[r][i], results[0][i])


@pytest.mark.parametrize("native", LOOPS)
def test_equal_inputs_record_the_blocks_that_moved(switch, spy: list[bool], native: bool) -> None:
    """Every rank holding the same values: a jump leaves the guess window without a redo (each
    rank guessed the new exponent itself), and the history records the moved blocks all the same."""
    fast = _sequence(switch, [native] * 2, 2, 5000, SCALES, [True] * 2, seed=3, same=True)
    slow = _sequence(switch, [native] * 2, 2, 5000, SCALES, [False] * 2, seed=3, same=True)
    _assert_same(fast, slow, 2, len(SCALES))
    assert SCALES[6] / SCALES[5] > 1e3 and fast[1][0][6].redos == 0  # the jump stood: decoded in C, changed 1.0


@pytest.mark.parametrize("native", LOOPS)
def test_ranks_on_either_path_meet_on_the_wire(switch, spy: list[bool], native: bool) -> None:
    """Rank 0 takes the mid path, rank 1 the general one, in the same calls: the same rounds."""
    mixed = _sequence(switch, [native, not native if DATAPATH else native], 2, 4100, SCALES, [True, False], seed=7)
    assert spy.count(True) >= len(SCALES) - 4
    spy.clear()
    slow = _sequence(switch, [native] * 2, 2, 4100, SCALES, [False, False], seed=7)
    _assert_same(mixed, slow, 2, len(SCALES))


def test_in_process_ranks_on_either_path_meet(spy: list[bool]) -> None:
    """On the in-process switch (no own arrays: the general path's named streams, which that
    switch compares across ranks) rank 0 on the mid path and rank 1 on the general one: the
    results, stats and histories of both ranks on the general path."""
    from homagg.transport import InProcessSwitch

    def run(mid: list[bool]):
        switch = InProcessSwitch(2, timeout=60)
        cfgs = [CodecConfig(small_calls=m) for m in mid]
        histories = [History() for _ in range(2)]
        stats = [[WorkerStats() for _ in SCALES] for _ in range(2)]
        inputs = _inputs(2, 3000, SCALES, 11)

        def rank(r: int) -> list[torch.Tensor]:
            port, out = switch.port(r), []
            for i, call in enumerate(inputs):
                t = call[r].clone()
                allreduce(t, port, config=cfgs[r], stats=stats[r][i], inplace=True, history=histories[r])
                out.append(t)
            return out

        return on_threads(rank, 2), stats, histories, inputs

    mixed = run([True, False])
    assert spy.count(True) >= len(SCALES) - 4
    _assert_same(mixed, run([False, False]), 2, len(SCALES))


def test_a_steady_call_holding_nan_raises_before_sending(switch, spy: list[bool]) -> None:
    job, ports = _ports(switch, 1, DATAPATH, k=256, slots=8)
    try:
        history, cfg = History(), CodecConfig()
        t = torch.randn(3000)
        for _ in range(3):
            allreduce(t, ports[0], config=cfg, inplace=True, history=history)
        assert spy[-1] is True
        sent = ports[0].stats["rounds"]
        bad = torch.randn(3000)
        bad[2500] = math.nan
        with pytest.raises(NonFiniteError, match="1 non-finite"):
            allreduce(bad, ports[0], config=cfg, inplace=True, history=history)
        assert spy[-1] is False and ports[0].stats["rounds"] == sent
        t2 = torch.randn(3000)
        allreduce(t2.clone(), ports[0], config=cfg, inplace=True, history=history)  # the port goes on
        assert spy[-1] is True
    finally:
        _close(ports)
        ControlClient(switch.control_addr).remove(job.job_id)


@pytest.mark.skipif(not DATAPATH, reason="the native datapath was not built (no own arrays)")
def test_a_large_shape_gets_own_arrays_after_combine_made_its_plan(switch) -> None:
    """A shape above SMALL_WORDS that a ``combine_arrays`` round planned first (no own arrays)
    gets them at its first ``own_round``; both kinds of round stay exact on it."""
    job, ports = _ports(switch, 2, True, k=256, slots=8)
    ops, lengths = (CombineOp.MAX, CombineOp.ADD), (18, 40000)
    rng = np.random.default_rng(5)
    data = [[rng.integers(-1000, 1000, k).astype(np.int32) for k in lengths] for _ in range(2)]
    want = [np.maximum(data[0][0], data[1][0]), data[0][1] + data[1][1]]
    try:
        def rank(r: int) -> list[list[np.ndarray]]:
            port = ports[r]
            first = port.combine_arrays(ops, data[r])
            own = port.own_round(ops, lengths)
            assert own is not None
            for a, w in zip(own.ins, data[r]):
                np.copyto(a, w)
            second = [a.copy() for a in own.run()]
            third = port.combine_arrays(ops, data[r])
            return [first, second, third]

        for got in on_threads(rank, 2):
            for rnd in got:
                assert all(np.array_equal(a, w) for a, w in zip(rnd, want, strict=True))
        assert ports[0].own_round(ops, (18, OWN_WORDS)) is None  # above the limit: none
    finally:
        _close(ports)
        ControlClient(switch.control_addr).remove(job.job_id)
