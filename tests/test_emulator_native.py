"""The emulator's native engine (switch_emulator/_dataplane.c) against the Python pipeline.

Oracle: the python engine (switch_emulator/pipeline.py, itself checked against BMv2 in
tests/test_p4_bmv2.py).  The differential sequence of tests/test_p4_bmv2.py -- two jobs, bank
flips, partial packets, wrapping ADD, OR, signed MAX, duplicates, retransmissions answered from
the shadow copy, stale copies, forged tokens, a conflict, unknown sources and every malformed
kind -- goes through a real emulator of each engine over loopback sockets (one socket per worker
source); every result datagram (per destination, in order), every counter and every slot's state
must be equal.  The same with some workers subscribed to their job's multicast group (the group's
datagrams are compared too), and for random sequences (hypothesis) of one job's datagrams drawn
so that uses complete, banks flip, and every verdict and drop reason occurs.
"""

from __future__ import annotations

import socket
import time
import struct
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import switch_emulator
from homagg import ConfigError
from homagg import wire
from homagg.jobs import JobSpec, WorkerAddr
from homagg.transport import ControlClient
from homagg.transport._sockets import join_group
from switch_emulator import native
from tests.test_p4_bmv2 import jobs, worker_sequence

from homagg.testing import run_on_switch

needs_native = pytest.mark.skipif(not native.AVAILABLE,
                                  reason="the native engine was not built (no C compiler at install)")


Addr = tuple[str, int]


def _drain(s: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(s.recv(65536))
        except BlockingIOError:
            return got


def _run(engine: str, seq: list[tuple[Addr, bytes]], specs: list[JobSpec] | None = None,
         subscribe: dict[int, tuple[int, ...]] | None = None) -> tuple[dict, dict]:
    """Admit ``specs`` (worker addresses: labels mapped to one real socket each), subscribe the
    workers of ``subscribe`` (job id -> worker ids) to the job's group, send ``seq`` in order; return
    the datagrams each socket (and each group, keyed ``("group", job id)``) received, the counters
    and every slot's state."""
    specs = jobs() if specs is None else specs
    sources = sorted({src for src, _ in seq} | {w.addr for j in specs for w in j.workers})
    socks: dict[object, socket.socket] = {}
    for src in sources:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        socks[src] = s
    real = {src: s.getsockname() for src, s in socks.items()}
    try:
        with switch_emulator.start(engine=engine) as sw:
            for j in specs:
                workers = tuple(WorkerAddr(w.worker_id, *real[w.addr]) for w in j.workers)
                sw.switch.admit(replace(j, workers=workers), "test")
            with ControlClient(sw.control_addr) as ctl:
                assert ctl.status()["engine"] == engine
                deadline = time.monotonic() + 5
                while subscribe and sw.switch.group_for is None and time.monotonic() < deadline:
                    time.sleep(0.01)  # the serve thread sets the backend's groups as it starts
                for job_id, wids in (subscribe or {}).items():
                    group = ctl.request("group", job_id=job_id)["group"]
                    socks[("group", job_id)] = join_group(tuple(group), "127.0.0.1")
                    for w in wids:
                        ctl.request("subscribe", job_id=job_id, worker_id=w)
                for src, dg in seq:
                    socks[src].sendto(dg, sw.data_addr)
                deadline = time.monotonic() + 20
                while ctl.status()["counters"]["rx"] < len(seq) and time.monotonic() < deadline:
                    time.sleep(0.05)
                # the Python engine counts rx as a datagram enters its pipeline and tx as the
                # results leave: read the counters once they stop changing, not between the two
                counters, before = ctl.status()["counters"], None
                while counters != before and time.monotonic() < deadline:
                    time.sleep(0.05)
                    before, counters = counters, ctl.status()["counters"]
                slots = [ctl.slot_status(j.job_id, j.slot_base + s) for j in specs for s in range(j.n_slots)]
        time.sleep(0.1)
        results = {src: _drain(s) for src, s in socks.items()}
    finally:
        for s in socks.values():
            s.close()
    return results, {"counters": counters, "slots": slots}


@needs_native
@pytest.mark.parametrize("seed", [5, 11])
def test_native_engine_equals_python_engine_byte_for_byte(seed: int) -> None:
    seq = worker_sequence(seed)
    py_results, py_state = _run("python", seq)
    c_results, c_state = _run("native", seq)
    assert py_state["counters"]["rx"] == len(seq)
    for name in ("drop_duplicate", "drop_conflict", "drop_token", "retransmit_answered",
                 "drop_unknown_source", "drop_short", "drop_length", "drop_op", "drop_version"):
        assert py_state["counters"][name] > 0, name  # the sequence exercises it
    assert c_results == py_results
    assert c_state == py_state


@needs_native
def test_native_engine_equals_python_engine_with_multicast_subscribers() -> None:
    """Job 1's workers 0 and 2 and job 7's worker 1 take results from the group: one group datagram
    per completion (worker_id 0), unicasts to the rest, answers still unicast."""
    seq = worker_sequence(5)
    sub = {1: (0, 2), 7: (1,)}
    py_results, py_state = _run("python", seq, subscribe=sub)
    c_results, c_state = _run("native", seq, subscribe=sub)
    assert py_results[("group", 1)] and py_results[("group", 7)]  # the groups carried results
    assert c_results == py_results
    assert c_state == py_state


_K, _TOKEN, _BASE = 4, 0x5EED0001, 6
_SPEC = JobSpec(3, 3, slot_base=_BASE, n_slots=2, words_per_packet=_K,
                workers=tuple(WorkerAddr(w, "10.9.9.1", 1000 + w) for w in range(3)), token=_TOKEN).validate()
_STRANGER = ("10.9.9.9", 1)  # a source nobody admitted


@st.composite
def _datagrams(draw: st.DrawFn) -> list[tuple[Addr, bytes]]:
    """Datagrams of job 3 (3 workers, 2 slots, K = 4): mostly well-formed with few distinct keys
    (uses complete, banks flip, retransmissions meet complete banks), some of every bad kind."""
    op = draw(st.sampled_from(wire.OPS))
    word = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), 2**31 - 1, -1, 0, 1]))
    out = []
    for _ in range(draw(st.integers(1, 80))):
        w = draw(st.integers(0, 2))
        src = _STRANGER if draw(st.integers(0, 40)) == 0 else _SPEC.workers[w].addr
        wid = (w + 1) % 3 if draw(st.integers(0, 40)) == 0 else w
        job_id = 4 if draw(st.integers(0, 40)) == 0 else 3
        wc = draw(st.sampled_from([_K] * 24 + [1, 2, _K + 1]))
        slot = draw(st.sampled_from([_BASE] * 8 + [_BASE + 1] * 8 + [_BASE - 1, _BASE + 2]))
        bank = draw(st.integers(0, 1))
        tag, offset = draw(st.sampled_from([0] * 9 + [1])), draw(st.sampled_from([0] * 19 + [7]))
        flags = draw(st.sampled_from([0] * 20 + [wire.FLAG_RETRANSMIT] * 2 + [wire.FLAG_RESULT]))
        token = _TOKEN ^ 0x100 if draw(st.integers(0, 30)) == 0 else _TOKEN
        dg = bytearray(wire.datagram_len(wc))
        wire.pack_header_into(dg, op, flags, job_id, wid, wc, bank, slot, tag, offset, token)
        dg[wire.HEADER_LEN:] = struct.pack(f">{wc}i", *draw(st.lists(word, min_size=wc, max_size=wc)))
        bad = draw(st.integers(0, 40))
        if bad == 1:
            dg = dg[:-1]  # length
        elif bad == 2:
            dg[0] = 0x30 | dg[0] & 0xF  # version
        elif bad == 3:
            dg[0] = dg[0] & 0xF0 | 9  # op
        elif bad == 4:
            dg = dg[:7]  # short
        out.append((src, bytes(dg)))
    return out


@needs_native
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seq=_datagrams(), subscribed=st.sampled_from([(), (0,), (1, 2)]))
def test_native_engine_equals_python_engine_on_random_sequences(seq: list[tuple[Addr, bytes]],
                                                                subscribed: tuple[int, ...]) -> None:
    sub = {3: subscribed} if subscribed else None
    py_results, py_state = _run("python", seq, [_SPEC], sub)
    c_results, c_state = _run("native", seq, [_SPEC], sub)
    assert py_state["counters"]["rx"] == len(seq)
    assert c_results == py_results
    assert c_state == py_state


@needs_native
def test_native_engine_end_to_end_every_scheme_exact() -> None:
    """4 worker processes, every scheme, against a native-engine child: each result is checked
    against the in-process switch's by run_on_switch (which raises otherwise)."""
    with switch_emulator.spawn(engine="native") as sw:
        results = run_on_switch(sw, 4, numel=30000, k=2238, slots=16)
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            st = ctl.status()
    assert st["engine"] == "native" and st["counters"]["completed"] > 0
    assert len(results) == 4  # run_on_switch raised had any scheme's result not been exact


@needs_native
def test_native_engine_refuses_faults_and_auto_falls_back_to_python() -> None:
    with switch_emulator.start(faults=switch_emulator.FaultConfig(drop=0.01)) as sw:
        with ControlClient(sw.control_addr) as ctl:
            assert ctl.status()["engine"] == "python"  # fault injection: the python engine
    with pytest.raises(ConfigError, match="python engine only"):
        switch_emulator.start(engine="native", allow_faults=True)
    with switch_emulator.start(engine="native") as sw:  # no faults allowed: the control port refuses them
        with ControlClient(sw.control_addr) as ctl:
            assert ctl.status()["engine"] == "native"
            with pytest.raises(ConfigError, match="disabled"):
                ctl.set_faults(drop=0.1)


def test_without_the_native_library_auto_serves_python_and_says_so_once(monkeypatch: pytest.MonkeyPatch,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """What an install without a C compiler does (runs whether or not the library was built)."""
    from switch_emulator import io_udp

    monkeypatch.setattr(native, "AVAILABLE", False)
    monkeypatch.setattr(io_udp, "_said", set())
    with pytest.raises(ConfigError, match="not built"):
        switch_emulator.start(engine="native")
    with caplog.at_level("WARNING", logger="homagg.switch"):
        for _ in range(2):
            with switch_emulator.start() as sw:
                with ControlClient(sw.control_addr) as ctl:
                    assert ctl.status()["engine"] == "python"
    assert sum("native engine was not built" in r.getMessage() for r in caplog.records) == 1


@needs_native
def test_status_reports_the_serving_engine_before_the_serve_thread_runs() -> None:
    """The engine is decided when the switch is built (check_engine), so a status read right after
    start never reports ``python`` for a switch the native engine will serve."""
    from switch_emulator.io_udp import UdpBackend
    from switch_emulator.switch import Switch

    backend = UdpBackend(("127.0.0.1", 0), engine="auto")
    try:
        sw = Switch(backend.send)
        backend.check_engine(sw)
        assert sw.control({"cmd": "status"})["engine"] == "native"
        faulty = Switch(backend.send, allow_faults=True)
        backend.check_engine(faulty)
        assert faulty.control({"cmd": "status"})["engine"] == "python"
    finally:
        backend.close()
