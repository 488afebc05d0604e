"""``SwitchPort.combine_arrays``' verifier contract: every port calls ``verify`` exactly once per
round, with stream 0's combined words, before returning (the small-call path relies on it: it
checks the call descriptor nowhere else).

Ports: the UDP port (both loops, the emulator in a thread), the in-process switch and an
in-process tree of real switch pipelines on it, the gloo host path, and the process group's
:class:`~homagg.torch._fallback.PathPort` on the switch and on the host path (its fallback in the
middle of a round: ``tests/test_transport_small_rounds.py``).  Oracle: the reference
:func:`~homagg.transport.combine_words` of every rank's stream 0.  Rounds: a verified stream alone
(no second stream to verify early before), two and three streams, and an empty stream 0 (no chunk
of it ever comes back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

import switch_emulator
from homagg import ProtocolError
from homagg.testing import TreeNetwork, on_threads
from homagg.torch._link import SwitchLink
from homagg.transport import (CombineOp, ControlClient, GlooSwitchPort, InProcessSwitch, SwitchPort, UdpSwitchPort,
                              combine_words)
from homagg.tree import plan_tree
from tests.test_transport_rto import LOOPS
from tests.test_transport_small_rounds import _gloo_groups, _path_ports

MAX, ADD, OR = CombineOp.MAX, CombineOp.ADD, CombineOp.OR
#: (ops, lengths) of the rounds every port runs, in this order
ROUNDS = [([MAX], [18]), ([MAX, ADD], [18, 33]), ([ADD, OR, MAX], [1, 700, 5]), ([OR, ADD], [0, 7]),
          ([MAX, ADD], [18, 1])]


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


def _check_rounds(ports: list[SwitchPort]) -> None:
    """Every round of :data:`ROUNDS` on every port (threads): results exact, and each rank's verifier
    called exactly once per round with stream 0's combined words."""
    world = len(ports)
    rng = np.random.default_rng(world)
    for ops, sizes in ROUNDS:
        data = [[rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32) for n in sizes]
                for _ in range(world)]
        seen: list[list[np.ndarray]] = [[] for _ in range(world)]
        out = on_threads(lambda r: ports[r].combine_arrays(ops, data[r], lambda w, r=r: seen[r].append(w.copy())),
                         world)
        for j, op in enumerate(ops):
            want = combine_words(op, [torch.from_numpy(d[j]) for d in data]).numpy()
            assert all(np.array_equal(o[j], want) for o in out), (ops, j)
            if j == 0:
                for r in range(world):
                    assert len(seen[r]) == 1, f"rank {r}: verify called {len(seen[r])} times in round {ops} {sizes}"
                    assert np.array_equal(seen[r][0], want)


def _check_refusal(ports: list[SwitchPort]) -> None:
    """A verifier that raises: the round raises it on every rank, also a round of stream 0 alone."""
    world = len(ports)

    def refuse(words: np.ndarray) -> None:
        raise ProtocolError(f"out of step ({int(words[0])})")

    head = [np.full(3, r + 5, dtype=np.int32) for r in range(world)]
    for ops, extra in (([MAX], []), ([MAX, ADD], [np.ones(4, dtype=np.int32)])):
        errors = on_threads(lambda r: _raised(lambda: ports[r].combine_arrays(ops, [head[r], *extra], refuse)), world)
        assert all(isinstance(e, ProtocolError) and f"out of step ({world + 4})" in str(e) for e in errors), errors


def _raised(fn: Callable[[], object]) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def test_in_process_switch_verifies_once() -> None:
    switch = InProcessSwitch(2, timeout=30)
    ports = [switch.port(r) for r in range(2)]
    _check_rounds(ports)
    _check_refusal(ports)


def test_in_process_tree_verifies_once() -> None:
    plan = plan_tree(4, per_switch=2)
    assert plan.levels == 2
    net = TreeNetwork(plan, words_per_packet=16, n_slots=4)
    switch = InProcessSwitch(4, timeout=60, combiner=net.combine)
    ports = [switch.port(r) for r in range(4)]
    _check_rounds(ports)
    _check_refusal(ports)


def test_gloo_host_path_verifies_once() -> None:
    gloos = _gloo_groups(2)
    ports = [GlooSwitchPort(g, r, 2, timeout_s=30.0) for r, g in enumerate(gloos)]
    _check_rounds(ports)
    _check_refusal(ports)


@contextmanager
def udp_ports(sw, world: int, native: bool | None, n_slots: int = 4, words_per_packet: int = 16,
              timeout: float = 10.0) -> Iterator[list[UdpSwitchPort]]:
    """``world`` UDP ports of a fresh job on the emulator ``sw``; closed and the job removed after."""
    ctl = ControlClient(sw.control_addr)
    job = ctl.admit(world, n_slots=n_slots, words_per_packet=words_per_packet)
    ports = [UdpSwitchPort(sw.data_addr, job=job, rank=r, control=sw.control_addr, native=native, timeout=timeout)
             for r in range(world)]
    try:
        yield ports
    finally:
        for p in ports:
            p.close()
        ctl.remove(job.job_id)


@contextmanager
def path_ports_over_udp(sw, world: int, path: str, **job: Any) -> Iterator[list[Any]]:
    """``world`` PathPorts (the process group's switch-or-host port) over :func:`udp_ports` (the
    native datapath where it was built) and gloo groups, each set on ``path``; closed after (the
    agreement at close is a collective) and the job removed."""
    gloos = _gloo_groups(world)
    with udp_ports(sw, world, None, **job) as udp:
        ports = _path_ports([SwitchLink(p, "udp", _closers=[p.close]) for p in udp], gloos)
        for p in ports:
            p.path = path
        try:
            yield ports
        finally:
            on_threads(lambda r: ports[r].close(), world)


@pytest.mark.parametrize("native", LOOPS)
def test_udp_port_verifies_once(switch, native: bool) -> None:
    with udp_ports(switch, 2, native) as ports:
        _check_rounds(ports)
        _check_refusal(ports)
        assert len({p._seq for p in ports}) == 1


@pytest.mark.parametrize("path", ["switch", "host"])
def test_path_port_verifies_once(switch, path: str) -> None:
    world = 2
    with path_ports_over_udp(switch, world, path) as ports:
        _check_rounds(ports)
        assert [p.path for p in ports] == [path] * world
        assert [p.rounds for p in ports] == [len(ROUNDS)] * world
