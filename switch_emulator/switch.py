"""The emulated switch: tables + pipeline + counters + faults, independent of the I/O backend.

Control operations (:meth:`Switch.control`) are what the control server exposes; see
:mod:`homagg.transport` (``ControlClient``) for the protocol.  ``housekeeping`` forgets jobs idle for longer
than their ``idle_timeout_s`` (their slots are reclaimed).

Every admission, registration, removal and expiry is logged (logger ``homagg.switch``, INFO) with
the requesting peer; a job's token and the control secret never are.  Fault injection over the
control port (``faults``) is refused unless the switch was built with ``allow_faults`` (CLI
``--allow-faults``, or fault rates given at start).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from homagg._errors import ConfigError, HomAggError
from homagg.jobs import SWITCH_POOL_SLOTS, JobSpec, new_token
from homagg.transport._sockets import PROBE_PREFIX
from homagg.wire import VERSION

from .admission import AdmissionTable
from .counters import Counters
from .faults import FaultConfig, FaultInjector
from .pipeline import Pipeline
from .replication import SendFn

__all__ = ["Switch"]

log = logging.getLogger("homagg.switch")

#: control commands that change what the data plane's tables hold
_TABLE_COMMANDS = frozenset({"admit", "register", "remove", "group", "subscribe"})


class Switch:
    def __init__(self, send: SendFn, *, pool_slots: int = SWITCH_POOL_SLOTS, faults: FaultConfig | None = None,
                 allow_faults: bool | None = None) -> None:
        self.counters = Counters()
        self.admission = AdmissionTable(pool_slots)
        self.pipeline = Pipeline(self.admission, send, self.counters)
        self.faults = FaultInjector(faults or FaultConfig(), self.pipeline.process, self.counters)
        self.pipeline.replicator.egress_drop = self.faults.egress_drop
        self.pipeline.replicator.unicast_only = self.faults.config.mute_mask
        self.data_addr: tuple[str, int] | None = None
        #: job id -> its result multicast group; set by a backend that can send to groups
        self.group_for: Callable[[int], tuple[str, int]] | None = None
        self.backend = "none"
        #: the engine running the pipeline: "python" (pipeline.py) or "native" (native.py); set by the backend
        self.engine = "python"
        #: set by the native engine while it serves: called after a control change of the tables (and
        #: before a read of counters or cells: the engine syncs them)
        self.on_tables_changed: Callable[[], None] | None = None
        self.started = time.time()
        self._admit_lock = threading.Lock()  # picking a free job id / slot range and admitting: atomic
        self._ctx = threading.local()  # the peer of the request this (control server) thread serves
        #: may the control port change fault injection? (default: only if started with faults)
        self.allow_faults = bool(faults and faults.active) if allow_faults is None else allow_faults

    @property
    def ingress(self):  # noqa: ANN201 - the function backends call per datagram
        return self.faults.ingress if self.faults.config.active else self.pipeline.process

    def housekeeping(self) -> None:
        """Forget jobs idle beyond their ``idle_timeout_s``."""
        now = time.monotonic()
        for job in list(self.admission.jobs.values()):
            t = job.spec.idle_timeout_s
            if t is not None and now - job.last_seen > t:
                self.admission.remove(job.job_id)
                self.counters["jobs_expired"] += 1
                log.info("job %d expired after %.1fs idle; slots %d..%d free", job.job_id, t,
                         job.spec.slot_base, job.spec.slot_base + job.spec.n_slots - 1)

    @property
    def _peer(self) -> str:
        return getattr(self._ctx, "peer", "in-process")

    def admit(self, spec: JobSpec, peer: str = "config") -> Any:
        """Admit ``spec`` (logged); the JobState."""
        job = self.admission.admit(spec)
        self.counters["jobs_admitted"] += 1
        log.info("job %d admitted by %s: %d workers, slots %d..%d, %d words/packet%s", spec.job_id, peer,
                 spec.world_size, spec.slot_base, spec.slot_base + spec.n_slots - 1, spec.words_per_packet,
                 "" if spec.token else " -- token 0: unprotected against spoofed sources")
        return job

    # -- control plane -------------------------------------------------------------------------
    def control(self, req: dict[str, Any], peer: str = "in-process") -> dict[str, Any]:
        """Execute one control request from ``peer``; never raises (errors come back as ``ok: false``).

        Authentication is the control server's job (:mod:`.control`); this object trusts its caller.
        """
        try:
            cmd = req.get("cmd")
            handler = getattr(self, f"_cmd_{cmd}", None)
            if handler is None:
                raise ConfigError(f"unknown control command {cmd!r}")
            self._ctx.peer = peer
            hook = self.on_tables_changed
            if hook is not None and cmd in ("status", "slot"):
                hook()  # the native engine hands over its counters and cell state first
            resp = {"ok": True, **handler(req)}
            if hook is not None and cmd in _TABLE_COMMANDS:
                hook()  # the native engine applies the change before the requester goes on
            return resp
        except (HomAggError, KeyError, TypeError, ValueError) as exc:
            if req.get("cmd") in ("admit", "register", "remove", "faults"):
                log.warning("%s from %s refused: %s: %s", req.get("cmd"), peer, type(exc).__name__, exc)
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def _cmd_ping(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"version": VERSION, "data": list(self.data_addr or ()), "backend": self.backend}

    def _cmd_admit(self, req: dict[str, Any]) -> dict[str, Any]:
        d = dict(req["job"])
        with self._admit_lock:
            if d.get("job_id") is None:
                d["job_id"] = self.admission.free_job_id()
            d.setdefault("n_slots", 64)
            auto_base = d.get("slot_base") is None
            if auto_base:
                d["slot_base"] = 0
            if d.get("token") is None:
                d["token"] = new_token()
            spec = JobSpec.from_dict(d)
            if auto_base:
                spec = replace(spec, slot_base=self.admission.free_range(spec.n_slots))
            job = self.admit(spec, self._peer)
        return {"job": job.spec.to_dict()}

    def _cmd_register(self, req: dict[str, Any]) -> dict[str, Any]:
        job_id, wid, addr = int(req["job_id"]), int(req["worker_id"]), (str(req["ip"]), int(req["port"]))
        job = self.admission.register(job_id, wid, addr)
        log.info("job %d worker %d registered %s:%d (by %s)", job_id, wid, addr[0], addr[1], self._peer)
        return {"job": job.spec.to_dict()}

    def _cmd_group(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self._job(req)
        if job.group is None and self.group_for is not None:
            job.group = self.group_for(job.job_id)
        return {"group": None if job.group is None else list(job.group)}

    def _cmd_probe(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self._job(req)
        if job.group is None:
            raise ConfigError(f"job {job.job_id} has no multicast group (ask with 'group' first)")
        self.pipeline.replicator.send(memoryview(PROBE_PREFIX + str(req["nonce"]).encode()), job.group)
        return {}

    def _cmd_subscribe(self, req: dict[str, Any]) -> dict[str, Any]:
        job, wid = self._job(req), int(req["worker_id"])
        if not 0 <= wid < job.world_size:
            raise ConfigError(f"job {job.job_id}: worker id {wid} outside [0, {job.world_size})")
        if not req.get("on", True):
            job.subscribed &= ~(1 << wid)
        elif job.group is None:
            raise ConfigError(f"job {job.job_id} has no multicast group (ask with 'group' first)")
        else:
            job.subscribed |= 1 << wid
        return {"subscribed": [w for w in range(job.world_size) if job.subscribed >> w & 1]}

    def _job(self, req: dict[str, Any]) -> Any:
        job = self.admission.jobs.get(int(req["job_id"]))
        if job is None:
            raise ConfigError(f"job {req['job_id']} is not admitted")
        return job

    def _cmd_remove(self, req: dict[str, Any]) -> dict[str, Any]:
        job_id = int(req["job_id"])
        removed = self.admission.remove(job_id)
        log.info("job %d %s by %s", job_id, "removed" if removed else "not removed (not admitted)", self._peer)
        return {"removed": removed}

    def _cmd_status(self, req: dict[str, Any]) -> dict[str, Any]:
        return {
            "counters": self.counters.snapshot(),
            "jobs": [j.summary() for j in self.admission.jobs.values()],
            "faults": self.faults.config.to_dict(),
            "faults_allowed": self.allow_faults,
            "pool_slots": self.admission.pool_slots,
            "data": list(self.data_addr or ()),
            "backend": self.backend,
            "engine": self.engine,
            "uptime_s": round(time.time() - self.started, 3),
        }

    def _cmd_slot(self, req: dict[str, Any]) -> dict[str, Any]:
        return self._job(req).slot_status(int(req["slot"]))

    def _cmd_faults(self, req: dict[str, Any]) -> dict[str, Any]:
        if not self.allow_faults:
            raise ConfigError("fault injection is disabled on this switch (start it with --allow-faults)")
        if self.engine != "python":
            raise ConfigError("fault injection runs in the python engine only (start the switch with --engine python)")
        cfg = FaultConfig(**{k: req[k] for k in ("drop", "duplicate", "reorder", "seed", "mute") if k in req})
        self.faults.configure(cfg)
        self.pipeline.replicator.unicast_only = cfg.mute_mask
        log.info("fault injection set to %s by %s", cfg.to_dict(), self._peer)
        return {"faults": cfg.to_dict()}

    def _cmd_reset_counters(self, req: dict[str, Any]) -> dict[str, Any]:
        self.counters.clear()
        return {}
