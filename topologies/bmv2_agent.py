"""A homagg control port for a BMv2 switch: admit/register/remove over the control protocol, done
with P4Runtime.

The ``homagg`` torch backend (and :class:`homagg.transport.UdpSwitchPort`) talk to an external
switch through the control protocol of :mod:`homagg.transport._control`: rank 0 ``admit`` s a job
(the switch picks its id, slots and token), every rank ``register`` s the (ip, port) its socket
got, rank 0 ``remove`` s the job at the end.  ``simple_switch_grpc`` speaks P4Runtime only, so
:class:`Bmv2ControlAgent` translates: it serves the protocol with the emulator's own server
(:class:`switch_emulator.control.ControlServer`: the same challenge-response authentication, the
same wire) and performs each operation with :class:`homagg.p4.Controller` (``add_job`` /
``remove_job``), one P4Runtime session per request.

* ``admit``: picks a free job id and a free slot range of the P4 pool and a fresh token; writes
  the entries of the workers given with the job (a tree's root admits its children's data
  addresses so: a switch never registers), else nothing yet (the P4 admission table is keyed by
  the workers' source addresses; workers register them).  A job with a
  ``parent`` (trees, docs/trees.md: the parent's data address, and the ``child_id`` this switch has
  there; the tree's job id, token and slots are given) makes this switch a child for it: checked
  at once (the parent needs a host entry), its uplink written with the workers' entries.
* ``register``: adds the worker to the job and writes the job's entries for the workers registered
  so far (admission with the job's token, result rewrite, multicast replicas), always with the
  epoch chosen at admission, so registering one worker does not reset the cells of another.
* ``status``: the agent's jobs (the switch holds what the agent wrote since it last saw the switch
  start) and, read over P4Runtime, drop counters and packets per source; with ``jobs_only`` the
  jobs alone, without a P4Runtime session (a worker's liveness probe asks this once a second
  while a round stalls: :mod:`homagg.transport._liveness`).
* ``remove``, ``group`` (none: results come back by unicast), ``ping``; ``slot`` answers an error
  (PI cannot read registers).

Liveness: the agent runs beside the switch, as a switch's local agent does, and its control port
is open only while the switch runs: a watchdog sees ``simple_switch_grpc`` exit and closes the
port (its jobs are forgotten: BMv2 lost them), so a worker's liveness probe (a TCP connect to the
control port) sees the crash at once, as with the emulator; :meth:`resume` opens it again once the
restarted switch has its pipeline and entries (:func:`topologies.bmv2.restart_bmv2`).  With
``gate=False`` the port stays open whatever the switch does (a controller on another machine,
say): then a worker notices the crash only at its progress timeout, and a re-admission tried
while the switch is still down fails at the switch (``admit`` answers an error) and is retried.

Invariants: requests are served one at a time (a lock); jobs never share slots; a job id is not
reused while the agent runs; an error comes back as ``{"ok": false, "error": ...}``, never raises;
``p4runtime_sessions`` counts the P4Runtime sessions the agent opened (one per request that writes
or reads the switch, none for ``ping``, ``group`` and ``status`` with ``jobs_only``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from collections.abc import Iterator
from typing import Any, cast

from homagg.jobs import JobSpec, WorkerAddr, free_slot_base, new_token

__all__ = ["Bmv2ControlAgent"]

log = logging.getLogger("homagg.bmv2_agent")
_MAX_JOB_ID = 0x7FFE  # Controller.mcast_group: ids 1..32766 map to their own multicast group


@dataclass
class _Job:
    spec: JobSpec
    epoch: int
    workers: dict[int, WorkerAddr] = field(default_factory=dict)

    def with_workers(self) -> JobSpec:
        return replace(self.spec, workers=tuple(self.workers[w] for w in sorted(self.workers)))


class Bmv2ControlAgent:
    """The control port of one BMv2 switch (see the module docstring).

    ``node``: the :class:`topologies.bmv2.Bmv2Switch` (its ``proc`` is watched); ``cfg``: its
    :class:`homagg.p4.SwitchConfig`; ``listen``: where the port listens (an address the workers
    reach); ``secret``: the shared secret clients prove (at least 16 characters); ``data_port``:
    the UDP port workers send to (``ping`` tells it); ``gate``: close the port while the switch is
    down (see the module docstring); ``built``: the build the switch runs (its ``p4info``; default
    ``p4/build/``).
    """

    def __init__(self, node: Any, cfg: Any, listen: tuple[str, int], secret: str, data_port: int,
                 watch_s: float = 0.05, gate: bool = True, built: Any = None) -> None:
        from homagg.p4.source import p4_constants

        self.node, self.cfg, self.listen, self.secret = node, cfg, listen, secret
        self.data_port, self.watch_s, self.gate = data_port, watch_s, gate
        self.p4info = None if built is None else built.p4info
        self.bmv2_json = None if built is None else built.json
        self.pool = p4_constants()["SLOT_POOL_SIZE"].value
        self.jobs: dict[int, _Job] = {}
        self.p4runtime_sessions = 0  #: P4Runtime sessions opened (see the module docstring)
        self.events: list[dict[str, Any]] = []  #: {"t", "what"}: port opened/closed, jobs admitted/removed
        self._next_id = 1
        self._lock = threading.Lock()
        self._server: Any = None
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watchdog, name="homagg-bmv2-agent-watch", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> Bmv2ControlAgent:
        """Open the control port and start watching the switch process."""
        self.resume()
        self._watch.start()
        return self

    def resume(self) -> None:
        """Open the control port (the switch runs and has its pipeline again)."""
        from switch_emulator.control import ControlServer

        with self._lock:
            if self._server is None:
                self._server = ControlServer(cast(Any, self), self.listen, secret=self.secret).start()
                self._event("control port open")

    def pause(self, why: str) -> None:
        """Close the control port and forget the jobs (the switch lost them)."""
        with self._lock:
            server, self._server = self._server, None
            self.jobs.clear()
        if server is not None:
            server.stop()
            self._event(f"control port closed: {why}")

    def stop(self) -> None:
        self._stop.set()
        if self._watch.is_alive():
            self._watch.join(5)
        self.pause("agent stopped")

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the agent's requests back meanwhile (e.g. while the switch is reloaded: its
        P4Runtime sessions would compete with the reloader's for the same election id)."""
        with self._lock:
            yield

    def _watchdog(self) -> None:
        while not self._stop.wait(self.watch_s):
            proc = self.node.proc
            if self.gate and self.serving and (proc is None or proc.poll() is not None):
                self.pause(f"simple_switch_grpc exited ({None if proc is None else proc.returncode})")

    def _event(self, what: str) -> None:
        self.events.append({"t": time.time(), "what": what})
        log.info("%s", what)

    # ------------------------------------------------------------------ the protocol
    def control(self, req: dict[str, Any], peer: str = "in-process") -> dict[str, Any]:
        """Serve one request (the :class:`~switch_emulator.control.ControlServer` contract)."""
        cmd = req.get("cmd")
        handler = getattr(self, f"_cmd_{cmd}", None)
        if handler is None:
            return {"ok": False, "error": f"ConfigError: unknown control command {cmd!r}"}
        try:
            with self._lock:
                return {"ok": True, **handler(req)}
        except Exception as exc:  # noqa: BLE001 - the protocol answers errors, it does not raise them
            log.warning("%s from %s failed: %s: %s", cmd, peer, type(exc).__name__, exc)
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    def _controller(self) -> Any:
        from homagg.p4 import Controller

        self.p4runtime_sessions += 1
        return Controller(self.cfg.grpc, self.cfg.device_id, p4info=self.p4info, bmv2_json=self.bmv2_json, timeout=2.0)

    def _cmd_ping(self, req: dict[str, Any]) -> dict[str, Any]:
        from homagg.wire import VERSION

        return {"version": VERSION, "data": [self.cfg.service_ip, self.data_port], "backend": "bmv2"}

    def _cmd_admit(self, req: dict[str, Any]) -> dict[str, Any]:
        d = dict(req["job"])
        if d.get("job_id") is None:
            while self._next_id in self.jobs:
                self._next_id = self._next_id % _MAX_JOB_ID + 1
            d["job_id"], self._next_id = self._next_id, self._next_id % _MAX_JOB_ID + 1
        if d.get("token") is None:
            d["token"] = new_token()
        if d.get("slot_base") is None:
            d["slot_base"] = 0
            d["slot_base"] = free_slot_base((j.spec for j in self.jobs.values()), int(d.get("n_slots") or 64), self.pool)
        spec = JobSpec.from_dict(d)
        if spec.job_id in self.jobs:
            raise ValueError(f"job {spec.job_id} is already admitted")
        from homagg.p4 import Controller

        Controller.check_job(spec, self.cfg)  # a child: this switch can send up to its parent
        job = _Job(replace(spec, workers=()), Controller.new_epoch(), {w.worker_id: w for w in spec.workers})
        with self._controller() as ctl:
            ctl.check_pipeline()  # the switch runs homagg.p4: worth admitting
            if job.workers:  # given with the job (a tree's root: its children), not registered
                ctl.add_job(self.cfg, job.with_workers(), epoch=job.epoch)
        self.jobs[spec.job_id] = job
        self._event(f"job {spec.job_id} admitted: {spec.world_size} workers, slots {spec.slot_base}.."
                    f"{spec.slot_base + spec.n_slots - 1}")
        return {"job": job.with_workers().to_dict()}

    def _job(self, req: dict[str, Any]) -> _Job:
        job = self.jobs.get(int(req["job_id"]))
        if job is None:
            raise ValueError(f"job {req['job_id']} is not admitted")
        return job

    def _cmd_register(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self._job(req)
        wid = int(req["worker_id"])
        if not 0 <= wid < job.spec.world_size:
            raise ValueError(f"job {job.spec.job_id}: worker id {wid} outside [0, {job.spec.world_size})")
        old = job.workers.get(wid)
        job.workers[wid] = WorkerAddr(wid, str(req["ip"]), int(req["port"]))
        spec = job.with_workers().validate()
        with self._controller() as ctl:
            if old is not None and old.addr != job.workers[wid].addr:  # its old source must not count
                ctl.forget_source(old.ip, old.port)
            ctl.add_job(self.cfg, spec, epoch=job.epoch)  # cells start from zero once: at admission
        return {"job": spec.to_dict()}

    def _cmd_group(self, req: dict[str, Any]) -> dict[str, Any]:
        self._job(req)
        return {"group": None}

    def _cmd_slot(self, req: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("slot state: BMv2's registers cannot be read over P4Runtime (PI answers UNIMPLEMENTED)")

    def _cmd_remove(self, req: dict[str, Any]) -> dict[str, Any]:
        job = self.jobs.pop(int(req["job_id"]), None)
        if job is None:
            return {"removed": False}
        with self._controller() as ctl:
            ctl.remove_job(self.cfg, job.with_workers())
        self._event(f"job {job.spec.job_id} removed")
        return {"removed": True}

    def _cmd_status(self, req: dict[str, Any]) -> dict[str, Any]:
        jobs = [j.with_workers().to_dict() for j in self.jobs.values()]
        if req.get("jobs_only"):
            return {"jobs": jobs}
        with self._controller() as ctl:
            counters = ctl.read_counters()
        return {"counters": counters, "jobs": jobs, "faults": None}
