"""The small-round path's C entry (``RoundPlan.run_small``, ``homagg_fp_round``): a clean round of
``combine_arrays`` completes inside C with no general loop, and any round where something else
happens (loss: retransmissions) is handed over to :meth:`RoundLoop.run_native` mid-round and
completes exactly.

Oracles: :func:`~homagg.transport.combine_words` for results; the Python reference loop
(``native=False``) running the same rounds for the stats and the sequence numbers; the verify
callable's arguments (stream 0's combined words, once per round).  Real parts: the emulator, ports
on threads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import switch_emulator
from homagg.testing import on_threads
from homagg.transport import CombineOp, ControlClient, UdpSwitchPort, combine_words
from homagg.transport import _roundloop
from homagg.transport._fastpath import AVAILABLE

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="the native datapath was not built")
OPS = (CombineOp.MAX, CombineOp.ADD)


def _ports(sw, world: int, native: bool, **options):
    job = ControlClient(sw.control_addr).admit(world, n_slots=16, words_per_packet=64)
    return [UdpSwitchPort(sw.data_addr, job=job, rank=r, control=sw.control_addr, native=native, **options)
            for r in range(world)]


def _rounds(seed: int, world: int, n: int) -> list[list[list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 200))  # 1..4 chunks of the ADD stream
        out.append([[rng.integers(-(2**31), 2**31, 18, dtype=np.int64).astype(np.int32),
                     rng.integers(-(2**20), 2**20, k, dtype=np.int64).astype(np.int32)] for _ in range(world)])
    return out


def _run(ports, rounds) -> list[list[np.ndarray]]:
    """Every round on every port (threads), checked; per rank, the verify calls' words."""
    world = len(ports)
    seen: list[list[np.ndarray]] = [[] for _ in range(world)]
    for data in rounds:
        got = on_threads(lambda r: ports[r].combine_arrays(OPS, data[r], seen[r].append), world)
        for j, op in enumerate(OPS):
            want = combine_words(op, [torch.from_numpy(d[j]) for d in data]).numpy()
            assert all(np.array_equal(g[j], want) for g in got), f"stream {j}"
        want0 = combine_words(CombineOp.MAX, [torch.from_numpy(d[0]) for d in data]).numpy()
        assert all(np.array_equal(s[-1], want0) for s in seen)
    return seen


@pytest.fixture()
def general_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the rounds (or their rests) the general native loop ran."""
    calls = [0]
    original = _roundloop.RoundLoop.run_native

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(_roundloop.RoundLoop, "run_native", counted)
    return calls


KEYS = ("packets", "results", "rounds", "retransmits", "fast_retransmits", "spurious_retransmits", "ignored",
        "group_probes", "window_cuts", "window_undos", "cwnd", "multicast")


@pytest.mark.parametrize("world", [1, 2])
def test_clean_small_rounds_complete_in_c_as_the_reference_loop(world: int, general_calls: list[int]) -> None:
    rounds = _rounds(world, world, 40)
    with switch_emulator.start() as sw:
        ref, fast = _ports(sw, world, False), _ports(sw, world, True)
        try:
            _run(ref, rounds)
            _run(fast, rounds[:1])  # the first round meets the other workers' group probes: counted, not clean
            general_calls[0] = 0
            seen_fast = _run(fast, rounds[1:])
            assert general_calls[0] == 0, "a clean small round went through the general loop"
            assert [len(s) for s in seen_fast] == [len(rounds) - 1] * world  # verify: once per round
            for a, b in zip(ref, fast):
                assert a._seq == b._seq
                assert {k: a.stats.get(k) for k in KEYS} == {k: b.stats.get(k) for k in KEYS}
                assert b.stats["rtt_samples"] >= len(rounds) and b.stats["srtt_us"] > 0
        finally:
            for p in ref + fast:
                p.close()


def test_lossy_small_rounds_hand_over_to_the_general_loop(general_calls: list[int]) -> None:
    faults = switch_emulator.FaultConfig(drop=0.15, duplicate=0.05, reorder=0.05, seed=3)
    world = 2
    rounds = _rounds(9, world, 40)
    with switch_emulator.start(faults=faults) as sw:
        ports = _ports(sw, world, True, rto=0.03, min_rto=0.02, timeout=20.0)
        try:
            seen = _run(ports, rounds)
            assert [len(s) for s in seen] == [len(rounds)] * world
            assert sum(p.stats["retransmits"] for p in ports) > 0
            assert general_calls[0] > 0  # the rounds with a retransmission finished in the general loop
            assert ports[0]._seq == ports[1]._seq == sum(1 + -(-d[0][1].size // 64) for d in rounds)
        finally:
            for p in ports:
                p.close()
