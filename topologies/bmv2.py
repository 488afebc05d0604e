"""BMv2 in Mininet: a switch node running ``simple_switch_grpc``, configured by ``homagg control``.

:class:`Bmv2Switch` starts ``simple_switch_grpc --no-p4`` in the root namespace with port ``n``
bound to its ``n``-th interface, gRPC on ``127.0.0.1:<grpc_port>``; the pipeline, entries and
groups are then pushed by :class:`homagg.p4.Controller` (so the controller path is the one a user
runs).  ``attach_star`` / ``attach_two_tier`` give a :class:`~topologies._deploy.Deployment`
its ``bmv2_config`` (the ``bmv2`` section of the job file), ``start_bmv2`` and ``bmv2_status``.
``kill_bmv2`` / ``restart_bmv2``: a crash (SIGKILL) and a restart with the pipeline and entries
pushed again through the same controller path (:func:`configure_bmv2`).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import types
from pathlib import Path
from typing import Any

from ._addresses import SERVICE_IP, SERVICE_MAC, leaf_service
from ._deploy import Deployment
from ._mn import import_mininet

__all__ = ["Bmv2Switch", "attach_star", "attach_two_tier", "configure_bmv2", "kill_bmv2", "restart_bmv2",
           "SIMPLE_SWITCH", "PORT_OFFLOADS_OFF"]

SIMPLE_SWITCH = "simple_switch_grpc"

#: ``ethtool -K`` settings of every interface BMv2 binds.  BMv2 reads its ports with libpcap, whose
#: capture ring has a fixed size (2 MB by default, which BMv2 does not change); while the interface
#: has TSO/GSO (a veth has both on) libpcap must expect merged 64 KB packets and sizes every ring
#: frame for one, so the ring holds ~30 packets and a window of datagrams arriving together
#: overflows it -- silently, before BMv2's parser counts anything.  Measured on a lossless 4-worker
#: star (60,000 elements, 4 schemes): 1.2-8.5% of first sends retransmitted (11 runs) with only
#: checksum offload off; 0 of 10,344 in each of 7 runs with segmentation offloads off too.
PORT_OFFLOADS_OFF = ("tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off")

import_mininet()
from mininet.node import Switch  # noqa: E402


class Bmv2Switch(Switch):
    """A Mininet switch whose data plane is ``simple_switch_grpc`` (no pipeline until pushed)."""

    def __init__(self, name: str, device_id: int = 0, grpc_port: int = 9559, thrift_port: int = 9090,
                 **kw: Any) -> None:
        kw.setdefault("dpid", f"{device_id + 1:016x}")
        kw["inNamespace"] = False  # Mininet passes its default (False) too: ours must win, once
        Switch.__init__(self, name, **kw)
        self.device_id, self.grpc_port, self.thrift_port = device_id, grpc_port, thrift_port
        self.log_path: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def port_map(self) -> dict[int, str]:
        return {p: i.name for p, i in self.intfs.items() if i.name != "lo"}

    def start(self, controllers: list[Any]) -> None:
        exe = shutil.which(SIMPLE_SWITCH)
        if exe is None:
            raise RuntimeError(f"{SIMPLE_SWITCH} not on PATH")
        args = [exe, "--device-id", str(self.device_id), "--thrift-port", str(self.thrift_port)]
        for port, intf in sorted(self.port_map().items()):
            subprocess.run(["ethtool", "-K", intf, *PORT_OFFLOADS_OFF], capture_output=True, check=False)
            args += ["-i", f"{port}@{intf}"]
        args += ["--no-p4", "--", "--grpc-server-addr", self.grpc_addr]
        log = open(self.log_path or f"/tmp/{self.name}.log", "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def stop(self, deleteIntfs: bool = True) -> None:  # noqa: N803 - Mininet's signature
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        Switch.stop(self, deleteIntfs)


def configure_bmv2(node: Bmv2Switch, cfg: Any, jobs: tuple[Any, ...] = (), built: Any = None,
                   wait_s: float = 30.0) -> None:
    """Wait until ``node``'s ``simple_switch_grpc`` answers on gRPC, then push the pipeline and
    configure it (service address, L2 entries, flood group) and admit ``jobs`` -- the controller
    path ``homagg control setup`` runs.  ``cfg``: its :class:`homagg.p4.SwitchConfig`; ``built``:
    :func:`homagg.p4._build.build`'s result (built now if None)."""
    from homagg.p4 import Controller, SwitchUnreachableError
    from homagg.p4._build import build

    res = built or build()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            ctl = Controller(cfg.grpc, cfg.device_id, p4info=res.p4info, bmv2_json=res.json, timeout=2)
            break
        except SwitchUnreachableError:
            if time.monotonic() > deadline or (node.proc is not None and node.proc.poll() is not None):
                raise
    with ctl:
        ctl.push()
        ctl.configure(cfg)
        if cfg.service_ip:
            for j in jobs:
                ctl.add_job(cfg, j)


def kill_bmv2(node: Bmv2Switch) -> int:
    """SIGKILL ``node``'s ``simple_switch_grpc`` (a crash: no cleanup of its own); its pid."""
    if node.proc is None or node.proc.poll() is not None:
        raise RuntimeError(f"{node.name}: {SIMPLE_SWITCH} is not running")
    pid = node.proc.pid
    node.proc.kill()
    node.proc.wait(timeout=10)
    return pid


def restart_bmv2(dep: Deployment, node: Bmv2Switch, log: Path, built: Any = None) -> float:
    """Start ``node``'s ``simple_switch_grpc`` again (same ports, log to ``log``) and reload the
    same compiled program as at first (:func:`configure_bmv2`, no jobs: a job is admitted by
    whoever runs it); the seconds it took.  ``built``: the build pushed at first (default: what
    ``p4/build/`` holds now; nothing is compiled)."""
    from homagg.p4 import SwitchConfig
    from homagg.p4._build import default_build_dir

    t0 = time.monotonic()
    if node.proc is not None and node.proc.poll() is None:
        raise RuntimeError(f"{node.name}: {SIMPLE_SWITCH} is still running")
    if built is None:
        d = default_build_dir()
        built = types.SimpleNamespace(json=d / "homagg.json", p4info=d / "homagg.p4info.txtpb")
    switches = dep.bmv2_config["bmv2"]["switches"]  # type: ignore[attr-defined]
    cfg = next(SwitchConfig.from_dict(d) for d in switches if d["name"] == node.name)
    node.log_path = log
    node.start([])
    configure_bmv2(node, cfg, built=built)
    return time.monotonic() - t0


def _start_bmv2(dep: Deployment, out: Path, job_file: Path) -> None:
    from homagg.jobs import load_jobs
    from homagg.p4 import SwitchConfig
    from homagg.p4._build import build

    res = build()
    for host in (s.host for s in dep.workers):
        for intf in host.intfList():
            host.cmd(f"ethtool -K {intf.name} tx off rx off >/dev/null 2>&1")
    for sw in dep.switch_nodes:
        sw.log_path = out / "logs" / f"{sw.name}.log"
        sw.start([])
    jobs = tuple(load_jobs(job_file))
    configs = {d["name"]: SwitchConfig.from_dict(d) for d in dep.bmv2_config["bmv2"]["switches"]}  # type: ignore[attr-defined]
    for sw in dep.switch_nodes:  # a switch with its own jobs (a tree's) admits those
        configure_bmv2(sw, configs[sw.name], configs[sw.name].jobs or jobs, res)


def _bmv2_status(dep: Deployment) -> dict[str, Any]:
    from homagg.p4 import Controller, SwitchConfig

    out: dict[str, Any] = {}
    for d in dep.bmv2_config["bmv2"]["switches"]:  # type: ignore[attr-defined]
        cfg = SwitchConfig.from_dict(d)
        if not cfg.service_ip:
            continue
        try:
            with Controller(cfg.grpc, cfg.device_id, timeout=5) as ctl:
                out[cfg.name] = ctl.read_counters()
        except Exception as exc:  # noqa: BLE001 - status is informative
            out[cfg.name] = {"error": str(exc)}
    return out


def _attach(dep: Deployment, switches: list[dict[str, Any]]) -> None:
    dep.bmv2_config = {"bmv2": {"switches": switches}}  # type: ignore[attr-defined]
    dep.start_bmv2 = types.MethodType(_start_bmv2, dep)  # type: ignore[attr-defined]
    dep.bmv2_status = types.MethodType(_bmv2_status, dep)  # type: ignore[attr-defined]


def attach_star(dep: Deployment, hosts: list[dict[str, Any]], service_ip: str, service_mac: str) -> None:
    sw = dep.switch_nodes[0]
    _attach(dep, [{"name": sw.name, "grpc": sw.grpc_addr, "device_id": sw.device_id, "service_ip": service_ip,
                   "service_mac": service_mac, "ports": [h["port"] for h in hosts], "hosts": hosts}])


def attach_two_tier(dep: Deployment, hosts: list[dict[str, Any]], racks: int, tree: bool = False) -> None:
    """The ``bmv2`` section of a two-tier deployment: the spine (port ``l + 1`` to leaf ``l``)
    aggregates; leaves (port 1 up) forward, or with ``tree`` aggregate too (their service
    addresses, :func:`topologies._addresses.leaf_service`, reachable from the spine)."""
    spine, leaves = dep.switch_nodes[0], dep.switch_nodes[1:]
    spine_hosts = [{"ip": h["ip"], "mac": h["mac"], "port": h["rack"] + 1} for h in hosts]
    if tree:
        spine_hosts += [{"ip": leaf_service(l)[0], "mac": leaf_service(l)[1], "port": l + 1} for l in range(racks)]
    switches = [{"name": spine.name, "grpc": spine.grpc_addr, "device_id": spine.device_id,
                 "service_ip": SERVICE_IP, "service_mac": SERVICE_MAC, "ports": list(range(1, racks + 1)),
                 "hosts": spine_hosts}]
    for l, leaf in enumerate(leaves):
        local = [h for h in hosts if h["rack"] == l]
        entries = [{"ip": h["ip"], "mac": h["mac"], "port": h["leaf_port"] if h["rack"] == l else 1} for h in hosts]
        entries.append({"ip": SERVICE_IP, "mac": SERVICE_MAC, "port": 1})
        ip, mac = leaf_service(l) if tree else (None, None)
        switches.append({"name": leaf.name, "grpc": leaf.grpc_addr, "device_id": leaf.device_id, "service_ip": ip,
                         "service_mac": mac, "ports": [1] + [h["leaf_port"] for h in local], "hosts": entries})
    _attach(dep, switches)
