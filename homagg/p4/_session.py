"""One P4Runtime session (primary controller) to one device: pipeline, idempotent writes, reads.

Nothing here knows about homagg jobs; :class:`homagg.p4.Controller` builds the homagg operations
on top.  grpcio and p4runtime (``pip install 'homagg[p4]'``) are imported when a session opens.

Invariants: after construction the session is the device's primary controller (arbitration
succeeded) and holds the parsed P4Info of ``p4info``; the pipeline's *cookie* is a hash of the
BMv2 JSON and the P4Info, so :meth:`P4RuntimeSession.push` is a no-op when the device already
runs this very build.  Writes are idempotent: an INSERT of an existing entry becomes a MODIFY, a
DELETE of a missing entry is ignored.  Errors: :class:`SwitchUnreachableError` when gRPC does not
answer, :class:`PipelineMismatchError` when the device runs no or another pipeline, or the
P4Info lacks a name; other refused writes raise :class:`~homagg.ConfigError`.
"""

from __future__ import annotations

import hashlib
import queue
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from .._errors import ConfigError, TransportError
from .source import P4_DIR

__all__ = ["SwitchUnreachableError", "PipelineMismatchError", "P4RuntimeSession", "encode"]

#: google.rpc canonical codes (as in p4.v1.Error.canonical_code)
_ALREADY_EXISTS, _NOT_FOUND = 6, 5


class SwitchUnreachableError(TransportError):
    """The switch's P4Runtime gRPC server did not answer."""


class PipelineMismatchError(ConfigError):
    """The device runs no pipeline, or one whose P4Info differs from ``p4/build``'s."""


def encode(value: int, bits: int) -> bytes:
    """``value`` as the big-endian bytes of a ``bit<bits>`` P4Runtime value (must fit)."""
    if not 0 <= value < 1 << bits:
        raise ConfigError(f"value {value} does not fit {bits} bits")
    return value.to_bytes((bits + 7) // 8, "big")


@dataclass
class _P4Info:
    """Name -> object lookups over a P4Info message (full names and last name components)."""

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


class P4RuntimeSession:
    """A primary P4Runtime session to ``device_id`` at ``grpc_addr``.  Use as a context manager."""

    def __init__(self, grpc_addr: str, device_id: int = 0, *, p4info: Path | None = None,
                 bmv2_json: Path | None = None, timeout: float = 10.0, election_id: int = 1) -> None:
        build = P4_DIR / "build"
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
        self._grpc, self._pb = grpc, p4runtime_pb2
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
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stream = self.stub.StreamChannel(self._request_iter())
        self._arbitrate()

    # -- session ---------------------------------------------------------------------------
    def _request_iter(self) -> Iterator[Any]:
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
        """End the stream and close the channel (idempotent)."""
        if hasattr(self, "_queue"):
            self._queue.put(None)
        self._channel.close()

    def __enter__(self) -> Self:
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

    def write(self, updates: list[tuple[str, Any]], *, ignore_missing: bool = False) -> None:
        """Apply ``(kind, entity)`` updates one by one (kind: insert / modify / delete).

        An INSERT of an existing entry falls back to MODIFY; a DELETE of a missing entry is
        ignored (any refused DELETE with ``ignore_missing``).
        """
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
        """An Entity holding an exact-match entry of ``table`` (names as in the P4 source)."""
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
            fm.exact.value = encode(value, mf.bitwidth)
        if action is not None:
            a = self.info.get("actions", action)
            te.action.action.action_id = a.preamble.id
            pinfo = {p.name: p for p in a.params}
            for name, value in (params or {}).items():
                p = te.action.action.params.add()
                p.param_id = pinfo[name].id
                p.value = encode(value, pinfo[name].bitwidth)
        return ent

    def multicast_entity(self, group: int, replicas: list[tuple[int, int]]) -> Any:
        """An Entity holding multicast group ``group`` with ``(egress port, instance)`` replicas."""
        ent = self._pb.Entity()
        mg = ent.packet_replication_engine_entry.multicast_group_entry
        mg.multicast_group_id = group
        for port, rid in replicas:
            r = mg.replicas.add()
            r.egress_port = port
            r.instance = rid
        return ent

    # -- reads --------------------------------------------------------------------------------
    def read(self, fill: Any) -> Iterator[Any]:
        """Entities answering a one-entity ReadRequest; ``fill(entity)`` sets what to read."""
        req = self._pb.ReadRequest(device_id=self.device_id)
        fill(req.entities.add())
        try:
            for resp in self.stub.Read(req, timeout=self.timeout):
                yield from resp.entities
        except self._grpc.RpcError as exc:
            if exc.code() == self._grpc.StatusCode.UNAVAILABLE:
                raise SwitchUnreachableError(f"{self.addr}: {exc.details()}") from exc
            raise ConfigError(f"{self.addr}: read failed: {exc.details()}") from exc
