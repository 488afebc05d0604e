"""The Tofino program's child role (docs/trees.md), modelled register by register, against the emulator.

A switch that is a *child* for a job sends each completed use up to its parent, answers a
retransmission from its cell only once the parent's result came down (the per-cell ``down`` bit,
else it sends the use up again, flagged), and takes a result from its parent into its cells when it
is for the cell's current, complete, waiting use.  The reference is the emulator's pipeline
(:class:`switch_emulator.pipeline.Pipeline`, ``_result_down``): random sequences of members'
packets and of the parent's results (right and wrong source, token, word count, slot, use;
duplicates; retransmissions) must give, packet for packet, the same outcome -- dropped (and why),
absorbed, sent up (flags, words), answered (words) or multicast (words) -- from the model as from
the emulator.

Read from the program, so that changing one row or action there fails this test (the register
model of ``tests/test_tofino_semantics.py`` is extended, not copied): ``worker_bitmap.p4``'s
``admit_and_mark`` rows (the drop reason of a result from the parent, peek or mark), ``use_key.p4``'s
``offset_check`` rows (which RegisterAction a result takes), ``counter.p4``'s verdict rows and, per
action, which ``down`` RegisterAction it executes into which field, and those RegisterActions'
bodies (clear, read, test-and-set), and ``combine.p4``'s ``combine`` rows (keyed on path, first and
op: a result taken is written, one not taken leaves the cells alone).  Retyped here: the stateful
ALUs of the two register pairs and of the words (as in the root's model) and replicate.p4's
if-chain.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import numpy as np
import pytest

from homagg.jobs import JobSpec, WorkerAddr
from homagg.wire import FLAG_RESULT, FLAG_RETRANSMIT, HOMAGG_UDP_PORT, datagram_len, pack_header_into, unpack_header
from switch_emulator.admission import AdmissionTable
from switch_emulator.pipeline import Pipeline

from .test_tofino_semantics import CONST, POISON, VERDICT, _block, _matches, _source, _value, use_key

PARENT = ("10.9.0.1", HOMAGG_UDP_PORT)
JOB, TOKEN, CHILD_ID, SLOT_BASE, WORDS = 7, 0x5EED, 5, 4, 4
DROP_NAMES = {v: k.removeprefix("DROP_").lower() for k, v in CONST.items() if k.startswith("DROP_")}


class Table:
    """A const-entries table of ``file`` (first matching row wins), its rows ``(patterns, action,
    argument text)`` with ``#define``d row macros expanded."""

    def __init__(self, file: str, name: str) -> None:
        src = _source(file).replace("\\\n", " ")
        macros = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"#define\s+(\w+)\((\w+)\)(.*)", src)}
        table = _block(src, rf"\btable\s+{name}")
        self.keys = [k.strip() for k in re.findall(r"([\w.()]+)\s*:\s*(?:ternary|exact|range)\s*;",
                                                   _block(table, r"\bkey\s*="))]
        entries = _block(table, r"\bconst\s+entries\s*=")
        for macro, (param, body) in macros.items():
            entries = re.sub(rf"\b{macro}\((\w+)\)", lambda m, b=body, p=param: re.sub(rf"\b{p}\b", m.group(1), b),
                             entries)
        self.rows = []
        for m in re.finditer(r"\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*:\s*(\w+)\((.*?)\)\s*;", entries):
            pats = [p for p in m.group(1).split(",")]
            assert len(pats) == len(self.keys), (name, m.group(0))
            self.rows.append((pats, m.group(2), m.group(3)))
        assert self.rows, name

    def __call__(self, key: dict[str, int]) -> tuple[str, str]:
        values = [key[k] for k in self.keys]
        for pats, act, arg in self.rows:
            if all(_matches(p, v) for p, v in zip(pats, values, strict=True)):
                return act, arg
        raise AssertionError(f"no row for {key}")


def _down_actions() -> dict[str, list[tuple[str, str]]]:
    """counter.p4's RegisterActions on ``down``: name -> statements (target, expression)."""
    src = _source("counter.p4")
    out = {}
    for m in re.finditer(r"RegisterAction<[^=]*?>\(down\)\s+(\w+)\s*=", src):
        body = _block(src[m.start():], r"void\s+apply\([^)]*\)")
        out[m.group(1)] = re.findall(r"(\w+)\s*=\s*([^;]+);", body)
    return out


ADMIT = Table("worker_bitmap.p4", "admit_and_mark")
OFFSET_CHECK = Table("use_key.p4", "offset_check")
COMBINE = Table("combine.p4", "combine")
DOWN = _down_actions()


def _down_access(action: str) -> tuple[str, str] | None:
    """(meta field or '', RegisterAction) the verdict's ``action`` executes on ``down``, if any."""
    m = re.search(r"(?:meta\.(\w+)\s*=\s*)?(\w+)\.execute\(meta\.cell\)", VERDICT.bodies[action])
    return None if m is None else (m.group(1) or "", m.group(2))


def _run_down(name: str, value: int) -> tuple[int, int | None]:
    """One 1-bit stateful ALU access: (new value, output)."""
    env: dict[str, int | None] = {"value": value, "rv": None}
    for target, expr in DOWN[name]:
        expr = expr.strip()
        env[target] = (1 - env["value"]) if expr == "~value" else env["value"] if expr == "value" else _value(expr)
    return env["value"], env["rv"]


def test_read_from_the_program() -> None:
    """The child role's rows and actions the model reads are there, in the roles the spec gives them."""
    assert set(DOWN) == {"clear_down", "read_down", "take_down"}
    assert _run_down("clear_down", 1) == (0, None)
    assert [_run_down("read_down", v) for v in (0, 1)] == [(0, 0), (1, 1)]
    assert [_run_down("take_down", v) for v in (0, 1)] == [(1, 1), (1, 0)]  # taken only when down was 0
    assert {a: _down_access(a) for a in VERDICT.actions if _down_access(a)} == {
        "first": ("", "clear_down"), "answer": ("down", "read_down"), "result_down": ("first", "take_down")}
    assert ADMIT.keys[-2:] == ["meta.parent_known", "meta.parent_token_ok"]
    assert OFFSET_CHECK.keys == ["hdr.homagg.flags", "meta.missing"]
    assert COMBINE.keys == ["path", "first", "op"]


@dataclass
class Packet:
    src: tuple[str, int]
    flags: int
    worker: int
    slot: int
    bank: int
    tag: int
    offset: int
    wc: int
    token: int
    words: list[int]
    job: int = JOB
    op: int = 0


class TofinoChild:
    """One child job's cells as the Tofino program keeps them: use_state, use_offset, down, words."""

    def __init__(self, world: int, workers: dict[tuple[str, int], int]) -> None:
        self.world, self.workers = world, workers
        n = 2 * 2  # two slots, two banks
        self.missing, self.key, self.offset, self.key2 = [0] * n, [0] * n, [0] * n, [0] * n
        self.down = [0] * n
        self.words = np.zeros((n, 32), dtype=np.int64)

    def packet(self, p: Packet) -> tuple:
        worker = self.workers.get(p.src)
        job_ok = int(worker is not None and p.job == JOB and p.worker == worker)
        parent_known = int(p.src == PARENT and p.job == JOB)
        lookups = {
            "hdr.homagg.isValid()": 1, "hdr.udp.length": 8 + 20 + 4 * p.wc, "hdr.homagg.version": 2,
            "hdr.homagg.op": p.op, "hdr.homagg.word_count": p.wc, "parser_err": 0, "meta.length_ok": 1,
            "hdr.homagg.flags": p.flags, "meta.source_known": int(worker is not None), "meta.job_ok": job_ok,
            "meta.token_ok": int(job_ok and p.token == TOKEN), "meta.words_ok": int(1 <= p.wc <= WORDS),
            "meta.in_range": int(SLOT_BASE <= p.slot < SLOT_BASE + 2), "meta.parent_known": parent_known,
            "meta.parent_token_ok": int(parent_known and p.token == TOKEN)}
        act, arg = ADMIT(lookups)
        if act == "reject":
            return ("drop", DROP_NAMES[_value(arg)])
        i = 2 * (p.slot - SLOT_BASE) + p.bank
        key = use_key(p.tag, p.op, p.wc)
        mine = 0 if worker is None else 1 << worker
        others = ((1 << self.world) - 1) & ~mine
        # stage 1: worker_bitmap.p4
        old = self.missing[i]
        if act == "mark":
            if self.key[i] == key:
                self.missing[i] &= others
            elif old == 0:
                self.missing[i], self.key[i] = others, key
        else:
            assert act == "peek", act
        # stage 2: use_key.p4
        pred = 1 << (int(self.offset[i] == p.offset) + 2 * int(self.key2[i] == key))
        which, _ = OFFSET_CHECK({"hdr.homagg.flags": p.flags, "meta.missing": old})
        unseen = left = 0
        if which == "done":
            if self.key2[i] != key:
                self.offset[i], self.key2[i] = p.offset, key
        elif which == "open":
            if self.key2[i] == key and self.offset[i] != p.offset:
                self.offset[i] = POISON
        if which in ("done", "open"):
            unseen, left = old & mine, old & others
        # stage 3: counter.p4's verdict and the down bit
        action = VERDICT.action({"meta.missing": old, "meta.use_pred": pred, "meta.unseen": unseen,
                                 "meta.offset_max": int(p.offset == POISON), "hdr.homagg.flags": p.flags})
        verdict, path = VERDICT.actions[action]
        meta = {"first": int(re.search(r"meta\.first\s*=\s*1\s*;", VERDICT.bodies[action]) is not None), "down": 0}
        access = _down_access(action)
        if access is not None:
            self.down[i], out = _run_down(access[1], self.down[i])
            if access[0]:
                meta[access[0]] = out
        complete = {CONST["PATH_FIRST"]: others == 0, CONST["PATH_ADD"]: left == 0,
                    CONST["PATH_READ"]: True}.get(path, False)
        # words: combine.p4 (the RegisterActions retyped), the packet carries what they return
        words = list(p.words)
        for k in range(p.wc):
            try:
                do, _ = COMBINE({"path": path, "first": meta["first"], "op": p.op})
            except AssertionError:
                do = "NoAction"  # the const default
            cell = int(self.words[i, k])
            if do == "do_add":
                cell = words[k] if meta["first"] else (cell + words[k]) & 0xFFFFFFFF
            elif do != "NoAction":
                assert do == "do_read", do  # op ADD only in these sequences
            if do != "NoAction":
                self.words[i, k], words[k] = cell, cell
        # replicate.p4 (retyped)
        if verdict in (CONST["VERDICT_FIRST"], CONST["VERDICT_ADD"]):
            return ("up", 0, tuple(words[:p.wc])) if complete else ("consumed",)
        if verdict == CONST["VERDICT_ANSWER"]:
            if meta["down"] == 0:
                return ("up", FLAG_RETRANSMIT, tuple(words[:p.wc]))
            return ("answer", worker, tuple(words[:p.wc]))
        if verdict == CONST["VERDICT_RESULT_DOWN"] and meta["first"] == 1:
            return ("multicast", tuple(words[:p.wc]))
        if verdict in (CONST["VERDICT_RESULT_DOWN"], CONST["VERDICT_STALE_RESULT"]):
            return ("drop", "stale_result")
        return ("drop", {CONST["VERDICT_DUPLICATE"]: "duplicate", CONST["VERDICT_STALE"]: "stale"}.get(verdict, "conflict"))


class EmulatorChild:
    """The same child job in the emulator's pipeline; what it did with each datagram."""

    def __init__(self, world: int, workers: tuple[WorkerAddr, ...]) -> None:
        spec = JobSpec(JOB, world, SLOT_BASE, 2, WORDS, workers, token=TOKEN, parent=PARENT, child_id=CHILD_ID)
        table = AdmissionTable(64)
        table.admit(spec)
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.pipe = Pipeline(table, lambda d, dst: self.sent.append((bytes(d), dst)))
        self.world = world

    def packet(self, p: Packet) -> tuple:
        buf = bytearray(datagram_len(p.wc))
        pack_header_into(buf, p.op, p.flags, p.job, p.worker, p.wc, p.bank, p.slot, p.tag, p.offset, p.token)
        buf[20:] = np.array(p.words[:p.wc], dtype=np.uint32).astype(">u4").tobytes()
        before = dict(self.pipe.counters.snapshot())
        self.sent.clear()
        self.pipe.process(buf, len(buf), p.src)
        delta = {k: v - before.get(k, 0) for k, v in self.pipe.counters.snapshot().items() if v != before.get(k, 0)}
        drops = [k.removeprefix("drop_") for k in delta if k.startswith("drop_")]
        if drops:
            assert not self.sent
            return ("drop", drops[0])
        words = [tuple(np.frombuffer(d[20:], dtype=">u4").tolist()) for d, _ in self.sent]
        heads = [unpack_header(d) for d, _ in self.sent]
        if delta.get("up") or delta.get("retransmit_up"):
            assert [dst for _, dst in self.sent] == [PARENT] and heads[0][4] == CHILD_ID
            return ("up", heads[0][2], words[0])
        if delta.get("retransmit_answered"):
            assert len(self.sent) == 1 and heads[0][2] == FLAG_RESULT
            return ("answer", p.worker, words[0])
        if delta.get("result_down"):
            assert sorted(h[4] for h in heads) == list(range(self.world)) and len(set(words)) == 1
            return ("multicast", words[0])
        assert delta.get("accepted") == 1 and not self.sent, delta
        return ("consumed",)


def _sequence(rng: random.Random, world: int, workers: list[tuple[str, int]], n: int):
    """Members' contributions, retransmissions and late copies; the parent's results for the
    current use of a bank, another use, duplicates; wrong sources, tokens, counts and slots."""
    tag = {(s, b): 1 for s in (0, 1) for b in (0, 1)}
    for _ in range(n):
        s, b = rng.randrange(2), rng.randrange(2)
        if rng.random() < 0.08:
            tag[s, b] = (tag[s, b] + 1) % 4
        t = tag[s, b] if rng.random() < 0.9 else rng.randrange(4)
        slot, wc = SLOT_BASE + s, 4 if rng.random() < 0.95 else rng.choice([3, 5])
        offset = 0 if rng.random() < 0.97 else rng.choice([8, POISON])
        words = [rng.randrange(1 << 32) for _ in range(wc)]
        r = rng.random()
        if r < 0.3:  # a result from (mostly) the parent
            src = PARENT if rng.random() < 0.9 else rng.choice([("10.9.0.2", HOMAGG_UDP_PORT), workers[0]])
            token = TOKEN if rng.random() < 0.93 else TOKEN ^ 1
            job = JOB if rng.random() < 0.97 else JOB + 1
            if rng.random() < 0.03:
                slot = SLOT_BASE + 7
            yield Packet(src, FLAG_RESULT, CHILD_ID, slot, b, t, offset, wc, token, words, job)
        else:  # a member's packet (now and then from the parent's address, unflagged)
            w = rng.randrange(world)
            src = workers[w] if rng.random() < 0.98 else PARENT
            flags = FLAG_RETRANSMIT if rng.random() < 0.35 else 0
            token = TOKEN if rng.random() < 0.98 else TOKEN ^ 2
            yield Packet(src, flags, w, slot, b, t, offset, wc, token, words)


@pytest.mark.parametrize("seed", range(30))
def test_child_role_gives_the_emulators_outcomes(seed: int) -> None:
    rng = random.Random(seed)
    world = rng.choice([1, 2, 3, 4])
    addrs = [(f"10.0.0.{w + 1}", 18500 + w) for w in range(world)]
    model = TofinoChild(world, {a: w for w, a in enumerate(addrs)})
    emulator = EmulatorChild(world, tuple(WorkerAddr(w, *a) for w, a in enumerate(addrs)))
    seen = set()
    for n, p in enumerate(_sequence(rng, world, addrs, 3000)):
        want = emulator.packet(p)
        got = model.packet(p)
        assert got == want, (seed, n, p)
        seen.add(want[0] if want[0] != "up" else ("up", want[1]))
        if want[0] == "drop":
            seen.add(want)
    assert {("up", 0), ("up", FLAG_RETRANSMIT), "answer", "multicast", ("drop", "stale_result"),
            ("drop", "result_flag")} <= seen, seen
