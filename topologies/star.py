"""Star: W worker hosts around one switch.

``--switch emulator``: the switch is a Mininet host ``hgs`` running the Python emulator.  Each
worker sits on its own /24 (``10.0.<r+1>.1``) towards the switch's interface ``10.0.<r+1>.254``;
the emulator listens on all of them (UDP backend; the kernel of the switch host only delivers and
routes, every aggregation decision is the emulator's pipeline).

``--switch bmv2``: the switch is ``simple_switch_grpc`` running ``p4/homagg.p4`` (ports 1..W);
workers share ``10.0.0.0/24`` (``10.0.0.<r+1>``) and send to the switch's service address
``10.0.0.254`` (static ARP entry), configured by :class:`homagg.p4.Controller`.

Each link is a TCLink with the given bandwidth/delay/loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from homagg.wire import HOMAGG_UDP_PORT

from ._addresses import PREFIX, SERVICE_IP, SERVICE_MAC, worker_mac
from ._deploy import Deployment, LinkOpts, WorkerSite
from ._mn import import_mininet

__all__ = ["build_star"]


def _switch_host_star(net: Any, workers: int, link: LinkOpts, ip_of: Callable[[int], str]) -> tuple[Any, list[Any]]:
    """A switch host ``<prefix>s`` with one link per worker host; builds the network."""
    sw = net.addHost(f"{PREFIX}s", ip=None)
    hosts = [net.addHost(f"{PREFIX}h{r}", ip=ip_of(r), mac=worker_mac(r)) for r in range(workers)]
    for r, h in enumerate(hosts):
        net.addLink(h, sw, intfName1=f"{PREFIX}h{r}-eth0", intfName2=f"{PREFIX}s-eth{r}", **link.params())
    net.build()
    return sw, hosts


def build_star(workers: int, switch: str, link: LinkOpts, emulator_backend: str = "udp") -> Deployment:
    """Build (not start) the star; the runner starts the switch software.

    ``emulator_backend="raw"``: the emulator serves the switch host's interfaces as raw ports
    (AF_PACKET), addressed like BMv2 (shared ``10.0.0.0/24``, service address ``10.0.0.254`` with a
    static ARP entry for the port's MAC); the switch host's kernel has no address at all.
    """
    import_mininet()
    from mininet.link import TCLink
    from mininet.net import Mininet

    net = Mininet(topo=None, link=TCLink, controller=None, build=False, autoSetMacs=False)
    sites: list[WorkerSite] = []
    if switch == "emulator" and emulator_backend == "raw":
        sw, hosts = _switch_host_star(net, workers, link, lambda r: f"10.0.0.{r + 1}/24")
        for r, h in enumerate(hosts):
            intf = f"{PREFIX}s-eth{r}"
            sw.cmd(f"ip addr flush dev {intf}; sysctl -qw net.ipv6.conf.{intf}.disable_ipv6=1")
            h.cmd(f"arp -s {SERVICE_IP} {sw.intf(intf).MAC()}")
            sites.append(WorkerSite(h, f"10.0.0.{r + 1}", SERVICE_IP, f"{PREFIX}h{r}-eth0"))
        dep = Deployment(net, sites, "emulator", HOMAGG_UDP_PORT, HOMAGG_UDP_PORT + 1, switch_nodes=[sw])
        dep.raw_ifaces = [f"{PREFIX}s-eth{r}" for r in range(workers)]
    elif switch == "emulator":
        sw, hosts = _switch_host_star(net, workers, link, lambda r: f"10.0.{r + 1}.1/24")
        for r, h in enumerate(hosts):
            sw.setIP(f"10.0.{r + 1}.254/24", intf=f"{PREFIX}s-eth{r}")
            sites.append(WorkerSite(h, f"10.0.{r + 1}.1", f"10.0.{r + 1}.254", f"{PREFIX}h{r}-eth0",
                                    switch_side=(sw, f"{PREFIX}s-eth{r}")))
        dep = Deployment(net, sites, "emulator", HOMAGG_UDP_PORT, HOMAGG_UDP_PORT + 1, switch_nodes=[sw])
    elif switch == "bmv2":
        from .bmv2 import Bmv2Switch

        sw = net.addSwitch(f"{PREFIX}s", cls=Bmv2Switch, device_id=0, grpc_port=9559, thrift_port=9090)
        hosts = [net.addHost(f"{PREFIX}h{r}", ip=f"10.0.0.{r + 1}/24", mac=worker_mac(r)) for r in range(workers)]
        for r, h in enumerate(hosts):
            net.addLink(h, sw, port2=r + 1, intfName1=f"{PREFIX}h{r}-eth0", **link.params())
        net.build()
        for r, h in enumerate(hosts):
            h.cmd(f"arp -s {SERVICE_IP} {SERVICE_MAC}")
            sites.append(WorkerSite(h, f"10.0.0.{r + 1}", SERVICE_IP, f"{PREFIX}h{r}-eth0"))
        dep = Deployment(net, sites, "bmv2", HOMAGG_UDP_PORT, HOMAGG_UDP_PORT + 1, switch_nodes=[sw])
        from .bmv2 import attach_star

        attach_star(dep, [{"ip": f"10.0.0.{r + 1}", "mac": worker_mac(r), "port": r + 1} for r in range(workers)],
                    SERVICE_IP, SERVICE_MAC)
    else:
        raise ValueError(f"unknown switch kind {switch!r}")
    for s in sites:
        dep.capture_intfs.append((s.host, s.intf))
    return dep
