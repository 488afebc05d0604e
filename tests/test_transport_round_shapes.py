"""``UdpSwitchPort.combine``'s rounds through the cached set-up of their shape (``RoundPlan.run``):
with the native datapath a clean round starts and completes inside C (``homagg_fp_round``), as the
small-call path's does, and binds the caller's arrays afresh every round; whatever the plan of a
shape kept from its last round (the C loop's window, addresses) never leaks into the next.

Oracles: :func:`~homagg.transport.combine_words` for results; the Python reference loop
(``native=False``) running the same rounds for the stats, the window and the sequence numbers;
stream 0's verifier (a :class:`~homagg.transport.CheckOnce`: once per round, the combined words).
Real parts: the emulator, ports on threads.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import switch_emulator
from homagg.testing import on_threads
from homagg.transport import CheckOnce, CombineOp, ControlClient, Stream, UdpSwitchPort, combine_words
from homagg.transport._fastpath import AVAILABLE
from tests.test_transport_small_fast import KEYS, general_calls  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="the native datapath was not built")

#: two round shapes (name, op, words); B's last stream is larger than a small plan (SMALL_WORDS)
SHAPES = {"A": [("descriptor", CombineOp.MAX, 18), ("values", CombineOp.ADD, 1000)],
          "B": [("descriptor", CombineOp.MAX, 18), ("exponents", CombineOp.OR, 64), ("values", CombineOp.ADD, 20000)]}


def _ports(sw, world: int, native: bool) -> list[UdpSwitchPort]:
    job = ControlClient(sw.control_addr).admit(world, n_slots=64, words_per_packet=64)
    return [UdpSwitchPort(sw.data_addr, job=job, rank=r, control=sw.control_addr, native=native, timeout=20.0,
                          window=64)  # at its limit: a clean round changes no window
            for r in range(world)]


def _data(rng: np.random.Generator, shape: str, world: int) -> list[list[torch.Tensor]]:
    return [[torch.from_numpy(rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32))
             for _, _, n in SHAPES[shape]] for _ in range(world)]


def _round(ports: list[UdpSwitchPort], shape: str, data: list[list[torch.Tensor]]) -> None:
    """One round of ``shape`` on every port (threads); results and the verifier's words checked."""
    world, spec = len(ports), SHAPES[shape]
    seen: list[list[np.ndarray]] = [[] for _ in range(world)]

    def rank(r: int) -> list[torch.Tensor]:
        verify = CheckOnce(lambda w: seen[r].append(np.asarray(w).copy()))
        streams = [Stream(name, op, data[r][j], verify=verify if j == 0 else None)
                   for j, (name, op, _) in enumerate(spec)]
        return ports[r].combine(streams)

    got = on_threads(rank, world)
    for j, (name, op, _) in enumerate(spec):
        want = combine_words(op, [d[j] for d in data])
        assert all(torch.equal(g[j], want) for g in got), f"shape {shape}: stream {name}"
    assert all(len(s) == 1 and np.array_equal(s[0], got[0][0].numpy()) for s in seen), "stream 0 verified once"


def test_alternating_shapes_exact_and_as_the_reference_loop(general_calls: list[int]) -> None:
    """Shapes A and B alternate (each keeps its plan); every round's caller arrays are fresh, so a
    plan still bound to its last round's arrays would lose the results.  Then the port's window is
    cut between two rounds of A (as another shape's losses would): the next round of A must start
    from that window, not from the one its C loop ended the last round of A with."""
    world, rng = 2, np.random.default_rng(5)
    order = ["A", "B", "A", "A", "B", "B", "A", "B"] * 2
    rounds = [(shape, _data(rng, shape, world)) for shape in order]
    cut = [(shape, _data(rng, shape, world)) for shape in ("A", "B", "A")]
    with switch_emulator.start() as sw:
        ref, fast = _ports(sw, world, False), _ports(sw, world, True)
        try:
            for ports in (ref, fast):
                general_calls[0] = 0
                for i, (shape, data) in enumerate(rounds):
                    if i == 2 and ports is fast:  # the first rounds meet the other workers' group probes: not clean
                        general_calls[0] = 0
                    _round(ports, shape, data)
                if ports is fast:
                    assert general_calls[0] == 0, "a clean round of combine went through the general loop"
                assert ports[0].window.cwnd == ports[0].window.limit
                for p in ports:  # the window cut of a loss elsewhere: slow start from 16 to 32, then +1/cwnd
                    p.window.cwnd, p.window.ssthresh = 16.0, 32.0
                for shape, data in cut:
                    _round(ports, shape, data)
            for a, b in zip(ref, fast):
                assert a._seq == b._seq
                assert {k: a.stats.get(k) for k in KEYS} == {k: b.stats.get(k) for k in KEYS}
                assert (a.window.cwnd, a.window.ssthresh) == (b.window.cwnd, b.window.ssthresh)
                assert 16.0 < b.window.cwnd < b.window.limit  # grew from the cut, in congestion avoidance
        finally:
            for p in ref + fast:
                p.close()
