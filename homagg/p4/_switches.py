"""The ``bmv2`` section of a job file: which switches the controller drives and how they are wired.

The job file is the emulator's (read by :func:`homagg.jobs.read_job_file`, JSON or TOML; its
``jobs`` list is :func:`homagg.jobs.load_jobs`'s) plus::

    "bmv2": {"switches": [{"name": "s1", "grpc": "127.0.0.1:9559", "device_id": 0,
                           "service_ip": "10.0.0.254", "service_mac": "02:48:41:00:00:fe",
                           "ports": [1, 2, 3, 4],
                           "hosts": [{"ip": "10.0.0.1", "mac": "02:...", "port": 1}, ...]}]}

``service_ip`` null (or absent, as TOML has no null) means a pure L2 switch (a leaf).  ``hosts``
maps each reachable MAC/IP to the switch port leading to it (also used for L2 forwarding; the
service MAC may be listed to route it up a leaf's uplink).  ``jobs`` (optional, the format of the
file's ``jobs`` list) are this switch's own jobs instead of the file's: a tree (docs/trees.md)
has one job id at every switch, each switch with its own members, a child with its ``parent``.

Invariant: a :class:`SwitchConfig` built by :meth:`SwitchConfig.from_dict` has integer ports and
string addresses; malformed descriptions raise :class:`~homagg.ConfigError`.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..jobs import JobSpec, read_job_file

__all__ = ["HostPort", "SwitchConfig", "load_switches", "ipv4_int", "mac_int"]

_MAC = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}")


def ipv4_int(text: str) -> int:
    """A dotted IPv4 address as the 32-bit integer a table key or action parameter holds;
    :class:`~homagg.ConfigError` if it is not one."""
    try:
        return int(ipaddress.IPv4Address(text))
    except ValueError as exc:
        raise ConfigError(f"{text!r} is not an IPv4 address") from exc


def mac_int(text: str) -> int:
    """A MAC address ``aa:bb:cc:dd:ee:ff`` as the 48-bit integer a table key or action parameter
    holds; :class:`~homagg.ConfigError` if it is not one."""
    if not isinstance(text, str) or not _MAC.fullmatch(text):
        raise ConfigError(f"{text!r} is not a MAC address (aa:bb:cc:dd:ee:ff)")
    return int(text.replace(":", ""), 16)


@dataclass(frozen=True)
class HostPort:
    """A host (IPv4 and MAC address) reachable through switch port ``port``."""

    ip: str
    mac: str
    port: int


@dataclass(frozen=True)
class SwitchConfig:
    """One BMv2 switch of the ``bmv2.switches`` list (see the module docstring)."""

    name: str
    grpc: str
    device_id: int = 0
    service_ip: str | None = None
    service_mac: str | None = None
    ports: tuple[int, ...] = ()
    hosts: tuple[HostPort, ...] = ()
    #: this switch's own jobs (a tree's), instead of the job file's ``jobs`` (empty: those)
    jobs: tuple[JobSpec, ...] = ()

    def host(self, ip: str) -> HostPort:
        """The host entry of ``ip``; :class:`~homagg.ConfigError` if the switch has none."""
        for h in self.hosts:
            if h.ip == ip:
                return h
        raise ConfigError(f"switch {self.name}: no host entry for {ip} (add it to bmv2.switches[].hosts)")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SwitchConfig:
        """Parse one entry of ``bmv2.switches``."""
        try:
            return cls(str(d.get("name", "s1")), str(d["grpc"]), int(d.get("device_id", 0)), d.get("service_ip"),
                       d.get("service_mac"), tuple(int(p) for p in d.get("ports", ())),
                       tuple(HostPort(str(h["ip"]), str(h["mac"]), int(h["port"])) for h in d.get("hosts", ())),
                       tuple(JobSpec.from_dict(j) for j in d.get("jobs", ())))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad bmv2 switch description {d!r}: {exc}") from exc


def load_switches(path: str | Path) -> list[SwitchConfig]:
    """Every switch of the job file's ``bmv2.switches`` section (JSON or TOML); at least one."""
    data = read_job_file(path)
    section = data.get("bmv2") if isinstance(data, dict) else None
    items = section.get("switches") if isinstance(section, dict) else None
    if not items:
        raise ConfigError(f"{path} has no bmv2.switches section")
    return [SwitchConfig.from_dict(d) for d in items]
