"""The homagg operations on a BMv2 ``simple_switch_grpc`` running ``p4/homagg.p4``.

:class:`Controller` is a :class:`~homagg.p4._session.P4RuntimeSession` (``push``,
``check_pipeline``, idempotent writes) plus: ``configure`` (service address, L2 entries, flood
group), ``check_job`` (does a job fit the program), ``add_job`` (admission entries carrying the
job's token, result rewrite, multicast group, an admission epoch; for a job this switch is a
child for, docs/trees.md, the parent's results and the uplink), ``forget_source``, ``remove_job``
and ``read_counters`` (drop reasons and tree events named as the emulator's counters, packets
per admitted source).  Every operation is idempotent.

Registers are never written over P4Runtime: PI (the P4Runtime server in ``simple_switch_grpc``)
answers register writes and reads with UNIMPLEMENTED, and ``simple_switch_grpc`` has no thrift
server.  Instead each admission carries a random nonzero 32-bit epoch in its ``admit`` entries;
the data plane treats a cell stamped with another epoch as never used (``p4/state.p4``).

Invariants: a job's multicast group is never 0 nor ``FLOOD_GROUP`` and below 2^15 (PI's limit);
sizes and names come from ``p4/configuration.p4`` (:mod:`homagg.p4.source`), not copies.
"""

from __future__ import annotations

import ipaddress
import secrets
from typing import Any

from .._errors import ConfigError
from ..jobs import JobSpec
from ..wire import P4_WORDS
from ._session import P4RuntimeSession
from ._switches import SwitchConfig, ipv4_int, mac_int
from .source import P4Const, drop_reason_names, p4_constants, tree_event_names

__all__ = ["Controller"]


class Controller(P4RuntimeSession):
    """A P4Runtime session to one homagg.p4 device with the homagg operations.  A context manager.

    ``Controller(grpc_addr, device_id, p4info=..., bmv2_json=..., timeout=...)``; the build paths
    default to ``p4/build/`` (``homagg p4 build``).
    """

    @property
    def consts(self) -> dict[str, P4Const]:
        """``configuration.p4``'s constants (:func:`homagg.p4.source.p4_constants`)."""
        return p4_constants()

    @staticmethod
    def new_epoch() -> int:
        """A fresh admission epoch: random, nonzero (cells of a never-used pool are stamped 0)."""
        return secrets.randbits(32) or 1

    @staticmethod
    def mcast_group(job_id: int) -> int:
        """The job's result multicast group: the job id itself for ids 1 .. 32766, never 0 nor
        FLOOD_GROUP (0x7FFF); PI accepts group ids below 2^15 only."""
        return 1 + (job_id - 1) % 0x7FFE

    def configure(self, sw: SwitchConfig) -> None:
        """Service address, L2 forwarding entries and the flood group (idempotent)."""
        ups: list[tuple[str, Any]] = []
        if sw.service_ip:
            ups.append(("insert", self.table_entry("local_address", {"hdr.ipv4.dst_addr": ipv4_int(sw.service_ip)},
                                                   "service_address")))
        for h in sw.hosts:
            ups.append(("insert", self.table_entry("l2_forward", {"hdr.ethernet.dst_addr": mac_int(h.mac)},
                                                   "to_port", {"port": h.port})))
        flood = self.consts["FLOOD_GROUP"].value
        ups.append(("insert", self.multicast_entity(flood, [(p, 0) for p in sw.ports])))
        self.write(ups)

    @staticmethod
    def check_job(job: JobSpec, sw: SwitchConfig | None = None) -> None:
        """:class:`~homagg.ConfigError` unless ``job`` fits the P4 program: its slots inside the
        pool (``SLOT_POOL_SIZE``), at most ``P4_WORDS`` words per packet; given the switch ``sw``,
        a job it is a child for (``job.parent``) needs ``sw``'s service address (the child's data
        address, where the parent's results come back) and a host entry for the parent's IP (the
        port and MAC its up packets take).  Needs no switch."""
        pool = p4_constants()["SLOT_POOL_SIZE"].value
        if job.slot_base + job.n_slots > pool:
            raise ConfigError(f"job {job.job_id}: slots [{job.slot_base}, +{job.n_slots}) exceed the P4 pool of {pool}")
        if job.words_per_packet > P4_WORDS:
            raise ConfigError(f"job {job.job_id}: words_per_packet {job.words_per_packet} > {P4_WORDS} (P4 target)")
        if sw is not None and job.parent is not None:
            if not sw.service_ip or not sw.service_mac:
                raise ConfigError(f"job {job.job_id}: switch {sw.name} has no service address: it cannot be a child "
                                  "in a tree (its data address is where the parent's results come back)")
            sw.host(job.parent[0])

    def add_job(self, sw: SwitchConfig, job: JobSpec, *, epoch: int | None = None) -> None:
        """Admit ``job`` (every worker with an address): entries, multicast group, an epoch.

        Each ``admit`` entry carries ``job.token`` (wire v2): the data plane drops a packet of the
        source whose header token differs (``drop_token``).  A job with token 0 is unprotected.

        The epoch (see the module doc) makes every cell of the job's slot range read as zero, as a
        newly admitted job's state in the emulator; admitting again starts from zero again.  By
        default a fresh one (:meth:`new_epoch`); a caller that writes a job's entries in steps (a
        control agent, as workers register) passes the epoch it chose at admission, so that a later
        step does not reset the cells of the workers already running.
        """
        job.validate()
        self.check_job(job, sw)
        if not sw.service_ip or not sw.service_mac:
            raise ConfigError(f"switch {sw.name} has no service address: it cannot aggregate")
        if epoch is None:
            epoch = self.new_epoch()
        elif not 0 < epoch < 1 << 32:
            raise ConfigError(f"epoch {epoch}: nonzero, 32 bits")
        group = self.mcast_group(job.job_id)
        ups: list[tuple[str, Any]] = []
        replicas = []
        for w in sorted(job.workers, key=lambda w: w.worker_id):
            h = sw.host(w.ip)
            ups.append(("insert", self.table_entry(
                "admission", {"hdr.ipv4.src_addr": ipv4_int(w.ip), "hdr.udp.src_port": w.port}, "admit",
                {"job_id": job.job_id, "worker_id": w.worker_id, "slot_base": job.slot_base, "n_slots": job.n_slots,
                 "world_size": job.world_size, "words_per_packet": job.words_per_packet, "mcast_grp": group,
                 "worker_port": h.port, "epoch": epoch, "token": job.token})))
            ups.append(("insert", self.table_entry(
                "result_rewrite", {"hdr.homagg.job_id": job.job_id, "hdr.homagg.worker_id": w.worker_id}, "to_worker",
                {"switch_mac": mac_int(sw.service_mac), "switch_ip": ipv4_int(sw.service_ip),
                 "worker_mac": mac_int(h.mac), "worker_ip": ipv4_int(w.ip), "worker_port": w.port})))
            replicas.append((h.port, w.worker_id))
        ups.append(("insert", self.multicast_entity(group, replicas)))
        if job.parent is not None:
            ups += [("insert", e) for e in self._child_entries(sw, job, group, epoch)]
        self.write(ups)

    def _child_entries(self, sw: SwitchConfig, job: JobSpec, group: int, epoch: int) -> list[Any]:
        """Trees (``p4/tree.p4``): the entries of a job this switch is a child for -- results from
        the parent's data address admitted with the job's configuration (``parent_result``), and
        the ``uplink``: this switch's worker id at the parent, its data address (service MAC/IP,
        UDP port ``HOMAGG_UDP_PORT``), the parent's and the port towards it (its host entry)."""
        assert job.parent is not None
        parent_ip, parent_port = job.parent
        h = sw.host(parent_ip)
        return [
            self.table_entry("parent_result", self._parent_key(job), "from_parent",
                             {"slot_base": job.slot_base, "n_slots": job.n_slots, "world_size": job.world_size,
                              "words_per_packet": job.words_per_packet, "mcast_grp": group, "epoch": epoch,
                              "token": job.token}),
            self.table_entry("uplink", {"meta.job_id": job.job_id}, "child",
                             {"child_id": job.child_id, "switch_mac": mac_int(sw.service_mac or ""),
                              "switch_ip": ipv4_int(sw.service_ip or ""), "parent_mac": mac_int(h.mac),
                              "parent_ip": ipv4_int(parent_ip), "parent_port": parent_port,
                              "uplink_port": h.port}),
        ]

    @staticmethod
    def _parent_key(job: JobSpec) -> dict[str, int]:
        assert job.parent is not None
        return {"hdr.ipv4.src_addr": ipv4_int(job.parent[0]), "hdr.udp.src_port": job.parent[1],
                "hdr.homagg.job_id": job.job_id}

    def forget_source(self, ip: str, port: int) -> None:
        """Delete the admission entry of source ``(ip, port)`` (none: nothing to do), e.g. a
        worker's old address after it registered again from another: its datagrams no longer count."""
        self.write([("delete", self.table_entry("admission", {"hdr.ipv4.src_addr": ipv4_int(ip),
                                                              "hdr.udp.src_port": port}))], ignore_missing=True)

    def remove_job(self, sw: SwitchConfig, job: JobSpec) -> None:
        """Forget ``job``: its entries and group go (missing pieces ignored).

        Its cells keep their values but can no longer be reached; a later admission of the range
        gets a new epoch and reads them as zero.
        """
        ups: list[tuple[str, Any]] = []
        for w in job.workers:
            ups.append(("delete", self.table_entry("admission", {"hdr.ipv4.src_addr": ipv4_int(w.ip),
                                                                 "hdr.udp.src_port": w.port})))
            ups.append(("delete", self.table_entry("result_rewrite", {"hdr.homagg.job_id": job.job_id,
                                                                      "hdr.homagg.worker_id": w.worker_id})))
        ups.append(("delete", self.multicast_entity(self.mcast_group(job.job_id), [])))
        if job.parent is not None:
            ups.append(("delete", self.table_entry("parent_result", self._parent_key(job))))
            ups.append(("delete", self.table_entry("uplink", {"meta.job_id": job.job_id})))
        self.write(ups, ignore_missing=True)

    def read_counters(self) -> dict[str, Any]:
        """Drop reasons and tree events (``up``, ``retransmit_up``, ``result_down``) by emulator
        counter name, and per admitted source its packets."""
        out: dict[str, Any] = {}
        for counter, names in (("drop_reasons", drop_reason_names()), ("tree_events", tree_event_names())):
            c = self.info.get("counters", counter)
            for e in self.read(lambda ent, c=c: setattr(ent.counter_entry, "counter_id", c.preamble.id)):
                idx = e.counter_entry.index.index
                if idx in names:
                    out[names[idx]] = e.counter_entry.data.packet_count
        t = self.info.get("tables", "admission")
        mf_names = {m.id: m.name for m in t.match_fields}
        p_names = {p.id: p.name for p in self.info.get("actions", "admit").params}

        def fill(ent: Any) -> None:
            ent.table_entry.table_id = t.preamble.id
            ent.table_entry.counter_data.SetInParent()

        sources = []
        for e in self.read(fill):
            te = e.table_entry
            if not te.match:
                continue
            vals = {mf_names.get(m.field_id): int.from_bytes(m.exact.value, "big") for m in te.match}
            params = {p_names.get(p.param_id): int.from_bytes(p.value, "big") for p in te.action.action.params}
            ip = next(v for k, v in vals.items() if k and k.endswith("src_addr"))
            port = next(v for k, v in vals.items() if k and k.endswith("src_port"))
            sources.append({"ip": str(ipaddress.IPv4Address(ip)), "port": port,
                            "job_id": params.get("job_id"), "worker_id": params.get("worker_id"),
                            "packets": te.counter_data.packet_count})
        out["sources"] = sorted(sources, key=lambda s: (s["job_id"] or 0, s["worker_id"] or 0))
        return out
