"""A management network beside the data network: every Mininet host and the root namespace on one
Linux bridge.

What it is for: the control plane and the host path must not depend on the switch they monitor.
With BMv2 the star's hosts reach each other only through ``simple_switch_grpc`` (``forward.p4``
forwards their ordinary traffic), and BMv2's control agent (gRPC on the root namespace's loopback,
see :mod:`topologies.bmv2_agent`) is not on the data network at all.  The management network
carries the rendezvous store, gloo (the homagg host path) and the switch's control port, as a
cluster's management/host network does, so a crashed switch stops only the aggregation.

Layout: bridge ``hgmbr`` in the root namespace with :data:`ROOT_IP`; host ``r`` gets interface
:data:`IFACE` (its end of a veth pair whose root end ``hgm<r>`` is a bridge port) with address
``mgmt_ip(r)``.  Every name starts with ``hg``, so :func:`topologies.runner.remove_leftovers`
removes what a crashed run left; :func:`add_management_network` also registers its own teardown
with the deployment (``extra_stop``).
"""

from __future__ import annotations

import subprocess
from typing import Any

from ._deploy import Deployment

__all__ = ["add_management_network", "mgmt_ip", "ROOT_IP", "IFACE", "BRIDGE"]

SUBNET = "192.168.254"
#: the root namespace's address on the management network (where agents of the root namespace listen)
ROOT_IP = f"{SUBNET}.254"
#: the management interface's name inside every host (namespaces: the same name everywhere)
IFACE = "mgmt0"
BRIDGE = "hgmbr"


def mgmt_ip(rank: int) -> str:
    """Host ``rank``'s address on the management network."""
    if not 0 <= rank < 250:
        raise ValueError(f"rank {rank}: the management subnet holds 250 hosts")
    return f"{SUBNET}.{rank + 1}"


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


def _remove() -> None:
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)


def add_management_network(dep: Deployment) -> list[str]:
    """Connect every worker host of ``dep`` (and the root namespace) to the management bridge;
    return the hosts' management addresses, by rank.  Idempotent teardown on ``dep.stop()``."""
    _remove()
    _ip("link", "add", BRIDGE, "type", "bridge")
    dep.extra_stop.append(_remove)
    _ip("addr", "add", f"{ROOT_IP}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    out: list[str] = []
    for r, site in enumerate(dep.workers):
        host: Any = site.host
        root_end, host_end = f"hgm{r}", f"hgm{r}p"
        subprocess.run(["ip", "link", "del", root_end], capture_output=True, check=False)
        _ip("link", "add", root_end, "type", "veth", "peer", "name", host_end)
        _ip("link", "set", host_end, "netns", str(host.pid))
        _ip("link", "set", root_end, "master", BRIDGE)
        _ip("link", "set", root_end, "up")
        ip = mgmt_ip(r)
        text = host.cmd(f"ip link set {host_end} name {IFACE} && ip addr add {ip}/24 dev {IFACE} "
                        f"&& ip link set {IFACE} up && ip link set lo up; echo rc=$?")
        if "rc=0" not in text:
            raise RuntimeError(f"management interface of {host.name}: {text.strip()}")
        out.append(ip)
    return out
