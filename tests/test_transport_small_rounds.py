"""``SwitchPort.combine_arrays``, the small-call path, and the cached round set-up of
:class:`~homagg.transport.UdpSwitchPort` (homagg/transport/_roundplan.py).

Oracles: :func:`~homagg.transport.combine_words` (the reference combine) for results; ``combine`` of
the equivalent Streams for the datagrams on the wire (a scripted one-worker switch records every
header: sequence numbers, slots, banks, tags, offsets); the switch's own view of who is missing.
Real parts: the emulator (in a thread, with injected faults, or a child process that is killed),
gloo groups on threads for the process group's :class:`~homagg.torch._fallback.PathPort`.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import switch_emulator
from homagg import PathWarning, ProtocolError, SwitchTimeoutError
from homagg.codec import WorkerStats
from homagg.testing import on_threads
from homagg.torch._fallback import PathPort
from homagg.torch._link import SwitchLink
from homagg.transport import (CombineOp, ControlClient, GlooSwitchPort, Stream, UdpSwitchPort, array_streams,
                              combine_words)
from tests.test_transport_rto import LOOPS, FakeSwitch

OPS = [CombineOp.ADD, CombineOp.OR, CombineOp.MAX]


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


def _ports(sw, world: int, native: bool, k: int = 5, slots: int = 4, **options):
    job = ControlClient(sw.control_addr).admit(world, n_slots=slots, words_per_packet=k)
    return job, [UdpSwitchPort(sw.data_addr, job=job, rank=r, control=sw.control_addr, native=native,
                               timeout=options.pop("timeout", 10.0), **options) for r in range(world)]


def _words(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)


@pytest.mark.parametrize("native", LOOPS)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_arrays_equal_the_reference_interleaved_with_streams(switch, world: int, native: bool) -> None:
    """Random rounds (1-4 streams of 1..3K words, every op), each worker alternating at random
    between combine_arrays and combine on the same port: exact, and the sequence stays aligned."""
    k = 5
    job, ports = _ports(switch, world, native, k=k)
    rng = np.random.default_rng(world)
    try:
        for rnd in range(16):
            ops = [OPS[i] for i in rng.integers(0, 3, int(rng.integers(1, 5)))]
            sizes = [int(n) for n in rng.integers(1, 3 * k + 1, len(ops))]
            data = [[_words(rng, n) for n in sizes] for _ in range(world)]
            as_arrays = rng.integers(0, 2, world).astype(bool)

            def work(r: int) -> list[np.ndarray]:
                if as_arrays[r]:
                    return ports[r].combine_arrays(ops, data[r])
                return [t.numpy() for t in ports[r].combine([Stream(f"s{j}", op, torch.from_numpy(w))
                                                             for j, (op, w) in enumerate(zip(ops, data[r]))])]

            got = on_threads(work, world, timeout=60)
            for j, op in enumerate(ops):
                want = combine_words(op, [torch.from_numpy(d[j]) for d in data]).numpy()
                for r in range(world):
                    assert got[r][j].dtype == np.int32 and np.array_equal(got[r][j], want), (rnd, r, j, op)
        seqs = {p._seq for p in ports}
        assert len(seqs) == 1 and all(p.stats["retransmits"] == 0 for p in ports)
    finally:
        for p in ports:
            p.close()
        ControlClient(switch.control_addr).remove(job.job_id)


@pytest.mark.parametrize("native", LOOPS)
def test_arrays_put_the_same_datagrams_on_the_wire_as_streams(native: bool) -> None:
    """The same rounds through combine and through combine_arrays (one and several chunks, a
    stream longer than SMALL_WORDS): the same headers in the same order, and results that are new
    arrays the port never reuses."""
    rng = np.random.default_rng(3)
    rounds = [[_words(rng, n) for n in sizes] for sizes in ([18, 1], [1], [40, 3, 17], [18, 1], [20000, 5])]
    ops = [CombineOp.MAX, CombineOp.ADD, CombineOp.OR]
    wires, results = {}, {}
    for arrays in (False, True):
        fake = FakeSwitch(lambda i, h: [(0.0, 1)])
        try:
            # an RTO floor no scheduling stall reaches: a retransmission (a loaded CI host once stalled
            # the Python loop's run past the 0.2 s floor) would add a datagram to one wire only
            with UdpSwitchPort(fake.addr, rank=0, job_id=1, world_size=1, n_slots=8, words_per_packet=16,
                               timeout=30.0, native=native, rto=10.0, min_rto=10.0, max_rto=20.0) as port:
                out = []
                for words in rounds:
                    if arrays:
                        out.append(port.combine_arrays(ops[:len(words)], words))
                    else:
                        out.append([t.numpy() for t in port.combine(array_streams(ops[:len(words)], words))])
        finally:
            fake.close()
        wires[arrays], results[arrays] = fake.received, out
    assert wires[True] == wires[False] and len(wires[True]) > 20
    for words, got in zip(rounds, results[True]):
        assert all(np.array_equal(g, w) for g, w in zip(got, words))
    addresses = {a.ctypes.data for got in results[True] for a in got}
    assert len(addresses) == sum(len(w) for w in rounds)  # every result its own array


@pytest.mark.parametrize("native", LOOPS)
def test_a_refusing_verifier_abandons_the_round(native: bool) -> None:
    """verify sees stream 0's combined words once, also when its last chunk completes the round; a
    verifier that raises abandons the round at once: the error propagates, the sequence moves past
    the whole round (as RoundLoop.verify_early does for Streams), and the next round continues
    from there, exact."""
    fake = FakeSwitch(lambda i, h: [(0.0, 1)])
    seen: list[np.ndarray] = []
    head, tail = np.arange(1, 301, dtype=np.int32), np.full(40, 7, dtype=np.int32)
    ops = [CombineOp.ADD, CombineOp.MAX]

    def refuse(words: np.ndarray) -> None:
        raise ProtocolError(f"ranks out of step ({int(words[0])})")

    try:
        with UdpSwitchPort(fake.addr, rank=0, job_id=1, world_size=1, n_slots=8, words_per_packet=16,
                           timeout=10.0, native=native) as port:
            (alone,) = port.combine_arrays(ops[:1], [head], seen.append)
            out = port.combine_arrays(ops, [head, tail], seen.append)
            seq = port._seq
            with pytest.raises(ProtocolError, match=r"out of step \(1\)"):
                port.combine_arrays(ops, [head, tail], refuse)
            assert port._seq == seq + 19 + 3  # 300 words in 19 chunks, 40 in 3
            sent = len(fake.received)
            again = port.combine_arrays(ops, [head, tail])
    finally:
        fake.close()
    assert len(seen) == 2 and all(np.array_equal(s, head) for s in seen)
    assert np.array_equal(alone, head) and np.array_equal(out[0], head) and np.array_equal(out[1], tail)
    assert np.array_equal(again[0], head) and np.array_equal(again[1], tail)
    tags = [h[8] for h in fake.received[sent:]]  # the next round's chunks: from seq + 22 on, its 22
    assert set(range(seq + 22, seq + 44)) <= set(tags) and max(tags) == seq + 43


@pytest.mark.parametrize("native", LOOPS)
def test_a_refusing_verifier_raises_on_every_worker(switch, native: bool) -> None:
    """Two workers at the emulator, each refusing stream 0's combined words: both raise at once
    (not at the progress timeout), with the sequence moved past the round on both."""
    world = 2
    job, ports = _ports(switch, world, native, k=16, slots=4, timeout=30.0)
    head = [np.arange(18, dtype=np.int32) + r for r in range(world)]
    tail = [np.full(40, r + 1, dtype=np.int32) for r in range(world)]
    ops = [CombineOp.MAX, CombineOp.ADD]

    def refuse(words: np.ndarray) -> None:
        raise ProtocolError(f"ranks out of step ({int(words[0])})")

    try:
        out = on_threads(lambda r: ports[r].combine_arrays(ops, [head[r], tail[r]]), world)
        assert all(np.array_equal(o[0], head[1]) and np.array_equal(o[1], np.full(40, 3)) for o in out)
        t0 = time.monotonic()
        errors = on_threads(lambda r: _raised(lambda: ports[r].combine_arrays(ops, [head[r], tail[r]], refuse)), world)
        assert time.monotonic() - t0 < 10
        assert all(isinstance(e, ProtocolError) and "out of step (1)" in str(e) for e in errors), errors
        assert [p._seq for p in ports] == [10, 10]
    finally:
        for p in ports:
            p.close()
        ControlClient(switch.control_addr).remove(job.job_id)


def _raised(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


@pytest.mark.parametrize("native", LOOPS)
def test_arrays_exact_under_loss_with_retransmits(native: bool) -> None:
    faults = switch_emulator.FaultConfig(drop=0.05, duplicate=0.05, reorder=0.05, seed=11)
    world = 2
    with switch_emulator.start(faults=faults) as sw:
        job, ports = _ports(sw, world, native, k=8, slots=8, rto=0.05, min_rto=0.02, timeout=20.0)
        rng = np.random.default_rng(5)
        try:
            for _ in range(30):
                n = int(rng.integers(1, 40))
                data = [[_words(rng, 18), _words(rng, n)] for _ in range(world)]
                got = on_threads(lambda r: ports[r].combine_arrays([CombineOp.MAX, CombineOp.ADD], data[r]), world)
                for j, op in enumerate((CombineOp.MAX, CombineOp.ADD)):
                    want = combine_words(op, [torch.from_numpy(d[j]) for d in data]).numpy()
                    assert all(np.array_equal(g[j], want) for g in got)
            assert sum(p.stats["retransmits"] for p in ports) > 0
            assert ControlClient(sw.control_addr).status()["counters"]["drop_injected"] > 0
        finally:
            for p in ports:
                p.close()


@pytest.mark.parametrize("native", LOOPS)
def test_a_silent_worker_is_named_in_the_timeout(switch, native: bool) -> None:
    job, ports = _ports(switch, 2, native, k=16, slots=4, timeout=1.5)
    try:
        with pytest.raises(SwitchTimeoutError) as err:
            ports[0].combine_arrays([CombineOp.MAX, CombineOp.ADD], [np.arange(18, dtype=np.int32),
                                                                     np.ones(1, dtype=np.int32)])
        e = err.value
        assert e.missing == [1] and e.stream == "words[0]" and e.job_id == job.job_id, str(e)
        assert "workers [1]" in str(e)
    finally:
        for p in ports:
            p.close()
        ControlClient(switch.control_addr).remove(job.job_id)


def test_bad_arrays_are_typed_errors(switch) -> None:
    job, (port,) = _ports(switch, 1, native=False)
    try:
        for ops, words in (([CombineOp.ADD], [np.ones(3, dtype=np.int64)]),
                           ([CombineOp.ADD], [np.ones((2, 2), dtype=np.int32)]),
                           ([CombineOp.ADD], [np.ones(3, dtype=">i4")]),
                           ([CombineOp.ADD], [[1, 2, 3]]),
                           ([CombineOp.ADD, CombineOp.OR], [np.ones(3, dtype=np.int32)]),
                           ([7], [np.ones(3, dtype=np.int32)])):
            with pytest.raises(ProtocolError):
                port.combine_arrays(ops, words)
        assert port._seq == 0 and port.stats["packets"] == 0
    finally:
        port.close()
        ControlClient(switch.control_addr).remove(job.job_id)


# ------------------------------------------------------------------ the process group's port
def _gloo_groups(world: int) -> list[dist.ProcessGroup]:
    store = dist.HashStore()
    return on_threads(lambda r: dist.ProcessGroupGloo(dist.PrefixStore("small/", store), r, world,
                                                      timedelta(seconds=30)), world)


def _path_ports(links: list[SwitchLink], gloos: list[dist.ProcessGroup]) -> list[PathPort]:
    def no_return(epoch: int) -> SwitchLink:
        raise AssertionError("the probe never answers: no return to the switch")

    world = len(links)
    return [PathPort(links[r], gloos[r], r, world, stats=WorkerStats(), policy="host", timeout_s=30.0,
                     probe_interval_s=3600.0, open_link=no_return, probe=lambda: False, switch_timeout_s=5.0)
            for r in range(world)]


def killable_path_ports(world: int, n_slots: int = 8) -> tuple[Any, list[PathPort]]:
    """An emulator process of its own (the test may kill it) and ``world`` PathPorts over UDP ports
    of one job on it (gloo groups for the host path); the caller closes both."""
    gloos = _gloo_groups(world)
    emulator = switch_emulator.spawn(timeout=30)
    with ControlClient(emulator.control_addr, secret=emulator.secret) as ctl:
        job = ctl.admit(world, n_slots=n_slots, words_per_packet=16)
    udp = [UdpSwitchPort(emulator.data_addr, job=job, rank=r, control=emulator.control_addr, secret=emulator.secret,
                         timeout=5.0) for r in range(world)]
    return emulator, _path_ports([SwitchLink(p, "udp", _closers=[p.close]) for p in udp], gloos)


def through_a_kill(emulator: Any, round_: Any, world: int, steps: tuple[str, ...]) -> Any:
    """``round_(rank)`` on every rank (threads) once per step, yielding (step, the ranks' results);
    at a ``kill`` step the emulator process is killed first, and that round must warn that the
    group continues on the host path."""
    for step in steps:
        if step == "kill":
            emulator.process.kill()
            emulator.process.wait(10)
        with pytest.warns(PathWarning, match="host path") if step == "kill" else nullcontext():
            out = on_threads(round_, world, timeout=60)
        yield step, out


def _close(ports: list[PathPort]) -> None:
    on_threads(lambda r: ports[r].close(), len(ports))  # the agreement at close is a collective


@pytest.mark.parametrize("streams", [2, 1])
def test_path_port_arrays_fall_back_when_the_switch_is_killed(streams: int) -> None:
    """Two ranks on threads: rounds on the switch, then the emulator process is killed before the
    next round: that round's datagrams find no switch, every rank falls back and completes it on the
    host path (gloo), exact; later rounds stay on the host path, exact, verified exactly once per
    round (also a round of the verified stream alone, which gloo combines without an early check)."""
    world = 2
    emulator, ports = killable_path_ports(world)
    head = [np.arange(18, dtype=np.int32) * (r + 1) for r in range(world)]
    vals = [np.full(33, 10 * (r + 1), dtype=np.int32) for r in range(world)]
    ops = [CombineOp.MAX, CombineOp.ADD][:streams]
    seen: list[list[np.ndarray]] = [[] for _ in range(world)]

    def round_(r: int) -> list[np.ndarray]:  # every rank verifies (the host path's rounds depend on it)
        return ports[r].combine_arrays(ops, [head[r], vals[r]][:streams], seen[r].append)

    try:
        for expect_path, out in through_a_kill(emulator, round_, world, ("switch", "switch", "kill", "host", "host")):
            for o in out:
                assert all(isinstance(a, np.ndarray) and a.dtype == np.int32 for a in o)
                assert len(o) == streams and np.array_equal(o[0], head[1])
                assert streams == 1 or np.array_equal(o[1], np.full(33, 30))
            assert [p.path for p in ports] == ["host" if expect_path != "switch" else "switch"] * world
        assert [p.rounds for p in ports] == [5, 5]
        for s in seen:  # on the switch 2, on the host path 3 (the redone round included)
            assert len(s) == 5 and all(np.array_equal(w, head[1]) for w in s)
        assert [(t["from"], t["to"]) for t in ports[0].stats.transitions] == [("switch", "host")]
    finally:
        _close(ports)
        emulator.stop()


def test_path_port_arrays_on_the_host_path_match_gloo() -> None:
    world = 3
    gloos = _gloo_groups(world)
    hosts = [GlooSwitchPort(g, r, world) for r, g in enumerate(gloos)]
    ports = _path_ports([SwitchLink(h, "gloo") for h in hosts], gloos)
    for p in ports:
        p.path = "host"
    rng = np.random.default_rng(9)
    data = [[_words(rng, 5), _words(rng, 700), _words(rng, 2)] for _ in range(world)]
    out = on_threads(lambda r: ports[r].combine_arrays(OPS, data[r]), world)
    for j, op in enumerate(OPS):
        want = combine_words(op, [torch.from_numpy(d[j]) for d in data]).numpy()
        assert all(np.array_equal(o[j], want) for o in out)
    assert [p.rounds for p in ports] == [1] * world and all(p._call_host for p in ports)
    _close(ports)
