"""Per-job switch state: the register file and per-(slot, bank) metadata of one admitted job.

Index ``i = 2 * (slot - slot_base) + bank`` addresses one (slot, bank) pair.  For each ``i``:

* ``regs[i, :K]``  int32 slot registers (the combined payload),
* ``bitmap[i]``    workers marked in the current use of this bank (bit ``worker_id``),
* ``count[i]``     workers marked, ``0`` (never used) .. ``world_size`` (done),
* ``key[i]``       ``(tag, offset, op, word_count)`` of the current use (None before the first;
  offset :data:`switch_emulator.bitmap.POISON` once poisoned, see :mod:`switch_emulator.bitmap`),
* ``down[i]``      trees, at a child only: 1 once the parent's result of the current use came
  down (``regs[i]`` then hold the whole tree's result, no longer this switch's partial one);
  0 from the use's first contribution on.  At a root a complete use *is* its result.

Result multicast (UDP backend on loopback): ``group`` is the job's IP multicast group (None until
a worker asks for it), ``subscribed`` the bitmap of workers that joined it; those receive each
result through one send to the group, the others by unicast.

A complete (slot, bank) keeps its result until a worker starts the *next* use of that bank, which
by the self-clocking protocol happens only after every worker has received the result (SwitchML's
shadow copy: the slot's other bank holds the next use meanwhile).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from homagg.jobs import JobSpec

__all__ = ["JobState"]


@dataclass(eq=False)
class JobState:
    spec: JobSpec
    regs: np.ndarray = field(init=False)
    bitmap: list[int] = field(init=False)
    count: list[int] = field(init=False)
    key: list[tuple[int, int, int, int] | None] = field(init=False)
    down: list[int] = field(init=False)
    #: worker_id -> (ip, port) of admitted workers (None until registered)
    addrs: list[tuple[str, int] | None] = field(init=False)
    group: tuple[str, int] | None = None
    subscribed: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    packets: int = 0
    completed: int = 0

    def __post_init__(self) -> None:
        s = self.spec
        self.regs = np.zeros((2 * s.n_slots, s.words_per_packet), dtype=np.int32)
        self.bitmap = [0] * (2 * s.n_slots)
        self.count = [0] * (2 * s.n_slots)
        self.key = [None] * (2 * s.n_slots)
        self.down = [0] * (2 * s.n_slots)
        self.addrs = [None] * s.world_size
        for w in s.workers:
            self.addrs[w.worker_id] = w.addr

    @property
    def job_id(self) -> int:
        return self.spec.job_id

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def slot_status(self, slot: int) -> dict[str, object]:
        """Bitmaps, counts and missing workers of both banks of absolute ``slot``."""
        rel = slot - self.spec.slot_base
        if not 0 <= rel < self.spec.n_slots:
            raise KeyError(f"slot {slot} not in job {self.job_id}'s range {self.spec.slots}")
        banks = []
        for b in (0, 1):
            i = 2 * rel + b
            bm, cnt, key = self.bitmap[i], self.count[i], self.key[i]
            banks.append({
                "bank": b, "bitmap": int(bm), "count": int(cnt), "complete": bool(cnt == self.world_size),
                "down": bool(self.down[i]) if self.spec.is_child else bool(cnt == self.world_size),
                "missing": [w for w in range(self.world_size) if not bm >> w & 1],
                "tag": None if key is None else key[0], "offset": None if key is None else key[1],
            })
        return {"job_id": self.job_id, "slot": slot, "world_size": self.world_size, "banks": banks}

    def summary(self) -> dict[str, object]:
        return {
            **self.spec.to_dict(),
            "registered": [w for w, a in enumerate(self.addrs) if a is not None],
            "packets": self.packets,
            "completed": self.completed,
            "idle_s": round(time.monotonic() - self.last_seen, 3),
        }
