"""Result multicast: one send per completed slot to the job's group for subscribed workers,
unicast for the others and for answers to retransmissions; results stay exact."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

import switch_emulator
from homagg import wire
from homagg.jobs import JobSpec, WorkerAddr
from homagg.testing import check_combine
from homagg.transport import CombineOp, ControlClient, UdpSwitchPort
from switch_emulator import Switch

A = [("10.0.0.1", 5000 + w) for w in range(3)]
GROUP = ("239.255.0.7", 9999)


def _switch() -> tuple[Switch, list[tuple[bytes, tuple[str, int]]]]:
    sent: list[tuple[bytes, tuple[str, int]]] = []
    sw = Switch(lambda d, a: sent.append((bytes(d), a)), pool_slots=16)
    sw.admission.admit(JobSpec(7, 3, 0, 4, 8, tuple(WorkerAddr(w, *A[w]) for w in range(3))))
    return sw, sent


def _send(sw: Switch, w: int, words: list[int], flags: int = 0) -> None:
    pkt = wire.pack_packet(wire.Header(wire.VERSION, wire.OP_ADD, flags, 7, w, len(words), 0, 2, 5, 40), words)
    sw.ingress(pkt, len(pkt), A[w])


def test_group_for_subscribed_unicast_for_the_rest_and_for_answers() -> None:
    sw, sent = _switch()
    assert sw.control({"cmd": "group", "job_id": 7}) == {"ok": True, "group": None}  # backend offers none
    assert not sw.control({"cmd": "subscribe", "job_id": 7, "worker_id": 0})["ok"]
    sw.group_for = lambda job_id: GROUP
    assert sw.control({"cmd": "group", "job_id": 7})["group"] == list(GROUP)
    for w in (0, 1):
        sw.control({"cmd": "subscribe", "job_id": 7, "worker_id": w})
    for w, words in enumerate(([1, 2], [10, 20], [100, 200])):
        _send(sw, w, words)
    got = [(wire.parse_packet(d), a) for d, a in sent]
    assert [a for _, a in got] == [GROUP, A[2]]  # one send for workers 0 and 1, one unicast
    for (h, words), a in got:
        assert words.tolist() == [111, 222] and h.flags == wire.FLAG_RESULT
        assert (h.slot, h.bank, h.tag, h.offset) == (2, 0, 5, 40)
        assert h.worker_id == (0 if a == GROUP else 2)  # group copies are not rewritten per worker
    assert sw.counters["tx"] == 2
    sent.clear()
    _send(sw, 1, [10, 20], wire.FLAG_RETRANSMIT)  # answer to a retransmission: unicast, as ever
    ((h, words), a), = [(wire.parse_packet(d), a) for d, a in sent]
    assert a == A[1] and h.worker_id == 1 and words.tolist() == [111, 222]


def test_registering_again_unsubscribes_and_off_removes() -> None:
    sw, _ = _switch()
    sw.group_for = lambda job_id: GROUP
    sw.control({"cmd": "group", "job_id": 7})
    assert sw.control({"cmd": "subscribe", "job_id": 7, "worker_id": 2})["subscribed"] == [2]
    assert sw.control({"cmd": "subscribe", "job_id": 7, "worker_id": 0})["subscribed"] == [0, 2]
    sw.control({"cmd": "register", "job_id": 7, "worker_id": 2, "ip": "10.0.0.9", "port": 1})
    assert sw.control({"cmd": "subscribe", "job_id": 7, "worker_id": 0, "on": False})["subscribed"] == []


def _rounds(ports: list[UdpSwitchPort], rounds: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ops = [CombineOp.ADD, CombineOp.OR, CombineOp.MAX]
    w = len(ports)
    for _ in range(rounds):
        data = [[torch.from_numpy(rng.integers(-(2**31), 2**31, 37, dtype=np.int64).astype(np.int32)) for _ in ops]
                for _ in range(w)]
        check_combine(ports, data, ops)


def _settled(ctl: ControlClient, ok: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """Switch counters once ``ok`` holds (bounded): the emulator counts a send after it returns, so a
    worker may hold its last result a moment before ``tx`` includes it."""
    deadline = time.monotonic() + 10.0
    c = ctl.status()["counters"]
    while not ok(c) and time.monotonic() < deadline:
        time.sleep(0.05)
        c = ctl.status()["counters"]
    return c


def _tx_ok(sends_per_result: int) -> Callable[[dict[str, int]], bool]:
    return lambda c: c["tx"] == sends_per_result * c["completed"] + c["retransmit_answered"]


def test_loopback_emulator_sends_each_result_once_to_subscribed_workers() -> None:
    with switch_emulator.start() as sw:
        ctl = ControlClient(sw.control_addr)
        job = ctl.admit(3, n_slots=4, words_per_packet=10)
        ports = [UdpSwitchPort(sw.data_addr, job=job, rank=r, control=sw.control_addr, timeout=20,
                               multicast=r != 2) for r in range(3)]
        try:
            assert [p.multicast for p in ports] == [True, True, False]
            _rounds(ports, 5, seed=3)
            c = _settled(ctl, _tx_ok(2))  # one group send + worker 2's unicast per result
            assert c["completed"] == 5 * 3 * 4  # 37 words in 4 chunks of <= 10, 3 streams
            assert _tx_ok(2)(c), c
            assert sum(p.stats["results"] for p in ports) == 3 * c["completed"]
            # worker 0 was in the group when worker 1 probed it: that probe is no stray datagram
            assert [p.stats["ignored"] for p in ports] == [0, 0, 0]
            assert [p.stats["group_probes"] for p in ports] == [1, 0, 0]
        finally:
            for p in ports:
                p.close()
            ctl.remove(job.job_id)


def test_group_that_does_not_deliver_falls_back_to_unicast() -> None:
    """A probe that never arrives (multicast not delivered on this host) leaves the worker on unicast."""
    with switch_emulator.start() as sw:
        assert sw.switch is not None
        sw.switch._cmd_probe = lambda req: {}  # type: ignore[method-assign]  # the probe is "lost"
        ctl = ControlClient(sw.control_addr)
        job = ctl.admit(2, n_slots=2, words_per_packet=10)
        ports = [UdpSwitchPort(sw.data_addr, job=job, rank=r, control=sw.control_addr, timeout=20) for r in range(2)]
        try:
            assert [p.multicast for p in ports] == [False, False]
            assert sw.switch.admission.jobs[job.job_id].subscribed == 0
            _rounds(ports, 2, seed=4)
            c = _settled(ctl, _tx_ok(2))  # one unicast per worker and result
            assert _tx_ok(2)(c), c
        finally:
            for p in ports:
                p.close()
            ctl.remove(job.job_id)
