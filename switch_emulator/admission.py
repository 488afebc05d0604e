"""Stage 1, admission (P4: ``Admission`` table on ``ipv4.src_addr, udp.src_port``).

Maps a datagram's source address to ``(job, worker_id)``.  Unknown sources are dropped and counted
(``drop_unknown_source``); a header whose job/worker disagree with the admitted source is dropped
(``drop_admission_mismatch``); so is one without the job's admission token (``drop_token``,
checked by the pipeline after this lookup, as the P4 ``Admission`` control does).  The control plane fills the table: :meth:`AdmissionTable.admit`,
:meth:`register`, :meth:`remove`.  Every job owns a disjoint slot range of the pool.
"""

from __future__ import annotations

import threading
import time

from homagg._errors import ConfigError
from homagg.jobs import SWITCH_POOL_SLOTS, JobSpec, WorkerAddr, free_slot_base
from homagg.wire import MAX_SLOTS

from .state import JobState

__all__ = ["AdmissionTable", "check_pool_slots"]

Addr = tuple[str, int]


def check_pool_slots(pool_slots: int, source: str = "pool_slots") -> int:
    """``pool_slots`` if a pool of that many slots can serve jobs: 1 to :data:`~homagg.wire.MAX_SLOTS`
    (every slot of a job's range goes in the wire format's 15-bit slot field, so a larger pool
    could never be used); else :class:`~homagg.ConfigError` naming ``source``."""
    if isinstance(pool_slots, bool) or not isinstance(pool_slots, int) or not 1 <= pool_slots <= MAX_SLOTS:
        raise ConfigError(f"{source} {pool_slots} outside 1..{MAX_SLOTS}: a job's slots are numbered in the "
                          "15-bit slot field of the wire format")
    return pool_slots


class AdmissionTable:
    """Source address -> (JobState, worker_id); jobs by id; slot pool bookkeeping.

    Reads (:meth:`lookup`) are lock-free dict gets on the data path; mutations hold a lock.
    """

    def __init__(self, pool_slots: int = SWITCH_POOL_SLOTS) -> None:
        self.pool_slots = check_pool_slots(pool_slots)
        self.jobs: dict[int, JobState] = {}
        self.by_src: dict[Addr, tuple[JobState, int]] = {}
        #: trees: (parent address, job id) -> the child job whose results come down from there
        self.by_parent: dict[tuple[Addr, int], JobState] = {}
        self._lock = threading.Lock()

    def lookup(self, src: Addr) -> tuple[JobState, int] | None:
        return self.by_src.get(src)

    def admit(self, spec: JobSpec) -> JobState:
        """Install ``spec`` (slots must be inside the pool and free, job id unused)."""
        spec.validate()
        with self._lock:
            if spec.job_id in self.jobs:
                raise ConfigError(f"job {spec.job_id} is already admitted")
            if spec.slot_base + spec.n_slots > self.pool_slots:
                raise ConfigError(f"job {spec.job_id}: slots {spec.slots} exceed the pool of {self.pool_slots}")
            for other in self.jobs.values():
                o = other.spec
                if spec.slot_base < o.slot_base + o.n_slots and o.slot_base < spec.slot_base + spec.n_slots:
                    raise ConfigError(f"job {spec.job_id}: slots {spec.slots} overlap job {o.job_id}'s {o.slots}")
            for w in spec.workers:
                self._check_free(w.addr, spec.job_id, w.worker_id)
            if spec.parent is not None and spec.parent in self.by_src:
                raise ConfigError(f"job {spec.job_id}: parent {spec.parent} is admitted as a worker here")
            job = JobState(spec)
            self.jobs[spec.job_id] = job
            for w in spec.workers:
                self.by_src[w.addr] = (job, w.worker_id)
            if spec.parent is not None:
                self.by_parent[(spec.parent, spec.job_id)] = job
            return job

    def register(self, job_id: int, worker_id: int, addr: Addr) -> JobState:
        """Bind ``addr`` to ``worker_id`` of ``job_id`` (replaces that worker's previous address)."""
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise ConfigError(f"job {job_id} is not admitted")
            if not 0 <= worker_id < job.world_size:
                raise ConfigError(f"job {job_id}: worker id {worker_id} outside [0, {job.world_size})")
            self._check_free(addr, job_id, worker_id)
            old = job.addrs[worker_id]
            if old is not None and old != addr:
                self.by_src.pop(old, None)
            job.addrs[worker_id] = addr
            job.subscribed &= ~(1 << worker_id)  # a new socket has not joined the group (yet)
            job.spec = job.spec.with_worker(WorkerAddr(worker_id, addr[0], addr[1]))
            self.by_src[addr] = (job, worker_id)
            job.last_seen = time.monotonic()
            return job

    def remove(self, job_id: int) -> bool:
        """Forget a job: its admission entries and its slot range are free again."""
        with self._lock:
            job = self.jobs.pop(job_id, None)
            if job is None:
                return False
            for a in job.addrs:
                if a is not None and self.by_src.get(a, (None,))[0] is job:
                    del self.by_src[a]
            if job.spec.parent is not None:
                self.by_parent.pop((job.spec.parent, job_id), None)
            return True

    def free_range(self, n_slots: int) -> int:
        """First slot base where ``n_slots`` free slots fit (ConfigError if none)."""
        return free_slot_base((j.spec for j in self.jobs.values()), n_slots, self.pool_slots)

    def free_job_id(self) -> int:
        for j in range(1, 1 << 16):
            if j not in self.jobs:
                return j
        raise ConfigError("no free job id")

    def _check_free(self, addr: Addr, job_id: int, worker_id: int) -> None:
        cur = self.by_src.get(addr)
        if cur is not None and (cur[0].job_id, cur[1]) != (job_id, worker_id):
            raise ConfigError(f"address {addr} already admitted as job {cur[0].job_id} worker {cur[1]}")
