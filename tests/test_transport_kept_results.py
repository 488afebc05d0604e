"""``UdpSwitchPort.combine``'s result arrays, reused across steady calls of one shape
(:class:`homagg._buffers.KeptResults`, kept per round plan; larger rounds: the port's spare arrays)
and the RTT samples taken in one call (:meth:`RtoEstimator.take`).

The contract kept: the caller owns the returned tensors -- a result (or a view, numpy array or
alias made from it) the caller still holds is never overwritten by a later call; only results
nobody references any more are handed out again.  Oracles: :func:`~homagg.transport.combine_words`
of each round's inputs (checked after every later round), :meth:`RtoEstimator.sample` one at a time.
Real parts: the emulator, ports on threads, both datapaths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import switch_emulator
from homagg._buffers import KeptResults
from homagg.testing import on_threads
from homagg.transport import CombineOp, ControlClient, Stream, UdpSwitchPort, combine_words
from homagg.transport import _roundplan
from homagg.transport._fastpath import AVAILABLE
from homagg.transport._rto import RtoEstimator

SHAPE = [("descriptor", CombineOp.MAX, 18), ("exponents", CombineOp.OR, 64), ("values", CombineOp.ADD, 1000)]
ROUNDS = 9


def _holds(results: list[torch.Tensor], i: int) -> list[tuple[int, object]]:
    """What the caller keeps of round ``i``'s results: ``(stream, the object)``, of every kind
    that keeps an array's words alive without holding the returned tensor itself."""
    if i == 1:
        return list(enumerate(results))  # the tensors
    if i == 2:
        return [(2, results[2][3:])]  # a view
    if i == 3:
        return [(1, results[1].numpy())]  # a numpy array of it
    if i == 5:
        return [(0, results[0].detach()), (2, results[2].view(10, 100))]  # aliases
    return []


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=pytest.mark.skipif(
    not AVAILABLE, reason="the native datapath was not built"))])
@pytest.mark.parametrize("kept", [True, False], ids=["plan-kept", "port-spare"])
def test_results_the_caller_holds_are_never_overwritten(native: bool, kept: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nine rounds of one shape; the caller keeps some results of rounds 1, 2, 3 and 5 (tensors, a
    view, a numpy array, aliases) and drops the rest as the next call returns.  Every kept result
    still holds its round's exact combination after the last round; the dropped ones' arrays were
    handed out again (the reuse is real).  ``port-spare``: the rounds larger than a plan keeps
    arrays for (KEPT_WORDS 0 here) share the port's spare arrays, under the same contract."""
    if not kept:
        monkeypatch.setattr(_roundplan, "KEPT_WORDS", 0)
    world, rng = 2, np.random.default_rng(11)
    data = [[[torch.from_numpy(rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)) for _, _, n in SHAPE]
             for _ in range(world)] for _ in range(ROUNDS)]
    with switch_emulator.start() as sw:
        job = ControlClient(sw.control_addr).admit(world, n_slots=64, words_per_packet=64)
        ports = [UdpSwitchPort(sw.data_addr, job=job, rank=r, control=sw.control_addr, native=native, timeout=20.0)
                 for r in range(world)]
        try:
            def rank(r: int) -> tuple[list[tuple[int, int, object]], list[int]]:
                held: list[tuple[int, int, object]] = []  # (round, stream, what the caller keeps)
                dropped: list[int] = []  # the addresses of the results the caller let go
                out: list[torch.Tensor] | None = None
                for i in range(ROUNDS):
                    out = ports[r].combine([Stream(name, op, data[i][r][j]) for j, (name, op, _) in enumerate(SHAPE)])
                    held += [(i, j, x) for j, x in _holds(out, i)]
                    if i not in (1, 2, 3, 5):
                        dropped += [t.data_ptr() for t in out]
                    if r == 0 and i == 4:  # the held results so far, while later rounds run
                        _check(held, data)
                return held, dropped

            got = on_threads(rank, world)
        finally:
            for p in ports:
                p.close()
    for held, dropped in got:
        _check(held, data)
        assert len(held) == 3 + 1 + 1 + 2
        assert len(set(dropped)) < len(dropped), "no result array was handed out again"


def _check(held: list[tuple[int, int, object]], data: list[list[list[torch.Tensor]]]) -> None:
    for i, j, x in held:
        want = combine_words(SHAPE[j][1], [d[j] for d in data[i]])
        words = torch.as_tensor(x).reshape(-1)
        tail = want.numel() - words.numel()  # a view of the tail: results[2][3:]
        assert torch.equal(words, want[tail:]), f"round {i} stream {j}: overwritten by a later call"


def test_kept_results_hand_out_only_unreferenced_arrays() -> None:
    """Per stream: a kept array comes back (same address) only once nothing made from it is alive;
    while both kept arrays are held, a new one (not kept beyond ``depth``); the addresses handed
    out are the arrays'."""
    kept = KeptResults((5, 3))
    first, at1 = kept.take()
    assert at1 == [a.ctypes.data for a in first] and [a.size for a in first] == [5, 3]
    second, at2 = kept.take()  # the first still held: new ones, kept (depth 2)
    assert not set(at1) & set(at2)
    view = torch.from_numpy(first[0])[1:]  # stream 0's first array stays alive through a view only
    alias = torch.from_numpy(second[1]).numpy()  # stream 1's second through a numpy array of a tensor
    del first, second
    third, at3 = kept.take()
    assert at3 == [at2[0], at1[1]]  # the free one of each stream
    fourth, at4 = kept.take()  # every kept array held: new ones, not kept
    assert at4[0] not in (at1[0], at2[0]) and at4[1] not in (at1[1], at2[1])
    del fourth, view
    fifth, at5 = kept.take()
    assert at5[0] == at1[0]  # the view was the last reference
    assert at5[1] not in (at1[1], at2[1])  # stream 1: the alias still holds one, ``third`` the other
    del third, alias, fifth
    assert kept.take()[1] == [at1[0], at1[1]]


def test_rto_take_is_sample_one_at_a_time() -> None:
    """``take(rs)`` leaves the estimator exactly as ``sample`` of each did (first sample
    included); an empty batch changes nothing (a backed-off RTO stays backed off)."""
    rng = np.random.default_rng(3)
    one, batch = RtoEstimator(), RtoEstimator()
    for size in (1, 4, 0, 7, 2, 0, 30):
        rs = (rng.random(size) * 0.05).tolist()
        for r in rs:
            one.sample(r)
        batch.take(rs)
        assert (one.srtt, one.rttvar, one.rto, one.samples) == (batch.srtt, batch.rttvar, batch.rto, batch.samples)
    one.expired(100.0)
    batch.expired(100.0)
    batch.take([])
    assert batch.rto == one.rto and batch.backoffs == one.backoffs == 1
