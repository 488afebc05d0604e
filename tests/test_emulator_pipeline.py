"""Switch emulator pipeline, stage by stage, without sockets (datagrams in, datagrams out)."""

from __future__ import annotations

import numpy as np
import pytest

from homagg import wire
from homagg._errors import ConfigError
from homagg.jobs import JobSpec, WorkerAddr
from switch_emulator import FaultConfig, Switch

A = [("10.0.0.1", 5000 + w) for w in range(8)]


class Harness:
    def __init__(self, world: int = 3, k: int = 8, n_slots: int = 4, slot_base: int = 10, job_id: int = 7,
                 token: int = 0xC0FFEE11) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.sw = Switch(lambda d, a: self.sent.append((bytes(d), a)), pool_slots=64)
        workers = tuple(WorkerAddr(w, *A[w]) for w in range(world))
        self.job = self.sw.admission.admit(JobSpec(job_id, world, slot_base, n_slots, k, workers, token=token))
        self.spec = self.job.spec

    def send(self, w: int, words: list[int] | np.ndarray, *, slot: int = 10, bank: int = 0, op: int = wire.OP_ADD,
             tag: int = 1, offset: int = 0, flags: int = 0, job: int | None = None, wid: int | None = None,
             src: tuple[str, int] | None = None, token: int | None = None,
             ) -> list[tuple[wire.Header, list[int], tuple[str, int]]]:
        words = np.asarray(words)
        h = wire.Header(wire.VERSION, op, flags, self.spec.job_id if job is None else job, w if wid is None else wid,
                        words.size, bank, slot, tag, offset, token=self.spec.token if token is None else token)
        pkt = wire.pack_packet(h, words)
        self.sent.clear()
        self.sw.ingress(pkt, len(pkt), A[w] if src is None else src)
        out = []
        for d, a in self.sent:
            rh, payload = wire.parse_packet(d)
            out.append((rh, payload.tolist(), a))
        return out

    def drops(self, reason: str) -> int:
        return self.sw.counters["drop_" + reason]


def test_first_write_combine_and_replicate() -> None:
    h = Harness(world=3)
    assert h.send(0, [1, 2, 3]) == []  # first write, not complete
    assert h.send(1, [10, 20, 30]) == []
    out = h.send(2, [100, 200, 300])
    assert sorted(a for _, _, a in out) == A[:3]  # replicated to every worker of the job
    for rh, words, a in out:
        assert words == [111, 222, 333]
        assert rh.flags == wire.FLAG_RESULT and rh.job_id == 7 and rh.slot == 10 and rh.bank == 0
        assert rh.tag == 1 and rh.offset == 0 and rh.worker_id == A.index(a)
    assert h.sw.counters["completed"] == 1 and h.sw.counters["accepted"] == 3


def test_first_write_overwrites_previous_use() -> None:
    h = Harness(world=1)
    assert h.send(0, [5, 5], tag=1)[0][1] == [5, 5]
    assert h.send(0, [7, 7], bank=1, tag=2)[0][1] == [7, 7]
    # next use of bank 0: first write replaces the old registers (no accumulation)
    assert h.send(0, [1, 1], bank=0, tag=3)[0][1] == [1, 1]


@pytest.mark.parametrize(
    "op, a, b, expect",
    [
        (wire.OP_ADD, [2**31 - 1, -(2**31), -1], [1, -1, 1], [-(2**31), 2**31 - 1, 0]),  # wrap-around
        (wire.OP_OR, [0b1010, 0, -(2**31)], [0b0101, 0, 1], [0b1111, 0, -(2**31) + 1]),
        (wire.OP_MAX, [-5, 7, -(2**31)], [-6, 8, 2**31 - 1], [-5, 8, 2**31 - 1]),  # signed
    ],
)
def test_ops(op: int, a: list[int], b: list[int], expect: list[int]) -> None:
    h = Harness(world=2)
    assert h.send(0, a, op=op) == []
    out = h.send(1, b, op=op)
    assert [w for _, w, _ in out] == [expect, expect]


def test_duplicate_dropped_retransmission_of_complete_answered() -> None:
    h = Harness(world=2)
    h.send(0, [1])
    assert h.send(0, [1], flags=wire.FLAG_RETRANSMIT) == []  # incomplete: duplicate dropped
    assert h.drops("duplicate") == 1
    out = h.send(1, [2])
    assert len(out) == 2
    # worker 1 lost its result and retransmits: unicast answer from the stored registers
    out = h.send(1, [2], flags=wire.FLAG_RETRANSMIT)
    assert [(w, a) for _, w, a in out] == [([3], A[1])]
    assert h.sw.counters["retransmit_answered"] == 1
    assert h.sw.counters["completed"] == 1  # not counted twice


def test_bank_flip_and_stale_copy() -> None:
    h = Harness(world=2)
    h.send(0, [1], bank=0, tag=1)
    h.send(1, [1], bank=0, tag=1)  # bank 0 complete: [2]
    h.send(0, [5], bank=1, tag=2)  # worker 0 moved on (bank 0 is left as it is)
    # a late copy of worker 0's bank-0 packet (no FLAG_RETRANSMIT): the use is complete -> stale
    assert h.send(0, [1], bank=0, tag=1) == []
    assert h.drops("stale") == 1
    out = h.send(1, [6], bank=1, tag=2)
    assert [w for _, w, _ in out] == [[11], [11]]
    # another late copy with the completed key is still stale, not a new use
    assert h.send(1, [1], bank=0, tag=1) == []
    assert h.drops("stale") == 2
    # the real next use of bank 0 (new tag) starts fresh
    h.send(0, [100], bank=0, tag=3)
    out = h.send(1, [200], bank=0, tag=3)
    assert [w for _, w, _ in out] == [[300], [300]]
    st = h.job.slot_status(10)
    assert st["banks"][0]["complete"] and st["banks"][0]["missing"] == []


def test_late_copies_change_no_other_bank() -> None:
    """A packet into one bank never touches the other bank's use: a retransmission there is still
    a duplicate, and the other bank's result is the exact sum (no contribution twice)."""
    h = Harness(world=3)
    for w in range(3):
        h.send(w, [1], bank=0, tag=1)  # bank 0 complete: [3]
    h.send(0, [10], bank=1, tag=2)  # worker 0 moves on to bank 1
    assert h.send(0, [1], bank=0, tag=1) == []  # its late bank-0 copy: stale
    assert h.send(0, [1], bank=0, tag=9) == []  # another key on the complete bank 0: a new use (FIRST)
    assert h.send(0, [10], bank=1, tag=2, flags=wire.FLAG_RETRANSMIT) == []  # bank 1: still a duplicate
    assert h.drops("duplicate") == 1
    h.send(1, [20], bank=1, tag=2)
    out = h.send(2, [30], bank=1, tag=2)
    assert [w for _, w, _ in out] == [[60]] * 3


def test_answer_needs_the_retransmit_flag() -> None:
    h = Harness(world=2)
    h.send(0, [4])
    assert len(h.send(1, [5])) == 2
    assert h.send(1, [5]) == []  # a copy without the flag: stale
    assert h.drops("stale") == 1
    assert [(w, a) for _, w, a in h.send(1, [5], flags=wire.FLAG_RETRANSMIT)] == [([9], A[1])]


def test_offset_mismatch_poisons_the_use() -> None:
    """The use's (tag, op, word_count) with another offset marks the sender and poisons the use:
    no packet completes it nor gets its result; the bank's next use starts as usual."""
    h = Harness(world=3)
    h.send(0, [1], tag=4, offset=0)
    assert h.send(1, [2], tag=4, offset=8) == []  # conflict: worker 1 marked, use poisoned
    assert h.drops("conflict") == 1
    assert h.send(1, [2], tag=4, offset=0, flags=wire.FLAG_RETRANSMIT) == []  # marked: duplicate
    assert h.send(2, [3], tag=4, offset=0) == []  # would complete it: conflict, no result
    assert h.drops("conflict") == 2 and h.drops("duplicate") == 1
    assert h.send(0, [1], tag=4, offset=0, flags=wire.FLAG_RETRANSMIT) == []  # no answer
    assert h.sw.counters["completed"] == 0
    for w in range(2):
        h.send(w, [w + 1], tag=6, offset=16)  # every worker marked: the next use starts
    out = h.send(2, [3], tag=6, offset=16)
    assert [w for _, w, _ in out] == [[6]] * 3 and out[0][0].offset == 16


def test_conflicting_contribution_dropped() -> None:
    h = Harness(world=3)
    h.send(0, [1, 2], tag=1, offset=0)
    assert h.send(1, [1, 2], tag=9, offset=0) == []
    assert h.send(1, [1, 2, 3], tag=1, offset=0) == []  # other word count
    assert h.send(1, [1, 2], tag=1, op=wire.OP_OR) == []
    assert h.drops("conflict") == 3
    st = h.job.slot_status(10)["banks"][0]
    assert st["count"] == 1 and st["missing"] == [1, 2]


def test_admission_and_range_drops() -> None:
    h = Harness(world=2, k=4)
    h.send(0, [1], src=("10.9.9.9", 1))
    assert h.drops("unknown_source") == 1
    h.send(0, [1], job=8)
    h.send(0, [1], wid=1)
    assert h.drops("admission_mismatch") == 2
    h.send(0, [1] * 5)
    assert h.drops("word_count") == 1
    h.send(0, [1], slot=14)
    h.send(0, [1], slot=9)
    assert h.drops("slot_range") == 2
    h.send(0, [1], flags=wire.FLAG_RESULT)
    assert h.drops("result_flag") == 1
    sw = h.sw
    for bad, reason in [(b"\x10" * 15, "short"), (b"\x10" + b"\x00" * 19, "version"), (b"\x23" + b"\x00" * 19, "op"),
                        (b"\x20" + b"\x00" * 19, "length"), (b"\x20\x00\x00\x07\x00\x00\x00\x02" + b"\x00" * 16, "length")]:
        sw.ingress(bad, len(bad), A[0])
        assert h.drops(reason) >= 1, reason
    assert sw.counters["accepted"] == 0
    snap = sw.counters.snapshot()
    assert snap["rx"] == snap["dropped"] == 12


def test_jobs_isolated_and_slot_ranges_disjoint() -> None:
    h = Harness(world=2, slot_base=10, n_slots=4)
    with pytest.raises(ConfigError, match="overlap"):
        h.sw.admission.admit(JobSpec(8, 2, 12, 4, 8))
    with pytest.raises(ConfigError, match="already admitted"):
        h.sw.admission.admit(JobSpec(9, 2, 20, 4, 8, (WorkerAddr(0, *A[0]),)))
    job2 = h.sw.admission.admit(JobSpec(9, 2, 20, 4, 8, (WorkerAddr(0, *A[2]), WorkerAddr(1, *A[3]))))
    h.send(0, [1])
    assert h.send(2, [5], job=9, wid=0, slot=10, token=0) == []  # job 9 cannot touch job 7's slots
    assert h.drops("slot_range") == 1
    h.send(2, [5], job=9, wid=0, slot=20, token=0)
    out = h.send(3, [6], job=9, wid=1, slot=20, token=0)
    assert sorted((w[0], a) for _, w, a in out) == [(11, A[2]), (11, A[3])]
    out = h.send(1, [2])
    assert sorted((w[0], a) for _, w, a in out) == [(3, A[0]), (3, A[1])]
    assert job2.completed == 1 and h.job.completed == 1
    assert h.sw.admission.remove(7) and not h.sw.admission.remove(7)
    assert h.sw.admission.free_range(4) == 0
    h.send(0, [1])
    assert h.drops("unknown_source") == 1


def test_control_admit_register_status_and_idle_expiry() -> None:
    sw = Switch(lambda d, a: None, pool_slots=128)
    r = sw.control({"cmd": "admit", "job": {"world_size": 2, "n_slots": 32, "words_per_packet": 64,
                                             "idle_timeout_s": 0.01}})
    assert r["ok"] and r["job"]["job_id"] == 1 and r["job"]["slot_base"] == 0
    r2 = sw.control({"cmd": "admit", "job": {"world_size": 2, "n_slots": 32}})
    assert r2["job"]["slot_base"] == 32 and r2["job"]["job_id"] == 2
    assert sw.control({"cmd": "register", "job_id": 1, "worker_id": 1, "ip": "127.0.0.1", "port": 9})["ok"]
    bad = sw.control({"cmd": "register", "job_id": 2, "worker_id": 0, "ip": "127.0.0.1", "port": 9})
    assert not bad["ok"] and "already admitted" in bad["error"]
    assert not sw.control({"cmd": "register", "job_id": 1, "worker_id": 2, "ip": "127.0.0.1", "port": 10})["ok"]
    assert not sw.control({"cmd": "nope"})["ok"]
    st = sw.control({"cmd": "status"})
    assert [j["registered"] for j in st["jobs"]] == [[1], []]
    slot = sw.control({"cmd": "slot", "job_id": 1, "slot": 3})
    assert slot["banks"][0]["missing"] == [0, 1]
    import time

    time.sleep(0.05)
    sw.housekeeping()
    assert [j.job_id for j in sw.admission.jobs.values()] == [2]
    assert sw.admission.lookup(("127.0.0.1", 9)) is None
    refused = sw.control({"cmd": "faults", "drop": 0.5})  # not started with fault injection enabled
    assert not refused["ok"] and "--allow-faults" in refused["error"] and not sw.faults.config.active
    sw.allow_faults = True
    assert sw.control({"cmd": "faults", "drop": 0.5})["faults"]["drop"] == 0.5
    assert not sw.control({"cmd": "faults", "drop": 1.5})["ok"]


def test_fault_injection_counts() -> None:
    h = Harness(world=1)
    h.sw.faults.configure(FaultConfig(drop=0.3, duplicate=0.3, reorder=0.3, seed=3))
    for t in range(300):
        h.send(0, [t], slot=10 + t % 4, bank=(t // 4) % 2, tag=t)
    h.sw.faults.flush()
    c = h.sw.counters
    assert c["drop_injected"] > 50 and c["injected_duplicate"] > 30 and c["injected_reorder"] > 30
    assert c["accepted"] + c["drop_injected"] + c["drop_stale"] + c["drop_conflict"] <= 300 + c["injected_duplicate"]


def test_forged_token_with_the_right_source_is_dropped_and_counted() -> None:
    """Wire v2: a datagram from an admitted source (right job, worker, slot) but with another token
    changes nothing and is counted as ``drop_token``; results carry the job's token."""
    h = Harness(world=2, token=0x5EC2E7AA)
    for forged in (0, 0x5EC2E7AB, 0xFFFFFFFF):
        assert h.send(0, [1000], token=forged) == []  # spoofed worker 0: would poison the sum
    assert h.drops("token") == 3 and h.sw.counters["accepted"] == 0
    assert h.send(0, [1]) == []
    out = h.send(1, [2])
    assert [(rh.token, words) for rh, words, _ in out] == [(0x5EC2E7AA, [3])] * 2  # exact: no forged value
    assert h.sw.counters.snapshot()["drop_token"] == 3
