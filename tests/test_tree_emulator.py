"""Aggregation trees through real emulator processes (docs/trees.md), both engines.

Oracles: the state table of docs/trees.md, row by row, as forced datagram sequences (no chance):
every datagram each socket receives (exact header and words: the wrapped int32 sums), every
counter, and each cell's ``down`` bit; the python engine (switch_emulator/pipeline.py, the
reference) and the native one (switch_emulator/_dataplane.c) must give the same transcript byte
for byte.  Then whole jobs: W = 64 ranks over UDP in 8 leaves + 1 root (every scheme,
bit-identical to :func:`homagg.testing.local_allreduce`, the in-process one-switch job), and
W = 16 in 4 leaves with loss injected at every switch (ingress and every egress copy, up packets
included), still exact.
"""

from __future__ import annotations

import functools
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import switch_emulator
from homagg.testing import UdpTree, local_allreduce, run_tree_udp, sparse_tensors
from homagg.transport import ControlClient
from homagg.tree import plan_tree
from homagg.wire import FLAG_RESULT, FLAG_RETRANSMIT, datagram_len, pack_header_into
from switch_emulator import native
from switch_emulator.counters import Counters

needs_native = pytest.mark.skipif(not native.AVAILABLE,
                                  reason="the native engine was not built (no C compiler at install)")
ENGINES = ["python", pytest.param("native", marks=needs_native)]
SCHEMES = ("auto", "sketch", "compact", "dense")

K, TOKEN, JOB = 4, 0x7EE50042, 9
A0 = [2**31 - 1, -5, 7, 1 << 30]  # worker 0's words of use A (the sums wrap mod 2**32)
A1 = [1, -(2**31), 8, 1 << 30]
SIB = [3, 4, -15, -(1 << 29)]  # the sibling's (the root's other member's) words
B0, C0, C1 = [9, 9, 9, 9], [1, 2, 3, 4], [10, 20, 30, 40]

Addr = tuple[str, int]
Transcript = list[tuple[str, Any]]


def wsum(*words: list[int]) -> list[int]:
    """The switch's ADD: int32 words summed mod 2**32."""
    return np.sum(np.array(words, dtype=np.int64), axis=0).astype(np.uint32).astype(np.int32).tolist()


def dgram(flags: int, wid: int, words: list[int], *, slot: int = 0, bank: int = 0, tag: int = 1, off: int = 0,
          token: int = TOKEN, wc: int | None = None) -> bytes:
    """A datagram of job JOB (op ADD) carrying ``words``."""
    wc = len(words) if wc is None else wc
    buf = bytearray(datagram_len(wc))
    pack_header_into(buf, 0, flags, JOB, wid, wc, bank, slot, tag, off, token)
    buf[20:] = np.array((words + [0] * wc)[:wc], dtype=">i4").tobytes()
    return bytes(buf)


def up(flags: int, words: list[int], child_id: int, **kw: Any) -> bytes:
    """What a child sends its parent: its combined words as worker ``child_id``."""
    return dgram(flags, child_id, words, **kw)


def result(wid: int, words: list[int], **kw: Any) -> bytes:
    return dgram(FLAG_RESULT, wid, words, **kw)


class Bench:
    """Labelled loopback sockets (workers, a scripted parent, strangers) and the emulators under test."""

    def __init__(self, labels: list[str]) -> None:
        self.socks: dict[str, socket.socket] = {}
        for label in labels:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
            self.socks[label] = s
        self.ctls: dict[str, ControlClient] = {}
        self.rx: dict[str, int] = {}

    def addr(self, label: str) -> Addr:
        return self.socks[label].getsockname()

    def member(self, wid: int, label: str) -> dict[str, Any]:
        ip, port = self.addr(label)
        return {"worker_id": wid, "ip": ip, "port": port}

    def watch(self, name: str, sw: switch_emulator.RunningSwitch) -> ControlClient:
        self.ctls[name] = ControlClient(sw.control_addr, secret=sw.secret)
        self.rx[name] = 0
        return self.ctls[name]

    def step(self, sends: list[tuple[str, Addr, bytes]], rx: dict[str, int]) -> dict[str, list[bytes]]:
        """Send ``sends`` in order, wait until each switch counted ``rx[name]`` more datagrams in and
        its counters stopped moving; what every socket received meanwhile (empty lists left out)."""
        for label, dst, data in sends:
            self.socks[label].sendto(data, dst)
        for name, more in rx.items():
            self.rx[name] += more
            self._settle(name, self.rx[name])
        time.sleep(0.02)
        got = {label: self._drain(s) for label, s in self.socks.items()}
        return {k: v for k, v in got.items() if v}

    def counters(self, name: str) -> dict[str, int]:
        return self.ctls[name].status()["counters"]

    def _settle(self, name: str, rx: int) -> None:
        deadline = time.monotonic() + 10
        c = self.counters(name)
        while c["rx"] < rx and time.monotonic() < deadline:
            time.sleep(0.01)
            c = self.counters(name)
        assert c["rx"] == rx, f"{name} counted {c['rx']} datagrams in, expected {rx}"
        before = None
        while c != before and time.monotonic() < deadline:  # the python engine counts tx after rx
            time.sleep(0.02)
            before, c = c, self.counters(name)

    @staticmethod
    def _drain(s: socket.socket) -> list[bytes]:
        out = []
        while True:
            try:
                out.append(s.recv(65536))
            except BlockingIOError:
                return out

    def close(self) -> None:
        for c in self.ctls.values():
            c.close()
        for s in self.socks.values():
            s.close()


def served_by(ctl: ControlClient, want: str) -> str:
    """The switch's engine, waiting (bounded) for ``want``: a switch's status says ``python`` until
    its data thread starts serving with the engine it chose."""
    deadline = time.monotonic() + 10
    engine = ctl.status()["engine"]
    while engine != want and time.monotonic() < deadline:
        time.sleep(0.05)
        engine = ctl.status()["engine"]
    return str(engine)


def _expect(transcript: Transcript, what: str, got: Any, want: Any) -> None:
    transcript.append((what, got))
    assert got == want, f"{what}: got {got!r}, want {want!r}"


@functools.cache
def child_under_scripted_parent(engine: str) -> Transcript:
    """One child emulator (workers w0, w1; child id 3) whose parent is a socket of this test (P): every
    row of the state table at a child, including each way a result is refused."""
    t: Transcript = []
    b = Bench(["w0", "w1", "P", "X"])
    tree = wsum(A0, A1, SIB)  # the tree's result, as a parent would send it down
    try:
        with switch_emulator.spawn(engine=engine) as sw:
            ctl = b.watch("C", sw)
            ctl.admit(2, job_id=JOB, token=TOKEN, slot_base=0, n_slots=8, words_per_packet=K,
                      workers=[b.member(0, "w0"), b.member(1, "w1")], parent=b.addr("P"), child_id=3)
            assert served_by(ctl, engine) == engine
            C = sw.data_addr

            def step(what: str, sends: list[tuple[str, bytes]], want: dict[str, list[bytes]]) -> None:
                _expect(t, what, b.step([(label, C, d) for label, d in sends], {"C": len(sends)}), want)

            step("w0's contribution: combined, nothing sent", [("w0", dgram(0, 0, A0))], {})
            step("w1's completes the use at the child: up, not to the workers", [("w1", dgram(0, 1, A1))],
                 {"P": [up(0, wsum(A0, A1), 3)]})
            step("w0 retransmits, down = 0: up again, flagged", [("w0", dgram(FLAG_RETRANSMIT, 0, A0))],
                 {"P": [up(FLAG_RETRANSMIT, wsum(A0, A1), 3)]})
            step("a late unflagged copy: stale", [("w1", dgram(0, 1, A1))], {})
            step("a result from a stranger: drop_result_flag", [("X", result(3, tree))], {})
            step("a result from the parent with a forged token", [("P", result(3, tree, token=TOKEN ^ 1))], {})
            step("a result from the parent with K + 1 words", [("P", result(3, tree + [5]))], {})
            step("a result for a slot outside the job's", [("P", result(3, tree, slot=8))], {})
            step("a result for another use", [("P", result(3, tree, tag=2))], {})
            _expect(t, "down before the result", ctl.slot_status(JOB, 0)["banks"][0]["down"], False)
            step("the parent's result: down := 1, to every worker", [("P", result(3, tree))],
                 {"w0": [result(0, tree)], "w1": [result(1, tree)]})
            _expect(t, "down after the result", ctl.slot_status(JOB, 0)["banks"][0]["down"], True)
            step("the same result again: drop_stale_result", [("P", result(3, tree))], {})
            step("w1 retransmits, down = 1: answered from the cell (the tree's result)",
                 [("w1", dgram(FLAG_RETRANSMIT, 1, A1))], {"w1": [result(1, tree)]})
            step("a result for a use still in progress here: stale",
                 [("w0", dgram(0, 0, B0, slot=1, tag=2, off=4)), ("P", result(3, B0, slot=1, tag=2, off=4))], {})
            step("the bank's next use completes: up (FIRST cleared down)",
                 [("w0", dgram(0, 0, C0, tag=3, off=8)), ("w1", dgram(0, 1, C1, tag=3, off=8))],
                 {"P": [up(0, wsum(C0, C1), 3, tag=3, off=8)]})
            _expect(t, "down cleared by the next use", ctl.slot_status(JOB, 0)["banks"][0]["down"], False)
            step("w0 retransmits the new use: up again, flagged", [("w0", dgram(FLAG_RETRANSMIT, 0, C0, tag=3, off=8))],
                 {"P": [up(FLAG_RETRANSMIT, wsum(C0, C1), 3, tag=3, off=8)]})
            many = [[s * 1000 + w for w in range(K)] for s in range(8)]
            step("8 uses complete back to back: 8 up packets to the parent, in order (one GSO batch natively)",
                 [(f"w{w}", dgram(0, w, many[s], slot=s, bank=1, tag=10 + s, off=K * s)) for w in (0, 1)
                  for s in range(8)],
                 {"P": [up(0, wsum(m, m), 3, slot=s, bank=1, tag=10 + s, off=K * s) for s, m in enumerate(many)]})
            c = b.counters("C")
            _expect(t, "counters", {k: v for k, v in c.items() if v}, {
                "rx": 33, "tx": 15, "accepted": 21, "completed": 10, "up": 10, "retransmit_up": 2, "result_down": 1,
                "retransmit_answered": 1, "drop_stale": 1, "drop_result_flag": 1, "drop_token": 1,
                "drop_word_count": 1, "drop_slot_range": 1, "drop_stale_result": 3, "dropped": 8,
                "jobs_admitted": 1})
    finally:
        b.close()
    return t


@functools.cache
def root_and_child(engine: str) -> Transcript:
    """A root emulator R (members: the child C as worker 0, a sibling socket S as worker 1) and a
    child emulator C (workers w0, w1) of the same engine: up, a duplicate up counted once, the
    result down through the child, answers at both levels."""
    t: Transcript = []
    b = Bench(["w0", "w1", "S", "X"])
    tree = wsum(A0, A1, SIB)
    try:
        with switch_emulator.spawn(engine=engine) as root, switch_emulator.spawn(engine=engine) as child:
            rctl, cctl = b.watch("R", root), b.watch("C", child)
            R, C = root.data_addr, child.data_addr
            rctl.admit(2, job_id=JOB, token=TOKEN, slot_base=0, n_slots=2, words_per_packet=K,
                       workers=[{"worker_id": 0, "ip": C[0], "port": C[1]}, b.member(1, "S")])
            cctl.admit(2, job_id=JOB, token=TOKEN, slot_base=0, n_slots=2, words_per_packet=K,
                       workers=[b.member(0, "w0"), b.member(1, "w1")], parent=R, child_id=0)
            assert served_by(rctl, engine) == served_by(cctl, engine) == engine

            def step(what: str, sends: list[tuple[str, Addr, bytes]], rx: dict[str, int],
                     want: dict[str, list[bytes]]) -> None:
                _expect(t, what, b.step(sends, rx), want)

            step("w0, w1 complete the use at the child: up to the root, nothing to the workers",
                 [("w0", C, dgram(0, 0, A0)), ("w1", C, dgram(0, 1, A1))], {"C": 2, "R": 1}, {})
            step("w0 retransmits: the child sends up again, flagged; the root counts the child once",
                 [("w0", C, dgram(FLAG_RETRANSMIT, 0, A0))], {"C": 1, "R": 1}, {})
            _expect(t, "the root's cell", {k: v for k, v in rctl.slot_status(JOB, 0)["banks"][0].items()
                                           if k in ("bitmap", "count", "complete")},
                    {"bitmap": 1, "count": 1, "complete": False})
            step("results from a stranger, at the child and at the root: drop_result_flag",
                 [("X", C, result(0, tree)), ("X", R, result(0, tree))], {"C": 1, "R": 1}, {})
            step("the sibling completes the root: the result goes down through the child",
                 [("S", R, dgram(0, 1, SIB))], {"R": 1, "C": 1},
                 {"S": [result(1, tree)], "w0": [result(0, tree)], "w1": [result(1, tree)]})
            _expect(t, "the child's down", cctl.slot_status(JOB, 0)["banks"][0]["down"], True)
            step("w1 retransmits: the child answers from its cell", [("w1", C, dgram(FLAG_RETRANSMIT, 1, A1))],
                 {"C": 1}, {"w1": [result(1, tree)]})
            step("the sibling retransmits: the root answers", [("S", R, dgram(FLAG_RETRANSMIT, 1, SIB))],
                 {"R": 1}, {"S": [result(1, tree)]})
            nonzero = [{k: v for k, v in b.counters(n).items() if v and k != "jobs_admitted"} for n in ("R", "C")]
            _expect(t, "counters", nonzero, [
                {"rx": 5, "tx": 3, "accepted": 2, "completed": 1, "drop_duplicate": 1, "drop_result_flag": 1,
                 "retransmit_answered": 1, "dropped": 2},
                {"rx": 6, "tx": 5, "accepted": 2, "completed": 1, "up": 1, "retransmit_up": 1, "result_down": 1,
                 "retransmit_answered": 1, "drop_result_flag": 1, "dropped": 1}])
    finally:
        b.close()
    return t


@pytest.mark.parametrize("engine", ENGINES)
def test_child_state_table_rows(engine: str) -> None:
    assert child_under_scripted_parent(engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_root_and_child_emulators(engine: str) -> None:
    assert root_and_child(engine)


@needs_native
@pytest.mark.parametrize("scenario", [child_under_scripted_parent, root_and_child])
def test_engines_give_the_same_transcript(scenario: Any) -> None:
    assert scenario("native") == scenario("python")


def test_native_engine_keeps_every_counter_of_the_pipeline() -> None:
    """The C engine counts what pipeline.py counts, and a library built beside native.py loads (a
    build whose counters differ is stale: the python engine would serve in its place)."""
    assert set(native.COUNTER_NAMES) == set(Counters().snapshot()) - {"dropped", "drop_injected"}
    built = [p for p in Path(native.__file__).parent.glob("_dataplane*") if p.suffix in (".so", ".pyd")]
    if built:
        assert native.AVAILABLE, f"{built[0]} is stale (its counters differ): rebuild with pip install -e ."
        assert native._built_counters(native._LIB) == native.COUNTER_NAMES  # type: ignore[arg-type]


@needs_native
def test_a_stale_native_build_says_so(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A library whose counters differ from this version's is not used, and the log says why (before:
    the python engine served in silence, and the native tests skipped)."""
    monkeypatch.setattr(native, "COUNTER_NAMES", native.COUNTER_NAMES[:-1])
    with caplog.at_level("WARNING", logger="homagg.switch"):
        assert native._load() is None
    assert any("stale build" in r.getMessage() and "pip install -e ." in r.getMessage() for r in caplog.records)


def _tree_job(world: int, per_switch: int, numel: int, inputs_seed: int, schemes: tuple[str, ...],
              port_options: dict[str, Any] | None = None, **tree_options: Any) -> list[dict[str, int]]:
    """Every rank's tensor through a tree of emulator processes, each scheme checked bit-identical
    on every rank to the in-process one-switch job of the same inputs; the switches' counters."""
    xs = sparse_tensors(world, numel, 0.05, seed=inputs_seed)
    xs[1] = torch.randn(numel, generator=torch.Generator().manual_seed(inputs_seed))  # one dense rank
    plan = plan_tree(world, per_switch=per_switch)
    with UdpTree(plan, words_per_packet=64, n_slots=16, **tree_options) as tree:
        res = run_tree_udp(tree, xs, schemes, timeout=30, **(port_options or {}))
        status = tree.status()
    engine = tree_options.get("engine", "auto")
    assert engine == "auto" or {st["engine"] for st in status} == {engine}
    for scheme in schemes:
        ref = local_allreduce(xs, scheme)[0]
        bad = [r for r, got in enumerate(res[scheme]) if not torch.equal(got, ref)]
        assert not bad, f"{scheme}: ranks {bad} differ from the one-switch job"
    return [st["counters"] for st in status]


@pytest.mark.parametrize("engine", ENGINES)
def test_64_ranks_in_8_leaves_over_udp_bit_identical(engine: str) -> None:
    counters = _tree_job(64, 8, 3000, 7, SCHEMES, engine=engine)
    root, leaves = counters[0], counters[1:]
    assert len(leaves) == 8 and root["up"] == 0 and root["result_down"] == 0
    for c in leaves:  # every use the root completed went up from every leaf and came down to it
        assert c["completed"] == c["up"] == c["result_down"] == root["completed"] > 0


@pytest.mark.parametrize("drop", [0.01, 0.10])
def test_loss_at_every_switch_16_ranks_in_4_leaves_exact(drop: float) -> None:
    """Every switch drops ``drop`` of its ingress datagrams and of each copy it sends (results, up
    packets); the workers' timers recover every loss (a short RTO floor keeps it quick: 10% at each
    of six hops loses about half of a use's round trips)."""
    rto = {"rto": 0.05, "min_rto": 0.02, "max_rto": 0.2}
    counters = _tree_job(16, 4, 2000, 3, ("auto", "dense"), rto, engine="python", drop=drop, seed=int(drop * 100))
    assert sum(c["drop_injected"] for c in counters) > 0 and sum(c.get("drop_injected_egress", 0)
                                                                  for c in counters) > 0
    # each use went up from every leaf and came down to it once (later copies: drop_stale_result)
    assert all(c["completed"] == c["up"] == c["result_down"] == counters[0]["completed"] for c in counters[1:])
