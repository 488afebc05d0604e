"""Aggregation job descriptions shared by the emulator, the worker transport and the P4 controller.

A *job* is a set of ``world_size`` workers that aggregate together through one switch.  The
switch's control plane admits it with a :class:`JobSpec`: a 16-bit ``job_id``, a range of slots
``[slot_base, slot_base + n_slots)`` of the switch's pool that this job alone uses, the payload
words per packet ``words_per_packet`` (K), and the workers' source addresses (``worker_id`` ->
IPv4, UDP port).  Addresses may be unknown at admission (UDP ports are picked by the OS); each
worker then *registers* its address before it sends (:meth:`homagg.transport.ControlClient.register`).

Invariants checked by :meth:`JobSpec.validate`: ``1 <= world_size <= MAX_WORKERS``; every worker id
``< world_size`` appears at most once; ``0 <= slot_base`` and ``slot_base + n_slots <= MAX_SLOTS``;
``1 <= words_per_packet <= MAX_WORDS_JUMBO``; ``0 <= job_id < 2**16``; ``0 <= token < 2**32``;
``child_id == 0`` without a ``parent``, else ``0 <= child_id < MAX_WORKERS``.

Trees (docs/trees.md): a switch whose job has a ``parent`` (its data address) is a *child* for
the job: it sends each completed use up to the parent as worker ``child_id`` of the parent's job
(same ``job_id``, ``token``, slots and words per packet at every switch of the tree) and passes
the result that comes down to its own workers.  :mod:`homagg.tree` plans trees of up to 1024 ranks.

``token`` is the job's admission token (wire v2): every data packet of the job carries it and the
switch drops packets of an admitted source whose token differs (``drop_token``).  The emulator's
``admit`` picks a random one when none is given (:meth:`homagg.transport.ControlClient.admit`);
a job file should give one (``token = 0x...``); a job without one has token 0, which any host
can guess (the switch logs such an admission as unprotected).  :func:`new_token` makes one.

Defaults, in one place (everything else imports them): :data:`EMULATOR` and :data:`P4`
(:class:`TargetDefaults`: words per packet and slots of a job on that target; a bare
:class:`JobSpec` takes the P4 ones, which every target accepts), :data:`SWITCH_POOL_SLOTS` (an
emulator's slot pool) and :func:`parse_addr`, the one ``HOST:PORT`` parser (``[v6]:PORT`` for IPv6).

Files: :func:`load_jobs` reads JSON (``{"jobs": [...]}`` or a list) or TOML (``[[jobs]]`` tables)::

    [[jobs]]
    job_id = 1
    world_size = 2
    slot_base = 0
    n_slots = 64
    words_per_packet = 32
    workers = [{worker_id = 0, ip = "10.0.0.1", port = 18497}, {worker_id = 1, ip = "10.0.0.2", port = 18497}]
"""

from __future__ import annotations

import json
import secrets
import tomllib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from .wire import MAX_SLOTS, MAX_WORDS_JUMBO, MAX_WORKERS, P4_WORDS

__all__ = [
    "free_slot_base",
    "TargetDefaults",
    "EMULATOR",
    "P4",
    "SWITCH_POOL_SLOTS",
    "parse_addr",
    "format_addr",
    "WorkerAddr",
    "JobSpec",
    "load_jobs",
    "read_job_file",
    "new_token",
]


@dataclass(frozen=True)
class TargetDefaults:
    """What a job gets on one switch target unless told otherwise.

    ``words_per_packet``: payload words per datagram (K); ``n_slots``: slots of the job's range,
    which is also each worker's send window in packets.
    """

    name: str
    words_per_packet: int
    n_slots: int


#: the Python emulator: jumbo datagrams (fastest on loopback; bench ddp: 80 vs 211 ms at 2048 words)
#: and a small window (the embedded default of the torch backend)
EMULATOR = TargetDefaults("emulator", words_per_packet=MAX_WORDS_JUMBO, n_slots=16)
#: the P4 program on BMv2 (``P4_WORDS`` registers per cell); also :class:`JobSpec`'s defaults
P4 = TargetDefaults("p4", words_per_packet=P4_WORDS, n_slots=64)
#: slots in an emulator's pool (``homagg switch --slots``); jobs take ranges of it
SWITCH_POOL_SLOTS = 4096


def parse_addr(text: str | tuple[str, int], default_port: int | None = None, *, source: str = "address",
               zero_port: bool = True) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[v6]:PORT"`` for IPv6) or a ``(host, port)`` tuple -> ``(host, port)``.

    ``default_port`` is used when ``text`` has no port (else that is an error); ``zero_port``
    allows port 0 (bind: the OS picks); ``source`` names the option in error messages.  The host
    must not be empty and an IPv6 host needs brackets.  Raises :class:`~homagg.ConfigError`.
    """
    if isinstance(text, (tuple, list)):
        host, port_text = str(text[0]), str(text[1])
    else:
        if not isinstance(text, str):
            raise ConfigError(f"{source}: expected 'HOST:PORT', got {type(text).__name__}")
        host, port_text = _split_host_port(text.strip(), source)
        if port_text is None:
            if default_port is None:
                raise ConfigError(f"{source}: expected 'HOST:PORT' ('[v6]:PORT' for IPv6), got {text!r}")
            port_text = str(default_port)
    if not host:
        raise ConfigError(f"{source}: empty host in {text!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"{source}: port {port_text!r} in {text!r} is not an integer") from None
    if not (0 if zero_port else 1) <= port <= 65535:
        raise ConfigError(f"{source}: port {port} in {text!r} outside {0 if zero_port else 1}..65535")
    return host, port


def _split_host_port(text: str, source: str) -> tuple[str, str | None]:
    """``(host, port text or None)`` of a stripped ``HOST[:PORT]`` / ``[v6][:PORT]``."""
    if text.startswith("["):
        host, close, rest = text[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            raise ConfigError(f"{source}: bad bracketed address {text!r} (expected '[v6]:PORT')")
        return host, rest[1:] if rest else None
    if text.count(":") > 1:
        raise ConfigError(f"{source}: IPv6 address {text!r} needs brackets: '[v6]:PORT'")
    host, sep, port_text = text.rpartition(":")
    return (host, port_text) if sep else (text, None)


def format_addr(addr: tuple[str, int]) -> str:
    """``(host, port)`` -> ``"host:port"`` (``"[v6]:port"``); :func:`parse_addr` reads it back."""
    host, port = addr
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def free_slot_base(jobs: Iterable[JobSpec], n_slots: int, pool_slots: int) -> int:
    """The first slot base where ``n_slots`` slots fit in a pool of ``pool_slots`` beside ``jobs``
    (first fit over their ranges); :class:`~homagg.ConfigError` if none."""
    taken = sorted((j.slot_base, j.slot_base + j.n_slots) for j in jobs)
    base = 0
    for lo, hi in taken:
        if base + n_slots <= lo:
            break
        base = max(base, hi)
    if base + n_slots > pool_slots:
        raise ConfigError(f"no {n_slots} free slots left in the pool of {pool_slots}")
    return base


def new_token() -> int:
    """A fresh random nonzero 32-bit job token (:attr:`JobSpec.token`)."""
    return secrets.randbits(32) or 1


@dataclass(frozen=True)
class WorkerAddr:
    """Where worker ``worker_id`` of a job sends from (and receives results)."""

    worker_id: int
    ip: str
    port: int

    @property
    def addr(self) -> tuple[str, int]:
        return (self.ip, self.port)


@dataclass(frozen=True)
class JobSpec:
    """One admitted (or to-be-admitted) aggregation job; see the module docstring for invariants."""

    job_id: int
    world_size: int
    slot_base: int = 0
    n_slots: int = P4.n_slots
    words_per_packet: int = P4.words_per_packet
    workers: tuple[WorkerAddr, ...] = field(default_factory=tuple)
    #: the switch forgets the job after this many seconds without a packet (None: never)
    idle_timeout_s: float | None = None
    #: the admission token every data packet of the job carries (wire v2; 0: unprotected)
    token: int = field(default=0, repr=False)
    #: aggregation trees (docs/trees.md): the data address of this switch's parent for the job, or
    #: None at the root (one-switch jobs are roots); a child sends each completed use up to it
    parent: tuple[str, int] | None = None
    #: the worker id this switch has at its parent (0 at a root)
    child_id: int = 0

    def validate(self) -> JobSpec:
        """Return ``self`` if consistent, else raise :class:`~homagg.ConfigError`."""
        if not 0 <= self.job_id < 1 << 16:
            raise ConfigError(f"job_id {self.job_id} outside [0, 65535]")
        if not 1 <= self.world_size <= MAX_WORKERS:
            raise ConfigError(f"job {self.job_id}: world_size {self.world_size} outside [1, {MAX_WORKERS}]")
        if self.n_slots < 1 or self.slot_base < 0 or self.slot_base + self.n_slots > MAX_SLOTS:
            raise ConfigError(f"job {self.job_id}: slots [{self.slot_base}, +{self.n_slots}) outside the 15-bit pool")
        if not 1 <= self.words_per_packet <= MAX_WORDS_JUMBO:
            raise ConfigError(f"job {self.job_id}: words_per_packet {self.words_per_packet} outside [1, {MAX_WORDS_JUMBO}]")
        ids = [w.worker_id for w in self.workers]
        if len(set(ids)) != len(ids) or any(not 0 <= i < self.world_size for i in ids):
            raise ConfigError(f"job {self.job_id}: bad worker ids {ids} for world_size {self.world_size}")
        if self.idle_timeout_s is not None and self.idle_timeout_s <= 0:
            raise ConfigError(f"job {self.job_id}: idle_timeout_s must be > 0")
        if not 0 <= self.token <= 0xFFFFFFFF:
            raise ConfigError(f"job {self.job_id}: token outside [0, 2**32)")
        if self.parent is None:
            if self.child_id != 0:
                raise ConfigError(f"job {self.job_id}: child_id {self.child_id} without a parent (a root has 0)")
        else:
            if not 0 <= self.child_id < MAX_WORKERS:
                raise ConfigError(f"job {self.job_id}: child_id {self.child_id} outside [0, {MAX_WORKERS}) (the "
                                  "parent's worker bitmap)")
            if self.parent in {w.addr for w in self.workers}:
                raise ConfigError(f"job {self.job_id}: parent {format_addr(self.parent)} is also one of its workers")
        return self

    @property
    def is_child(self) -> bool:
        """True when this switch sends the job's completed uses up to a parent (docs/trees.md)."""
        return self.parent is not None

    @property
    def slots(self) -> range:
        return range(self.slot_base, self.slot_base + self.n_slots)

    def with_worker(self, worker: WorkerAddr) -> JobSpec:
        """A copy with ``worker`` added or replacing the same worker id."""
        others = tuple(w for w in self.workers if w.worker_id != worker.worker_id)
        return replace(self, workers=tuple(sorted(others + (worker,), key=lambda w: w.worker_id))).validate()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["workers"] = [asdict(w) for w in self.workers]
        d["parent"] = None if self.parent is None else format_addr(self.parent)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSpec:
        known = {"job_id", "world_size", "slot_base", "n_slots", "words_per_packet", "workers", "idle_timeout_s",
                 "token", "parent", "child_id"}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown job fields {sorted(unknown)}")
        try:
            workers = tuple(
                WorkerAddr(int(w["worker_id"]), str(w["ip"]), int(w["port"])) for w in d.get("workers") or ()
            )
            spec = cls(
                job_id=int(d["job_id"]),
                world_size=int(d["world_size"]),
                slot_base=int(d.get("slot_base", 0)),
                n_slots=int(d.get("n_slots", P4.n_slots)),
                words_per_packet=int(d.get("words_per_packet", P4.words_per_packet)),
                workers=workers,
                idle_timeout_s=None if d.get("idle_timeout_s") is None else float(d["idle_timeout_s"]),
                token=_int(d.get("token") or 0),
                parent=None if d.get("parent") is None else parse_addr(d["parent"], source="parent", zero_port=False),
                child_id=int(d.get("child_id") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad job description {d!r}: {exc}") from exc
        return spec.validate()

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls.from_dict(json.loads(text))


def _int(v: Any) -> int:
    """An int from JSON/TOML: a number, or a string in any base Python reads (``"0x1f"``)."""
    return int(v, 0) if isinstance(v, str) else int(v)


def read_job_file(path: str | Path) -> Any:
    """The parsed document of a job file: TOML for a ``.toml`` suffix, JSON otherwise.

    Shared by :func:`load_jobs` and the P4 controller (which reads the file's ``bmv2`` section),
    so both accept the same formats.  Raises :class:`~homagg.ConfigError` if unreadable.
    """
    p = Path(path)
    try:
        if p.suffix == ".toml":
            return tomllib.loads(p.read_text())
        return json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read jobs from {p}: {exc}") from exc


def load_jobs(path: str | Path) -> list[JobSpec]:
    """Jobs from a ``.json`` or ``.toml`` file; slot ranges and job ids must not overlap."""
    p = Path(path)
    data = read_job_file(p)
    items = data.get("jobs", []) if isinstance(data, dict) else data
    jobs = [JobSpec.from_dict(d) for d in items]
    seen_ids: set[int] = set()
    used: set[int] = set()
    for j in jobs:
        if j.job_id in seen_ids:
            raise ConfigError(f"job_id {j.job_id} appears twice in {p}")
        if used & set(j.slots):
            raise ConfigError(f"job {j.job_id}: slots overlap another job in {p}")
        seen_ids.add(j.job_id)
        used |= set(j.slots)
    return jobs

