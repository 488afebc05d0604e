"""The Tofino program's verdict registers, modelled register by register, against the emulator.

``p4/tofino/worker_bitmap.p4`` (the pair {missing, key}), ``use_key.p4`` (the pair {offset, key}
and its predicate) and ``counter.p4`` (the verdict table) are written here as the stateful ALUs
execute them: each register read and written once per packet, in pipeline order, every update a
function of the register's own value, the packet and what earlier registers returned.  Random
packet sequences (few tags, offsets and workers, so that keys collide, uses complete, poison and
restart) must give the emulator's verdicts (:mod:`switch_emulator.bitmap`) packet for packet and
the same completions.  This checks the design; the P4 source itself is checked by compiling it
(``tests/test_tofino.py``) and, for the v1model program, by the BMv2 differential test.
"""

from __future__ import annotations

import random

import pytest

from homagg.jobs import JobSpec, WorkerAddr
from switch_emulator import bitmap
from switch_emulator.state import JobState

POISON = 0xFFFFFFFF
# use_key.p4's predicate: 1 << (offset equal + 2 * key equal)
PRED_OTHER, PRED_OTHER_SAME_OFFSET, PRED_SAME_OTHER_OFFSET, PRED_SAME = 1, 2, 4, 8


class TofinoCell:
    """One cell's registers: worker_bitmap.p4's use_state and use_key.p4's use_offset."""

    def __init__(self) -> None:
        self.missing, self.key = 0, 0  # cleared by the controller at admission
        self.offset, self.key2 = 0, 0

    def packet(self, world: int, w: int, tag: int, offset: int, op: int, wc: int, retx: bool) -> tuple[int, bool]:
        mine = 1 << w
        others = ((1 << world) - 1) & ~mine  # admitted_job's action parameter
        key = tag << 16 | op << 8 | wc  # admission.p4: meta.key_rest
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
        # stage 3: counter.p4's verdict table (first matching row) and completion
        if old == 0 and pred in (PRED_OTHER, PRED_OTHER_SAME_OFFSET):
            return bitmap.FIRST, others == 0
        if old == 0 and pred == PRED_SAME and not offset_max:
            return (bitmap.ANSWER, True) if retx else (bitmap.STALE, False)
        if old == 0:
            return bitmap.DUPLICATE, False
        if unseen == 0:
            return bitmap.DUPLICATE, False
        if pred == PRED_SAME and not offset_max:
            return bitmap.ADD, left == 0
        return bitmap.CONFLICT, False


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
