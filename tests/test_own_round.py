"""``SwitchPort.own_round``: a round shape's own input and output arrays (issue 39's steady small call).

A port that keeps them (the UDP port's native datapath: a small plan's arrays; the process group's
:class:`~homagg.torch._fallback.PathPort` on the switch path, wrapping it) hands out an
:class:`~homagg.transport.OwnRound`; its ``run`` must be ``combine_arrays`` of copies of its inputs:
the same results (oracle: :func:`~homagg.transport.combine_words` of every rank's words), the same
sequence numbers (rounds of both kinds interleave on one port), the verifier called once per round,
and through a switch failure the same fallback.  Also the native datapath's agreement check in C
(:class:`~homagg.transport.AgreementCheck`): agreeing words count as the round's verify without a
Python call; disagreeing ones reach the Python check, which raises on every rank.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

import switch_emulator
from homagg import RankMismatchError
from homagg.testing import on_threads
from homagg.torch._path_round import PathRound
from homagg.transport import AgreementCheck, CombineOp, ControlClient, OwnRound, VerifyOnce, combine_words
from homagg.transport._fastpath import AVAILABLE
from homagg.transport._roundplan import OWN_WORDS, SMALL_WORDS
from tests.test_transport_small_rounds import _close, _ports, _words, killable_path_ports, through_a_kill
from tests.test_transport_verify_once import _raised

MAX, ADD = CombineOp.MAX, CombineOp.ADD
native_only = pytest.mark.skipif(not AVAILABLE, reason="the native datapath was not built")


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


def _oracle(ops: tuple[CombineOp, ...], data: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [combine_words(op, [torch.from_numpy(d[j]) for d in data]).numpy() for j, op in enumerate(ops)]


def _own_run(port, ops: tuple[CombineOp, ...], words: list[np.ndarray],
             verify: Callable[[np.ndarray], None] | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One round through ``port.own_round``: the words written into its inputs; (copies of the
    results, the result arrays themselves)."""
    own = port.own_round(ops, tuple(w.size for w in words))
    assert isinstance(own, OwnRound)
    for dst, src in zip(own.ins, words, strict=True):
        np.copyto(dst, src)
    out = own.run(verify)
    return [o.copy() for o in out], out


@native_only
def test_udp_own_rounds_are_combine_arrays_interleaved(switch) -> None:
    world = 2
    job, ports = _ports(switch, world, True, k=16, slots=4)
    rng = np.random.default_rng(5)
    shapes = [((MAX, ADD), (18, 1)), ((MAX, ADD), (18, 33)), ((ADD,), (5,)), ((MAX, ADD), (18, 1))]
    try:
        held: dict[tuple, list[np.ndarray]] = {}
        for i in range(12):  # own rounds and combine_arrays alternate on every port: one sequence
            ops, sizes = shapes[i % len(shapes)]
            data = [[_words(rng, n) for n in sizes] for _ in range(world)]
            seen: list[list[np.ndarray]] = [[] for _ in range(world)]

            def verify(r: int) -> Callable[[np.ndarray], None]:
                return lambda w: seen[r].append(w.copy())

            if i % 3 == 2:
                out = on_threads(lambda r: ports[r].combine_arrays(ops, data[r], verify(r)), world)
            else:
                both = on_threads(lambda r: _own_run(ports[r], ops, data[r], verify(r)), world)
                out = [b[0] for b in both]
                arrays = [b[1] for b in both]
                if (ops, sizes) in held:  # the port's own arrays: the same ones every round of the shape
                    assert all(a is b for a, b in zip(arrays[0], held[(ops, sizes)]))
                held[(ops, sizes)] = arrays[0]
            want = _oracle(ops, data)
            for r in range(world):
                assert all(np.array_equal(o, w) for o, w in zip(out[r], want, strict=True)), (i, r)
                assert len(seen[r]) == 1 and np.array_equal(seen[r][0], want[0]), (i, r, len(seen[r]))
        assert [p.stats["rounds"] for p in ports] == [12] * world
        plans = dict(ports[0]._plans)
        assert ports[0].own_round((ADD, ADD), (0, 3)) is None  # a stream without words
        assert ports[0].own_round((ADD,), (OWN_WORDS + 1,)) is None  # above what a port keeps own arrays for
        assert ports[0]._plans == plans  # shapes without own arrays get no plan (none evicted for them)
    finally:
        for p in ports:
            p.close()
        ControlClient(switch.control_addr).remove(job.job_id)


def test_the_python_loop_keeps_no_own_round(switch) -> None:
    job, (port,) = _ports(switch, 1, False)
    try:
        assert port.own_round((MAX, ADD), (18, 1)) is None
    finally:
        port.close()
        ControlClient(switch.control_addr).remove(job.job_id)


@native_only
def test_agreement_is_checked_in_c_and_a_disagreement_in_python(switch) -> None:
    """Agreeing descriptor-like words: the check never runs in Python, the port counts an
    agreement, a VerifyOnce around it counts as called; words that disagree in one field reach the
    check (once per rank), whose error every rank raises, and the ports go on with the next round."""
    world, fields = 2, 4
    job, ports = _ports(switch, world, True, k=16, slots=4)
    calls: list[int] = []

    def check(words: np.ndarray) -> None:
        calls.append(1)
        if not np.array_equal(words[:fields], ~words[fields:2 * fields]):
            raise RankMismatchError(f"field {int(np.flatnonzero(words[:fields] != ~words[fields:2 * fields])[0])}")

    agreement = AgreementCheck(check, fields)

    def head(values: list[int]) -> np.ndarray:
        v = np.array(values, dtype=np.int32)
        return np.concatenate([v, ~v, np.array([7, -3], dtype=np.int32)])

    try:
        same = [head([1, 2, 3, 4]) for _ in range(world)]
        vals = [np.full(3, r + 1, dtype=np.int32) for r in range(world)]
        onces = [VerifyOnce(agreement) for _ in range(world)]
        both = on_threads(lambda r: _own_run(ports[r], (MAX, ADD), [same[r], vals[r]], onces[r]), world)
        assert all(np.array_equal(b[0][1], np.full(3, 3)) for b in both)
        assert calls == [] and all(o.called for o in onces)
        assert [p.stats["agreements"] for p in ports] == [1] * world
        out = on_threads(lambda r: ports[r].combine_arrays((MAX, ADD), [same[r], vals[r]], agreement), world)
        assert all(np.array_equal(o[0], same[0]) for o in out) and calls == []  # combine_arrays: judged in C too
        apart = [head([1, 2 + r, 3, 4]) for r in range(world)]
        errors = on_threads(lambda r: _raised(lambda: ports[r].combine_arrays((MAX, ADD), [apart[r], vals[r]],
                                                                            agreement)), world)
        assert all(isinstance(e, RankMismatchError) and "field 1" in str(e) for e in errors), errors
        assert len(calls) == world and [p.stats["agreements"] for p in ports] == [2] * world
        out = on_threads(lambda r: ports[r].combine_arrays((ADD,), [vals[r]]), world)  # the job goes on
        assert all(np.array_equal(o[0], np.full(3, 3)) for o in out)
    finally:
        for p in ports:
            p.close()
        ControlClient(switch.control_addr).remove(job.job_id)


@native_only
@pytest.mark.parametrize("n", [3, 20_000])
def test_path_port_own_rounds_fall_back_when_the_switch_is_killed(n: int) -> None:
    """PathPort.own_round on the switch path: PathRound over the UDP port's own arrays, results
    exact, ``last`` a copy (the own arrays are the next round's), or for a shape above
    ``SMALL_WORDS`` the round's arrays themselves (two sets taken in turn: the round before's
    stay as they were); the emulator killed: that round falls back (the words this rank was
    sending), exact; on the host path no own round (a PathRound handed out before runs on the
    host path)."""
    world = 2
    emulator, ports = killable_path_ports(world)
    head = [np.arange(18, dtype=np.int32) * (r + 1) for r in range(world)]
    seen: list[list[np.ndarray]] = [[] for _ in range(world)]
    ops, lengths = (MAX, ADD), (18, n)
    early = [p.own_round(ops, lengths) for p in ports]
    assert all(isinstance(e, PathRound) and e.inner.stable == (n > SMALL_WORDS) for e in early)
    held: list[list[list[np.ndarray]]] = [[] for _ in range(world)]  # each round's result arrays

    def round_(r: int) -> list[np.ndarray]:
        own = ports[r].own_round(ops, lengths)
        if own is None:  # the host path keeps no arrays: a PathRound handed out on the switch path
            own = early[r]
        np.copyto(own.ins[0], head[r])
        own.ins[1][:] = 10 * (r + 1) + len(held[r])  # each round's sums differ
        out = own.run(seen[r].append)
        held[r].append(out)
        return [o.copy() for o in out]

    try:
        steps = ("switch", "switch", "switch", "kill", "host")
        for i, (expect, out) in enumerate(through_a_kill(emulator, round_, world, steps)):
            for o in out:
                assert np.array_equal(o[0], head[1]) and np.array_equal(o[1], np.full(n, 30 + 2 * i))
            if expect == "switch":
                for r, p in enumerate(ports):
                    assert p.last is not None and np.array_equal(p.last[1], np.full(n, 30 + 2 * i))
                    # a copy where the own arrays are the next round's; the arrays themselves where stable
                    assert (p.last[1] is held[r][-1][1]) == (n > SMALL_WORDS)
                    if i and n > SMALL_WORDS:  # the round before's arrays: untouched by this round
                        assert held[r][-2][1] is not held[r][-1][1]
                        assert np.array_equal(held[r][-2][1], np.full(n, 30 + 2 * (i - 1)))
            assert [p.path for p in ports] == ["switch" if expect == "switch" else "host"] * world
        assert all(p.own_round(ops, lengths) is None for p in ports)
        assert [p.rounds for p in ports] == [5, 5]
        assert all(len(s) == 5 and all(np.array_equal(w, head[1]) for w in s) for s in seen)
    finally:
        _close(ports)
        emulator.stop()
