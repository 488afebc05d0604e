"""BF Runtime control plane for ``p4/tofino/``: the same job description as the P4Runtime one.

:func:`job_entries` turns a :class:`~homagg.jobs.JobSpec` and the switch description
(:class:`~homagg.p4.SwitchConfig`, the job file's ``bmv2`` section) into the BF Runtime writes
that admit the job on the Tofino program: ``admission``, ``admitted_job``, ``admitted_token``,
``word_limit``, ``slot_range``, ``result_rewrite`` entries, the job's multicast group (PRE
``$pre.mgid`` / ``$pre.node``), and the register cells of the job's slot range cleared (the v1model
program's epochs are not needed: BF Runtime writes registers).  Trees (docs/trees.md): for a job
with a ``parent`` (this switch is a *child*) the ``admit`` entries carry ``child = 1`` and the port
towards the parent, and three more entries admit the parent's results and address the uses sent
up: ``from_parent`` (the parent's data address and the job -> the job's group), ``parent_token``
and the egress ``parent_rewrite`` (from the switch's data address to the parent's, as worker
``child_id``); a root's (``parent`` None) are today's.  :func:`switch_entries` gives the
service address, L2 entries and the flood group.  :func:`check_entries` validates writes against
the compiled ``bfrt.json`` (table, key, action and data names; values fit their widths): the
compiler's output is the oracle.  Sending them needs ``bf_switchd``'s gRPC server
(``bfrt_grpc``, open-p4studio), which this repository does not include: a :class:`BfrtWrite`
is plain data.

Invariants: every write names a table of the program (``pipe.`` prefix added); a job's words per
packet never exceeds ``words``, which :func:`compiled_words` reads from the compiled program (the
words its parser takes and its Word stages combine, :mod:`homagg.p4._compiled`); the multicast group is the P4Runtime
controller's (:meth:`homagg.p4.Controller.mcast_group`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..jobs import JobSpec
from ._controller import Controller
from ._switches import HostPort, SwitchConfig, ipv4_int, mac_int
from ._compiled import compiled_words as _compiled_words
from .source import p4_constants

__all__ = ["BfrtWrite", "job_entries", "switch_entries", "check_entries", "load_bfrt", "compiled_words"]

_IG = "pipe.HomaggIngress."
_EG = "pipe.HomaggEgress."
#: register pairs of a cell (2 per slot) and their fields, cleared when a job is admitted (the
#: words and the down bit are not: each use's FIRST writes them before anything reads them)
CELL_REGISTERS = {"bitmap_check.use_state": ("missing", "key"), "use_key.use_offset": ("offset", "key")}


@dataclass(frozen=True)
class BfrtWrite:
    """One BF Runtime entry: ``table`` (full name), ``key`` {field: value or (low, high) for a range},
    ``action`` (full name, or None for a register/PRE entry) and ``data`` {field: value}."""

    table: str
    key: dict[str, Any]
    action: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


def load_bfrt(path: str | Path) -> dict[str, Any]:
    """The compiled ``bfrt.json`` as a dict; :class:`~homagg.ConfigError` if unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc


def switch_entries(sw: SwitchConfig) -> list[BfrtWrite]:
    """Service address, L2 forwarding and the flood group (as :meth:`Controller.configure`)."""
    out: list[BfrtWrite] = []
    if sw.service_ip:
        out.append(BfrtWrite(_IG + "admission.local_address", {"hdr.ipv4.dst_addr": ipv4_int(sw.service_ip)},
                             "HomaggIngress.admission.service_address"))
    for h in sw.hosts:
        out.append(BfrtWrite(_IG + "forward.l2_forward", {"hdr.ethernet.dst_addr": mac_int(h.mac)},
                             "HomaggIngress.forward.to_port", {"port": h.port}))
    flood = p4_constants()["FLOOD_GROUP"].value
    out += _group(flood, [(p, 0) for p in sw.ports])
    return out


def _group(mgid: int, replicas: list[tuple[int, int]]) -> list[BfrtWrite]:
    nodes = [BfrtWrite("$pre.node", {"$MULTICAST_NODE_ID": mgid << 8 | i}, None,
                       {"$MULTICAST_RID": rid, "$DEV_PORT": [port]}) for i, (port, rid) in enumerate(replicas)]
    return nodes + [BfrtWrite("$pre.mgid", {"$MGID": mgid}, None,
                              {"$MULTICAST_NODE_ID": [n.key["$MULTICAST_NODE_ID"] for n in nodes],
                               "$MULTICAST_NODE_L1_XID_VALID": [False] * len(nodes),
                               "$MULTICAST_NODE_L1_XID": [0] * len(nodes)})]


def job_entries(sw: SwitchConfig, job: JobSpec, *, words: int) -> list[BfrtWrite]:
    """The writes that admit ``job`` on a program of ``words`` words per pass (cleared cells first).

    Both roles (docs/trees.md): a job with a ``parent`` is admitted as a child (see the module).
    Raises :class:`~homagg.ConfigError` when the job does not fit (slots beyond the pool, more
    words per packet than ``words``, no service address, a worker or the parent without a host
    entry)."""
    job.validate()
    pool = p4_constants()["SLOT_POOL_SIZE"].value
    if job.slot_base + job.n_slots > pool:
        raise ConfigError(f"job {job.job_id}: slots [{job.slot_base}, +{job.n_slots}) exceed the pool of {pool}")
    if job.words_per_packet > words:
        raise ConfigError(f"job {job.job_id}: words_per_packet {job.words_per_packet} > {words} (this Tofino build)")
    if not sw.service_ip or not sw.service_mac:
        raise ConfigError(f"switch {sw.name} has no service address: it cannot aggregate")
    parent = sw.host(job.parent[0]) if job.parent is not None else None
    child = {"child": int(parent is not None), "parent_port": parent.port if parent is not None else 0}
    out: list[BfrtWrite] = []
    for slot in job.slots:
        for cell in (2 * slot, 2 * slot + 1):
            for reg, fields in CELL_REGISTERS.items():
                out.append(BfrtWrite(_IG + reg, {"$REGISTER_INDEX": cell}, None,
                                     {f"HomaggIngress.{reg}.{f}": 0 for f in fields}))
    group = Controller.mcast_group(job.job_id)
    replicas = []
    for w in sorted(job.workers, key=lambda w: w.worker_id):
        h = sw.host(w.ip)
        src = {"hdr.ipv4.src_addr": ipv4_int(w.ip), "hdr.udp.src_port": w.port}
        out.append(BfrtWrite(_IG + "admission.admission", src, "HomaggIngress.admission.admit",
                             {"world_size": job.world_size, "mcast_grp": group, "worker_port": h.port, **child}))
        ids = {**src, "hdr.homagg.job_id": job.job_id, "hdr.homagg.worker_id": w.worker_id}
        others = ((1 << job.world_size) - 1) & ~(1 << w.worker_id)  # the job's workers but this one
        out.append(BfrtWrite(_IG + "admission.admitted_job", ids, "HomaggIngress.admission.job_consistent",
                             {"others": others}))
        out.append(BfrtWrite(_IG + "admission.admitted_token", {**ids, "hdr.homagg.token": job.token},
                             "HomaggIngress.admission.token_consistent"))
        out.append(BfrtWrite(_EG + "rewrite.result_rewrite",
                             {"hdr.homagg.job_id": job.job_id, "hdr.homagg.worker_id": w.worker_id},
                             "HomaggEgress.rewrite.to_worker",
                             {"switch_mac": mac_int(sw.service_mac), "switch_ip": ipv4_int(sw.service_ip),
                              "worker_mac": mac_int(h.mac), "worker_ip": ipv4_int(w.ip), "worker_port": w.port}))
        replicas.append((h.port, w.worker_id))
    out.append(BfrtWrite(_IG + "admission.word_limit",
                         {"hdr.homagg.job_id": job.job_id, "hdr.homagg.word_count": (1, job.words_per_packet),
                          "$MATCH_PRIORITY": 0}, "HomaggIngress.admission.words_allowed"))
    out.append(BfrtWrite(_IG + "admission.slot_range",
                         {"hdr.homagg.job_id": job.job_id,
                          "hdr.homagg.slot": (job.slot_base, job.slot_base + job.n_slots - 1),
                          "$MATCH_PRIORITY": 0}, "HomaggIngress.admission.slot_in_range"))
    if parent is not None:
        out += _child_entries(sw, job, parent, group)
    return out + _group(group, replicas)


def _child_entries(sw: SwitchConfig, job: JobSpec, parent: HostPort, group: int) -> list[BfrtWrite]:
    """Trees: the parent's results admitted (address, job, token) and the uses sent up addressed."""
    assert job.parent is not None
    ip, port = job.parent
    src = {"hdr.ipv4.src_addr": ipv4_int(ip), "hdr.udp.src_port": port, "hdr.homagg.job_id": job.job_id}
    return [
        BfrtWrite(_IG + "admission.from_parent", src, "HomaggIngress.admission.parent_result", {"down_grp": group}),
        BfrtWrite(_IG + "admission.parent_token", {**src, "hdr.homagg.token": job.token},
                  "HomaggIngress.admission.parent_token_consistent"),
        BfrtWrite(_EG + "rewrite.parent_rewrite", {"hdr.homagg.job_id": job.job_id}, "HomaggEgress.rewrite.to_parent",
                  {"switch_mac": mac_int(sw.service_mac), "switch_ip": ipv4_int(sw.service_ip),
                   "parent_mac": mac_int(parent.mac), "parent_ip": ipv4_int(ip), "parent_port": port,
                   "child_id": job.child_id}),
    ]


def _fits(value: Any, width: int | None, what: str) -> None:
    values = value if isinstance(value, (tuple, list)) else [value]
    for v in values:
        if width is not None and isinstance(v, int) and not isinstance(v, bool) and not 0 <= v < 1 << width:
            raise ConfigError(f"{what}: {v} does not fit {width} bits")


def check_entries(bfrt: dict[str, Any], writes: list[BfrtWrite]) -> int:
    """Check ``writes`` against the compiled ``bfrt.json``; returns how many were checked.

    PRE entries (``$pre.*``) are fixed-function tables not listed per program and are skipped.
    Raises :class:`~homagg.ConfigError` naming the first unknown table, field, action or a value
    wider than its field."""
    tables = {t["name"]: t for t in bfrt["tables"]}
    checked = 0
    for w in writes:
        if w.table.startswith("$pre."):
            continue
        t = tables.get(w.table)
        if t is None:
            raise ConfigError(f"bfrt.json has no table {w.table}")
        keys = {k["name"]: k for k in t["key"]}
        for name, value in w.key.items():
            if name not in keys:
                raise ConfigError(f"{w.table}: no key field {name} (has {sorted(keys)})")
            if isinstance(value, tuple) != (keys[name]["match_type"] == "Range"):
                raise ConfigError(f"{w.table}.{name}: {keys[name]['match_type']} match, got {value!r}")
            _fits(value, keys[name]["type"].get("width"), f"{w.table}.{name}")
        missing = {n for n, k in keys.items() if (k.get("mandatory") or not n.startswith("$")) and n not in w.key}
        if missing:
            raise ConfigError(f"{w.table}: key fields {sorted(missing)} missing")
        if w.action is None:
            data = {d["singleton"]["name"]: d["singleton"] for d in t.get("data", []) if "singleton" in d}
        else:
            specs = {a["name"]: a for a in t.get("action_specs", [])}
            if w.action not in specs:
                raise ConfigError(f"{w.table}: no action {w.action} (has {sorted(specs)})")
            data = {d["name"]: d for d in specs[w.action].get("data", [])}
            if set(data) != set(w.data):
                raise ConfigError(f"{w.action}: data {sorted(w.data)} != {sorted(data)}")
        for name, value in w.data.items():
            if name not in data:
                raise ConfigError(f"{w.table}: no data field {name} (has {sorted(data)})")
            _fits(value, data[name]["type"].get("width"), f"{w.table}.{name}")
        checked += 1
    return checked


def compiled_words(build: str | Path) -> int:
    """Words per pass of the program compiled into ``build`` (a ``-g`` build folder): the
    ``words`` to give :func:`job_entries` (:func:`homagg.p4._compiled.compiled_words`)."""
    return _compiled_words(build).per_pass
