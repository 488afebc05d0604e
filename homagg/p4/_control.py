"""``homagg control``: the P4Runtime controller of a BMv2 ``simple_switch_grpc`` running homagg.p4.

It reads the same job description file as the emulator (``homagg.jobs.load_jobs``: the ``jobs``
list) plus a ``bmv2`` section describing the switch(es)::

    {"jobs": [...],
     "bmv2": {"switches": [{"name": "s1", "grpc": "127.0.0.1:9559", "device_id": 0,
                            "service_ip": "10.0.0.254", "service_mac": "02:48:41:00:00:fe",
                            "ports": [1, 2, 3, 4],
                            "hosts": [{"ip": "10.0.0.1", "mac": "02:...", "port": 1}, ...]}]}}

``service_ip`` null means a pure L2 switch (a leaf).  ``hosts`` maps each reachable MAC/IP to the
switch port leading to it (also used for L2 forwarding; the service MAC may be listed to route it
up a leaf's uplink).

Operations (all idempotent — an existing entry is modified, a missing one on removal is ignored):
``push`` (pipeline, unless the device already runs the same one), ``configure`` (service address,
L2 entries, flood group), ``add`` (job: admission, result rewrite, multicast group, and a fresh
admission epoch, which makes the job's cells read as zero), ``remove`` (job), ``counters``.

Registers are never written over P4Runtime: PI (the P4Runtime server in ``simple_switch_grpc``)
answers register writes and reads with UNIMPLEMENTED, and ``simple_switch_grpc`` has no thrift
server.  Instead each admission carries a random nonzero 32-bit epoch in its ``admit`` entries;
the data plane treats a cell stamped with another epoch as never used (``p4/state.p4``).  Errors: :class:`SwitchUnreachableError` when gRPC
does not answer, :class:`PipelineMismatchError` when the device runs another program.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigError, TransportError
from ..jobs import JobSpec, load_jobs
from ..wire import P4_WORDS
from .source import p4_constants

__all__ = [
    "SwitchUnreachableError",
    "PipelineMismatchError",
    "HostPort",
    "SwitchConfig",
    "P4Controller",
    "load_switches",
    "DROP_REASON_NAMES",
    "configure_parser",
    "run",
]

#: drop_reasons counter index -> emulator counter name (configuration.p4 DROP_*)
DROP_REASON_NAMES = {
    1: "drop_version", 2: "drop_op", 3: "drop_length", 4: "drop_result_flag", 5: "drop_unknown_source",
    6: "drop_admission_mismatch", 7: "drop_word_count", 8: "drop_slot_range", 9: "drop_duplicate",
    10: "drop_stale", 11: "drop_conflict", 12: "consumed", 13: "drop_short",
}


#: google.rpc canonical codes (as in p4.v1.Error.canonical_code)
_ALREADY_EXISTS, _NOT_FOUND = 6, 5


class SwitchUnreachableError(TransportError):
    """The switch's P4Runtime gRPC server did not answer."""


class PipelineMismatchError(ConfigError):
    """The device runs no pipeline, or one whose P4Info differs from ``p4/build``'s."""


@dataclass(frozen=True)
class HostPort:
    ip: str
    mac: str
    port: int


@dataclass(frozen=True)
class SwitchConfig:
    name: str
    grpc: str
    device_id: int = 0
    service_ip: str | None = None
    service_mac: str | None = None
    ports: tuple[int, ...] = ()
    hosts: tuple[HostPort, ...] = ()

    def host(self, ip: str) -> HostPort:
        for h in self.hosts:
            if h.ip == ip:
                return h
        raise ConfigError(f"switch {self.name}: no host entry for {ip} (add it to bmv2.switches[].hosts)")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SwitchConfig:
        try:
            return cls(str(d.get("name", "s1")), str(d["grpc"]), int(d.get("device_id", 0)), d.get("service_ip"),
                       d.get("service_mac"), tuple(int(p) for p in d.get("ports", ())),
                       tuple(HostPort(str(h["ip"]), str(h["mac"]), int(h["port"])) for h in d.get("hosts", ())))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad bmv2 switch description {d!r}: {exc}") from exc


def load_switches(path: str | Path) -> list[SwitchConfig]:
    data = json.loads(Path(path).read_text())
    items = (data.get("bmv2") or {}).get("switches") if isinstance(data, dict) else None
    if not items:
        raise ConfigError(f"{path} has no bmv2.switches section")
    return [SwitchConfig.from_dict(d) for d in items]


def _mac(text: str) -> int:
    return int(text.replace(":", ""), 16)


def _ip(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


def _enc(value: int, bits: int) -> bytes:
    if not 0 <= value < 1 << bits:
        raise ConfigError(f"value {value} does not fit {bits} bits")
    return value.to_bytes((bits + 7) // 8, "big")


@dataclass
class _P4Info:
    """Name -> id / widths lookups over a P4Info message."""

    msg: Any
    tables: dict[str, Any] = field(default_factory=dict)
    actions: dict[str, Any] = field(default_factory=dict)
    registers: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, Any] = field(default_factory=dict)
    direct_counters: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind in ("tables", "actions", "registers", "counters", "direct_counters"):
            d = getattr(self, kind)
            for obj in getattr(self.msg, kind):
                d[obj.preamble.name] = obj
                d[obj.preamble.name.split(".")[-1]] = obj

    def get(self, kind: str, name: str) -> Any:
        try:
            return getattr(self, kind)[name]
        except KeyError:
            raise PipelineMismatchError(f"P4Info has no {kind[:-1]} {name!r}") from None


class P4Controller:
    """One P4Runtime session (primary) to one device.  Use as a context manager."""

    def __init__(self, grpc_addr: str, device_id: int = 0, *, p4info: Path | None = None,
                 bmv2_json: Path | None = None, timeout: float = 10.0, election_id: int = 1) -> None:
        build = Path(__file__).resolve().parents[2] / "p4" / "build"
        self.addr, self.device_id, self.timeout = grpc_addr, device_id, timeout
        self.p4info_path = p4info or build / "homagg.p4info.txtpb"
        self.json_path = bmv2_json or build / "homagg.json"
        self.election_id = election_id
        if not self.p4info_path.is_file():
            raise ConfigError(f"{self.p4info_path} not found: run `homagg p4 build` first")
        try:
            import grpc
            from google.protobuf import text_format
            from p4.config.v1 import p4info_pb2
            from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc
        except ImportError as exc:
            raise ConfigError("the controller needs grpcio and p4runtime (pip install 'homagg[p4]')") from exc
        self._grpc, self._pb, self._p4info_pb2 = grpc, p4runtime_pb2, p4info_pb2
        msg = p4info_pb2.P4Info()
        text_format.Merge(self.p4info_path.read_text(), msg)
        self.info = _P4Info(msg)
        self._channel = grpc.insecure_channel(grpc_addr)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise SwitchUnreachableError(f"no P4Runtime server at {grpc_addr} (device {device_id}) "
                                         f"after {timeout}s: is simple_switch_grpc running?") from None
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
        import queue

        self._queue: queue.Queue[Any] = queue.Queue()
        self._stream = self.stub.StreamChannel(self._request_iter())
        self._arbitrate()
        self.consts = p4_constants()

    # -- session ---------------------------------------------------------------------------
    def _request_iter(self) -> Any:
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item

    def _arbitrate(self) -> None:
        req = self._pb.StreamMessageRequest()
        req.arbitration.device_id = self.device_id
        req.arbitration.election_id.high = 0
        req.arbitration.election_id.low = self.election_id
        self._queue.put(req)
        try:
            for resp in self._stream:
                if resp.HasField("arbitration"):
                    if resp.arbitration.status.code != 0:
                        raise TransportError(f"{self.addr}: not primary controller: {resp.arbitration.status.message}")
                    return
        except self._grpc.RpcError as exc:
            raise SwitchUnreachableError(f"{self.addr}: arbitration failed: {exc.details()}") from exc
        raise SwitchUnreachableError(f"{self.addr}: stream closed during arbitration")

    def close(self) -> None:
        if hasattr(self, "_queue"):
            self._queue.put(None)
        self._channel.close()

    def __enter__(self) -> P4Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pipeline ----------------------------------------------------------------------------
    def _cookie(self) -> int:
        h = hashlib.sha256(self.json_path.read_bytes() + self.p4info_path.read_bytes()).digest()
        return int.from_bytes(h[:8], "big")

    def device_cookie(self) -> int | None:
        """Cookie of the pipeline the device runs (None: no pipeline)."""
        req = self._pb.GetForwardingPipelineConfigRequest(device_id=self.device_id)
        req.response_type = self._pb.GetForwardingPipelineConfigRequest.COOKIE_ONLY
        try:
            resp = self.stub.GetForwardingPipelineConfig(req, timeout=self.timeout)
        except self._grpc.RpcError as exc:
            if exc.code() == self._grpc.StatusCode.FAILED_PRECONDITION:
                return None
            raise SwitchUnreachableError(f"{self.addr}: {exc.details()}") from exc
        return resp.config.cookie.cookie if resp.config.HasField("cookie") else None

    def push(self, force: bool = False) -> bool:
        """Install the pipeline unless the device already runs this very build; True if pushed."""
        cookie = self._cookie()
        if not force and self.device_cookie() == cookie:
            return False
        req = self._pb.SetForwardingPipelineConfigRequest(device_id=self.device_id)
        req.election_id.low = self.election_id
        req.action = self._pb.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT
        req.config.p4info.CopyFrom(self.info.msg)
        req.config.p4_device_config = self.json_path.read_bytes()
        req.config.cookie.cookie = cookie
        try:
            self.stub.SetForwardingPipelineConfig(req, timeout=max(self.timeout, 30))
        except self._grpc.RpcError as exc:
            raise PipelineMismatchError(f"{self.addr}: pipeline refused: {exc.details()}") from exc
        return True

    def check_pipeline(self) -> None:
        """Raise :class:`PipelineMismatchError` unless the device runs this build."""
        cookie = self.device_cookie()
        if cookie is None:
            raise PipelineMismatchError(f"{self.addr}: no pipeline installed (run `homagg control push`)")
        if cookie != self._cookie():
            raise PipelineMismatchError(f"{self.addr}: the device runs another pipeline than {self.json_path} "
                                        "(push it again)")

    # -- writes -------------------------------------------------------------------------------
    def _error_codes(self, exc: Any) -> list[tuple[int, str]]:
        """Per-update (canonical code, message) of a failed Write.

        PI answers a failed batch with gRPC status UNKNOWN and the real codes as ``p4.v1.Error``
        messages in the ``grpc-status-details-bin`` trailer (google.rpc.Status details).
        """
        out: list[tuple[int, str]] = []
        try:
            from google.rpc import status_pb2

            for key, value in exc.trailing_metadata() or ():
                if key == "grpc-status-details-bin":
                    st = status_pb2.Status()
                    st.ParseFromString(value)
                    for d in st.details:
                        err = self._pb.Error()
                        if d.Unpack(err):
                            out.append((err.canonical_code, err.message))
        except Exception:  # noqa: BLE001 - best effort: fall back to the status itself
            pass
        if not out:
            out.append((exc.code().value[0], exc.details() or ""))
        return out

    def _write(self, updates: list[tuple[str, Any]], *, ignore_missing: bool = False) -> None:
        """Apply updates one by one: INSERT falls back to MODIFY, DELETE of a missing entry is ignored."""
        U = self._pb.Update
        for kind, entity in updates:
            req = self._pb.WriteRequest(device_id=self.device_id)
            req.election_id.low = self.election_id
            up = req.updates.add()
            up.type = {"insert": U.INSERT, "modify": U.MODIFY, "delete": U.DELETE}[kind]
            up.entity.CopyFrom(entity)
            try:
                self.stub.Write(req, timeout=self.timeout)
            except self._grpc.RpcError as exc:
                if exc.code() == self._grpc.StatusCode.UNAVAILABLE:
                    raise SwitchUnreachableError(f"{self.addr}: {exc.details()}") from exc
                errors = self._error_codes(exc)
                codes = {c for c, _ in errors}
                text = "; ".join(m for _, m in errors) or str(exc.details())
                if kind == "insert" and _ALREADY_EXISTS in codes:
                    up.type = U.MODIFY
                    try:
                        self.stub.Write(req, timeout=self.timeout)
                        continue
                    except self._grpc.RpcError as exc2:
                        text2 = "; ".join(m for _, m in self._error_codes(exc2))
                        raise ConfigError(f"{self.addr}: modify failed: {text2}") from exc2
                if kind == "delete" and (ignore_missing or _NOT_FOUND in codes):
                    continue
                raise ConfigError(f"{self.addr}: {kind} failed: {text}") from exc

    def table_entry(self, table: str, match: dict[str, int], action: str | None = None,
                    params: dict[str, int] | None = None) -> Any:
        t = self.info.get("tables", table)
        ent = self._pb.Entity()
        te = ent.table_entry
        te.table_id = t.preamble.id
        fields = {m.name: m for m in t.match_fields}
        for name, value in match.items():
            mf = next((f for n, f in fields.items() if n == name or n.endswith("." + name)), None)
            if mf is None:
                raise PipelineMismatchError(f"table {table} has no match field {name}")
            fm = te.match.add()
            fm.field_id = mf.id
            fm.exact.value = _enc(value, mf.bitwidth)
        if action is not None:
            a = self.info.get("actions", action)
            te.action.action.action_id = a.preamble.id
            pinfo = {p.name: p for p in a.params}
            for name, value in (params or {}).items():
                p = te.action.action.params.add()
                p.param_id = pinfo[name].id
                p.value = _enc(value, pinfo[name].bitwidth)
        return ent

    def multicast_entity(self, group: int, replicas: list[tuple[int, int]]) -> Any:
        ent = self._pb.Entity()
        mg = ent.packet_replication_engine_entry.multicast_group_entry
        mg.multicast_group_id = group
        for port, rid in replicas:
            r = mg.replicas.add()
            r.egress_port = port
            r.instance = rid
        return ent

    @staticmethod
    def new_epoch() -> int:
        """A fresh admission epoch: random, nonzero (cells of a never-used pool are stamped 0)."""
        return secrets.randbits(32) or 1

    # -- homagg operations ----------------------------------------------------------------
    def configure(self, sw: SwitchConfig) -> None:
        """Service address, L2 forwarding entries and the flood group (idempotent)."""
        ups: list[tuple[str, Any]] = []
        if sw.service_ip:
            ups.append(("insert", self.table_entry("local_address", {"hdr.ipv4.dst_addr": _ip(sw.service_ip)},
                                                   "service_address")))
        for h in sw.hosts:
            ups.append(("insert", self.table_entry("l2_forward", {"hdr.ethernet.dst_addr": _mac(h.mac)},
                                                   "to_port", {"port": h.port})))
        flood = self.consts["FLOOD_GROUP"].value
        ups.append(("insert", self.multicast_entity(flood, [(p, 0) for p in sw.ports])))
        self._write(ups)

    @staticmethod
    def mcast_group(job_id: int) -> int:
        """The job's result multicast group: the job id itself for ids 1 .. 32766, never 0 nor
        FLOOD_GROUP (0x7FFF); PI accepts group ids below 2^15 only."""
        return 1 + (job_id - 1) % 0x7FFE

    def _check_job(self, job: JobSpec) -> None:
        pool = self.consts["SLOT_POOL_SIZE"].value
        if job.slot_base + job.n_slots > pool:
            raise ConfigError(f"job {job.job_id}: slots [{job.slot_base}, +{job.n_slots}) exceed the P4 pool of {pool}")
        if job.words_per_packet > P4_WORDS:
            raise ConfigError(f"job {job.job_id}: words_per_packet {job.words_per_packet} > {P4_WORDS} (P4 target)")

    def add_job(self, sw: SwitchConfig, job: JobSpec) -> None:
        """Admit ``job`` (every worker with an address): entries, multicast group, fresh epoch.

        The epoch (see the module doc) makes every cell of the job's slot range read as zero, as a
        newly admitted job's state in the emulator; admitting again starts from zero again.
        """
        job.validate()
        self._check_job(job)
        if not sw.service_ip or not sw.service_mac:
            raise ConfigError(f"switch {sw.name} has no service address: it cannot aggregate")
        epoch = self.new_epoch()
        group = self.mcast_group(job.job_id)
        ups: list[tuple[str, Any]] = []
        replicas = []
        for w in sorted(job.workers, key=lambda w: w.worker_id):
            h = sw.host(w.ip)
            ups.append(("insert", self.table_entry(
                "admission", {"hdr.ipv4.src_addr": _ip(w.ip), "hdr.udp.src_port": w.port}, "admit",
                {"job_id": job.job_id, "worker_id": w.worker_id, "slot_base": job.slot_base, "n_slots": job.n_slots,
                 "world_size": job.world_size, "words_per_packet": job.words_per_packet, "mcast_grp": group,
                 "worker_port": h.port, "epoch": epoch})))
            ups.append(("insert", self.table_entry(
                "result_rewrite", {"hdr.homagg.job_id": job.job_id, "hdr.homagg.worker_id": w.worker_id}, "to_worker",
                {"switch_mac": _mac(sw.service_mac), "switch_ip": _ip(sw.service_ip), "worker_mac": _mac(h.mac),
                 "worker_ip": _ip(w.ip), "worker_port": w.port})))
            replicas.append((h.port, w.worker_id))
        ups.append(("insert", self.multicast_entity(group, replicas)))
        self._write(ups)

    def remove_job(self, sw: SwitchConfig, job: JobSpec) -> None:
        """Forget ``job``: its entries and group go (missing pieces ignored).

        Its cells keep their values but can no longer be reached; a later admission of the range
        gets a new epoch and reads them as zero.
        """
        ups: list[tuple[str, Any]] = []
        for w in job.workers:
            ups.append(("delete", self.table_entry("admission", {"hdr.ipv4.src_addr": _ip(w.ip),
                                                                 "hdr.udp.src_port": w.port})))
            ups.append(("delete", self.table_entry("result_rewrite", {"hdr.homagg.job_id": job.job_id,
                                                                      "hdr.homagg.worker_id": w.worker_id})))
        ups.append(("delete", self.multicast_entity(self.mcast_group(job.job_id), [])))
        self._write(ups, ignore_missing=True)

    def read_counters(self) -> dict[str, Any]:
        """Drop reasons by emulator name, and per admitted source packets/bytes."""
        out: dict[str, Any] = {}
        c = self.info.get("counters", "drop_reasons")
        req = self._pb.ReadRequest(device_id=self.device_id)
        ent = req.entities.add()
        ent.counter_entry.counter_id = c.preamble.id
        for resp in self.stub.Read(req, timeout=self.timeout):
            for e in resp.entities:
                idx = e.counter_entry.index.index
                if idx in DROP_REASON_NAMES:
                    out[DROP_REASON_NAMES[idx]] = e.counter_entry.data.packet_count
        sources = []
        t = self.info.get("tables", "admission")
        mf_names = {m.id: m.name for m in t.match_fields}
        p_names = {p.id: p.name for p in self.info.get("actions", "admit").params}
        req = self._pb.ReadRequest(device_id=self.device_id)
        ent = req.entities.add()
        ent.table_entry.table_id = t.preamble.id
        ent.table_entry.counter_data.SetInParent()
        for resp in self.stub.Read(req, timeout=self.timeout):
            for e in resp.entities:
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


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("op", choices=("push", "configure", "add", "remove", "counters", "check", "setup"),
                        help="setup = push + configure + add every job of --config")
    parser.add_argument("--config", type=Path, required=True, help="job description file with a bmv2 section")
    parser.add_argument("--switch", default=None, help="name of the switch in the file (default: all)")
    parser.add_argument("--job", type=int, action="append", default=None, help="job id (default: all jobs)")
    parser.add_argument("--p4info", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="BMv2 JSON (default p4/build/homagg.json)")
    parser.add_argument("--force", action="store_true", help="push even if the device runs the same build")
    parser.add_argument("--timeout", type=float, default=10.0)


def run(args: argparse.Namespace) -> int:
    switches = [s for s in load_switches(args.config) if args.switch in (None, s.name)]
    if not switches:
        raise ConfigError(f"no switch named {args.switch!r} in {args.config}")
    jobs = [j for j in load_jobs(args.config) if args.job is None or j.job_id in args.job]
    report: dict[str, Any] = {}
    for sw in switches:
        with P4Controller(sw.grpc, sw.device_id, p4info=args.p4info, bmv2_json=args.json,
                          timeout=args.timeout) as ctl:
            if args.op in ("push", "setup"):
                report[sw.name] = {"pushed": ctl.push(force=args.force)}
            else:
                ctl.check_pipeline()
            if args.op in ("configure", "setup"):
                ctl.configure(sw)
            if args.op in ("add", "setup") and sw.service_ip:
                for j in jobs:
                    ctl.add_job(sw, j)
            if args.op == "remove":
                for j in jobs:
                    ctl.remove_job(sw, j)
            if args.op == "counters":
                report[sw.name] = ctl.read_counters()
            if args.op == "check":
                report[sw.name] = "ok"
    print(json.dumps(report, indent=2))
    return 0
