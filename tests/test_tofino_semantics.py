"""The Tofino program's verdict registers, modelled register by register, against the emulator.

``p4/tofino/worker_bitmap.p4`` (the pair {missing, key}), ``use_key.p4`` (the pair {offset, key}
and its predicate) and ``counter.p4`` (the verdict table) are written here as the stateful ALUs
execute them: each register read and written once per packet, in pipeline order, every update a
function of the register's own value, the packet and what earlier registers returned.  Random
packet sequences (few tags, offsets and workers, so that keys collide, uses complete, poison and
restart) must give the emulator's verdicts (:mod:`switch_emulator.bitmap`) packet for packet and
the same completions.  This checks the design; the P4 source itself is checked by compiling it
(``tests/test_tofino.py``) and, for the v1model program, by the BMv2 differential test.

What is not retyped but read from the program, so that a change there breaks this test: the
constants (``POISON_OFFSET``, ``FLAG_RETRANSMIT``, ``VERDICT_*`` from ``p4/configuration.p4``;
``PRED_*``, ``PATH_*`` from ``p4/tofino/tofino_config.p4``), the use key's layout (the identity
hash in ``admission.p4``), the predicate's argument order (``use_key.p4``) and the verdict table
of ``counter.p4`` (its keys, its rows in order, the actions' verdict and path, the default
action), which the model evaluates as the ternary table it is (first matching row).
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

import pytest

from homagg.jobs import JobSpec, WorkerAddr
from homagg.p4.source import P4_DIR, header_fields, p4_constants, strip_comments
from switch_emulator import bitmap
from switch_emulator.state import JobState

CONST = {name: c.value for src in ("configuration.p4", "tofino/tofino_config.p4")
         for name, c in p4_constants(source=src).items()}
POISON = CONST["POISON_OFFSET"]
PRED_OTHER, PRED_OTHER_SAME_OFFSET, PRED_SAME_OTHER_OFFSET, PRED_SAME = (
    CONST[n] for n in ("PRED_OTHER", "PRED_OTHER_SAME_OFFSET", "PRED_SAME_OTHER_OFFSET", "PRED_SAME"))


def _source(name: str) -> str:
    return strip_comments((P4_DIR / "tofino" / name).read_text())


def _block(src: str, opening: str) -> str:
    """The text between the braces that follow the first match of regex ``opening``."""
    m = re.search(opening + r"\s*\{", src)
    assert m is not None, opening
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        i += 1
    return src[m.end():i - 1]


@lru_cache(maxsize=None)
def _value(text: str) -> int:
    """A table pattern's or action argument's value: constants, integers, casts, + and -, true/false."""
    text = re.sub(r"\(bit<\d+>\)", "", text).strip()
    text = re.sub(r"\b[A-Z_][A-Z0-9_]*\b", lambda m: str(CONST[m.group(0)]), text)
    text = re.sub(r"\btrue\b", "1", re.sub(r"\bfalse\b", "0", text))
    assert re.fullmatch(r"[\dx+\-a-fA-F ]+", text), text
    return int(eval(text, {"__builtins__": {}}))  # noqa: S307 -- digits, + and - only (checked above)


def _matches(pattern: str, v: int) -> bool:
    """Whether ``v`` matches a const entry's pattern: ``_``, ``value &&& mask``, ``lo .. hi`` or a value."""
    pattern = pattern.strip()
    if pattern == "_":
        return True
    if "&&&" in pattern:
        value, mask = (_value(t) for t in pattern.split("&&&"))
        return v & mask == value & mask
    if ".." in pattern:
        lo, hi = (_value(t) for t in pattern.split(".."))
        return lo <= v <= hi
    return v == _value(pattern)


class VerdictTable:
    """``counter.p4``'s ``verdict`` table, read from the source: keys, rows (first match wins),
    default action, and per action the verdict and path it sets."""

    def __init__(self) -> None:
        src = _source("counter.p4")
        table = _block(src, r"\btable\s+verdict")
        self.keys = re.findall(r"([\w.]+)\s*:\s*ternary\s*;", _block(table, r"\bkey\s*="))
        self.rows = [([p for p in pats.split(",")], act) for pats, act in
                     re.findall(r"\(([^()]*)\)\s*:\s*(\w+)\(\)\s*;", _block(table, r"\bconst\s+entries\s*="))]
        default = re.search(r"const\s+default_action\s*=\s*(\w+)\(\)\s*;", table)
        assert default is not None
        self.default = default.group(1)
        self.actions: dict[str, tuple[int, int]] = {}
        #: per action its statements' text (trees: which down RegisterAction it executes)
        self.bodies: dict[str, str] = {}
        for name, body in re.findall(r"\baction\s+(\w+)\(\)\s*\{([^}]*)\}", src):
            self.bodies[name] = body
            verdict = re.search(r"meta\.verdict\s*=\s*(VERDICT_\w+)\s*;", body)
            path = re.search(r"meta\.path\s*=\s*(PATH_\w+)\s*;", body)
            assert verdict and path, name
            self.actions[name] = (CONST[verdict.group(1)], CONST[path.group(1)])
        assert all(len(pats) == len(self.keys) for pats, _ in self.rows)

    def action(self, key: dict[str, int]) -> str:
        """The action of the first row matching ``key`` (by key name), else the default."""
        values = [key[k] for k in self.keys]
        for pats, act in self.rows:
            if all(_matches(p, v) for p, v in zip(pats, values, strict=True)):
                return act
        return self.default

    def __call__(self, key: dict[str, int]) -> tuple[int, int]:
        """(verdict, path) of the first row matching ``key`` (by key name), else the default's."""
        return self.actions[self.action(key)]


def _use_key_layout() -> list[int]:
    """Bit widths of the use key's parts, most significant first (``admission.p4``'s identity hash)."""
    m = re.search(r"meta\.key_rest\s*=\s*use_key_of\.get\(\{([^}]*)\}\)", _source("admission.p4"))
    assert m is not None
    fields = dict(header_fields("homagg_t"))
    widths = []
    for part in m.group(1).split(","):
        part = part.strip()
        cast, sl = re.match(r"\(bit<(\d+)>\)|(\d+)w\d+$", part), re.search(r"\[(\d+):(\d+)\]$", part)
        if cast:
            widths.append(int(cast.group(1) or cast.group(2)))
        elif sl:
            widths.append(int(sl.group(1)) - int(sl.group(2)) + 1)
        else:
            widths.append(fields[part.removeprefix("hdr.homagg.")])
    return widths


VERDICT = VerdictTable()
KEY_WIDTHS = _use_key_layout()


def use_key(tag: int, op: int, wc: int) -> int:
    """meta.key_rest: tag ++ op ++ word_count, each cut to its width in the hash's input."""
    key = 0
    for value, width in zip((tag, op, wc), KEY_WIDTHS, strict=True):
        key = key << width | (value & ((1 << width) - 1))
    return key


def test_read_from_the_program() -> None:
    """What the model reads: the table's keys, the predicate's order and the key's width."""
    assert VERDICT.keys == ["meta.missing", "meta.use_pred", "meta.unseen", "meta.offset_max", "hdr.homagg.flags"]
    assert sum(KEY_WIDTHS) == 32  # one 32-bit half of each register pair
    preds = re.findall(r"this\.predicate\(\s*value\.(\w+)\s*==[^,]*,\s*value\.(\w+)\s*==", _source("use_key.p4"))
    assert preds == [("offset", "key")] * 3  # pred = 1 << (offset equal + 2 * key equal); trees: peek
    assert {PRED_OTHER, PRED_OTHER_SAME_OFFSET, PRED_SAME_OTHER_OFFSET, PRED_SAME} == {1, 2, 4, 8}


class TofinoCell:
    """One cell's registers: worker_bitmap.p4's use_state and use_key.p4's use_offset."""

    def __init__(self) -> None:
        self.missing, self.key = 0, 0  # cleared by the controller at admission
        self.offset, self.key2 = 0, 0

    def packet(self, world: int, w: int, tag: int, offset: int, op: int, wc: int, retx: bool) -> tuple[int, bool]:
        mine = 1 << w
        others = ((1 << world) - 1) & ~mine  # admitted_job's action parameter
        key = use_key(tag, op, wc)  # admission.p4: meta.key_rest
        # stage 1: worker_bitmap.p4 mark_cell
        old = self.missing
        if self.key == key:
            self.missing &= others
        elif self.missing == 0:
            self.missing, self.key = others, key
        # stage 2: use_key.p4 at_done / in_progress, and the two ALU results
        pred = 1 << (int(self.offset == offset) + 2 * int(self.key2 == key))
        if old == 0:
            if self.key2 != key:
                self.offset, self.key2 = offset, key
        elif self.key2 == key and self.offset != offset:
            self.offset = POISON
        unseen, left, offset_max = old & mine, old & others, offset == POISON
        # stage 3: counter.p4's verdict table (read from the source) and completion
        verdict, path = VERDICT({"meta.missing": old, "meta.use_pred": pred, "meta.unseen": unseen,
                                 "meta.offset_max": int(offset_max),
                                 "hdr.homagg.flags": CONST["FLAG_RETRANSMIT"] if retx else 0})
        complete = {CONST["PATH_FIRST"]: others == 0, CONST["PATH_ADD"]: left == 0,
                    CONST["PATH_READ"]: True}.get(path, False)
        return verdict, complete


def _emulator(job: JobState, i: int, w: int, tag: int, offset: int, op: int, wc: int, retx: bool) -> tuple[int, bool]:
    key = (tag, offset, op, wc)
    verdict = bitmap.check(job, i, w, key, retx)
    bitmap.update(job, i, w, key)
    complete = verdict == bitmap.ANSWER or (verdict <= bitmap.ADD and job.count[i] == job.spec.world_size)
    return verdict, complete


@pytest.mark.parametrize("seed", range(40))
def test_tofino_registers_give_the_emulator_verdicts(seed: int) -> None:
    rng = random.Random(seed)
    world = rng.choice([1, 2, 3, 5, 8, 32])
    spec = JobSpec(1, world, slot_base=0, n_slots=1, words_per_packet=32,
                   workers=tuple(WorkerAddr(w, "10.0.0.1", 1000 + w) for w in range(world)))
    job = JobState(spec)
    cells = [TofinoCell(), TofinoCell()]
    seen_verdicts = set()
    cur, nxt = [0, 0], [0, 0]  # per bank: the tag most packets carry, the worker sending next
    for n in range(4000):
        bank = rng.randrange(2)
        if rng.random() < 0.7:
            w, nxt[bank] = nxt[bank], (nxt[bank] + 1) % world
        else:
            w = rng.randrange(world)
        if rng.random() < 0.1 / world:
            cur[bank] = rng.choice([0, 1, 2, 3, 0xFFFF])
        tag = cur[bank] if rng.random() < 0.9 else rng.choice([0, 1, 2, 3, 0xFFFF])
        offset = rng.choice([8, POISON]) if rng.random() < 0.1 / world else 0
        op, wc = (0, 4) if rng.random() < 0.95 else rng.choice([(1, 4), (0, 3)])
        retx = rng.random() < 0.3
        want = _emulator(job, bank, w, tag, offset, op, wc, retx)
        got = cells[bank].packet(world, w, tag, offset, op, wc, retx)
        assert got == want, (seed, n, w, bank, tag, offset, op, wc, retx)
        seen_verdicts.add(want[0])
    if world <= 8:  # 32 workers rarely all reach one use of a random sequence: agreement only
        assert seen_verdicts >= {bitmap.FIRST, bitmap.DUPLICATE} | (
            {bitmap.ADD, bitmap.CONFLICT} if world > 1 else set())
        assert seen_verdicts & {bitmap.ANSWER, bitmap.STALE}
