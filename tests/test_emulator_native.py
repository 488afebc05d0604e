"""The emulator's native engine (switch_emulator/_dataplane.c) against the Python pipeline.

Oracle: the python engine (switch_emulator/pipeline.py, itself checked against BMv2 in
tests/test_p4_bmv2.py).  The differential sequence of tests/test_p4_bmv2.py -- two jobs, bank
flips, partial packets, wrapping ADD, OR, signed MAX, duplicates, retransmissions answered from
the shadow copy, stale copies, forged tokens, a conflict, unknown sources and every malformed
kind -- goes through a real emulator of each engine over loopback sockets (one socket per worker
source); every result datagram (per destination, in order) and every counter must be equal.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import pytest
import torch

import switch_emulator
from homagg import ConfigError
from homagg.jobs import WorkerAddr
from homagg.transport import ControlClient
from switch_emulator import native
from tests.test_p4_bmv2 import jobs, worker_sequence

from homagg.testing import run_on_switch

pytestmark = pytest.mark.skipif(not native.AVAILABLE,
                                reason="the native engine was not built (no C compiler at install)")


def _run(engine: str, seq: list[tuple[tuple[str, int], bytes]]) -> tuple[dict, dict]:
    sources = sorted({src for src, _ in seq})
    socks = {}
    for src in sources:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.setblocking(False)
        socks[src] = s
    real = {src: s.getsockname() for src, s in socks.items()}
    try:
        with switch_emulator.start(engine=engine) as sw:
            for j in jobs():
                workers = tuple(WorkerAddr(w.worker_id, *real[w.addr]) for w in j.workers)
                sw.switch.admit(replace(j, workers=workers), "test")
            with ControlClient(sw.control_addr) as ctl:
                assert ctl.status()["engine"] == engine
                for src, dg in seq:
                    socks[src].sendto(dg, sw.data_addr)
                deadline = time.monotonic() + 20
                while ctl.status()["counters"]["rx"] < len(seq) and time.monotonic() < deadline:
                    time.sleep(0.05)
                counters = ctl.status()["counters"]
                slots = [ctl.slot_status(j.job_id, j.slot_base + s) for j in jobs() for s in range(j.n_slots)]
        time.sleep(0.1)
        results = {}
        for src, s in socks.items():
            got = []
            while True:
                try:
                    got.append(s.recv(65536))
                except BlockingIOError:
                    break
            results[src] = got
    finally:
        for s in socks.values():
            s.close()
    return results, {"counters": counters, "slots": slots}


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


def test_native_engine_end_to_end_every_scheme_exact() -> None:
    """4 worker processes, every scheme, against a native-engine child: each result is checked
    against the in-process switch's by run_on_switch (which raises otherwise)."""
    with switch_emulator.spawn(engine="native") as sw:
        results = run_on_switch(sw, 4, numel=30000, k=2238, slots=16)
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            st = ctl.status()
    assert st["engine"] == "native" and st["counters"]["completed"] > 0
    assert len(results) == 4  # run_on_switch raised had any scheme's result not been exact


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
