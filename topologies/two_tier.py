"""Two-tier: racks of workers under leaf switches, one spine that aggregates.

Aggregation happens at one level, the spine: the wire format has one worker-id space per job and
the switch admits workers by source address, so a leaf that pre-aggregated its rack would have to
act as a *worker* of the spine (its own address, its own retransmissions, and an OR of its rack's
bitmaps) — a different protocol from the one the P4 program and the emulator implement.  Leaves are
plain L2 switches; the spine sees every worker's packets and the multicast reaches every rack.

``--switch emulator``: leaves are Mininet hosts bridging their ports (Linux bridge); the spine is a
host running the emulator with one interface per rack (rack ``l`` is ``10.0.<l+1>.0/24``, the
spine is ``.254`` in it).  ``--switch bmv2``: leaves and spine all run ``p4/homagg.p4``; leaves have
no service address (pure L2 forwarding), the spine aggregates (``10.0.0.254``).
"""

from __future__ import annotations

from homagg.wire import HOMAGG_UDP_PORT

from ._addresses import PREFIX, SERVICE_IP, SERVICE_MAC, worker_mac
from ._deploy import Deployment, LinkOpts, WorkerSite
from ._mn import import_mininet

__all__ = ["build_two_tier", "rack_of"]


def rack_of(rank: int, workers: int, racks: int) -> int:
    """Ranks are spread over racks in contiguous blocks."""
    return rank * racks // workers


def build_two_tier(workers: int, switch: str, link: LinkOpts, racks: int = 2) -> Deployment:
    if not 1 <= racks <= workers:
        raise ValueError(f"racks must be in [1, workers], got {racks}")
    import_mininet()
    from mininet.link import TCLink
    from mininet.net import Mininet

    net = Mininet(topo=None, link=TCLink, controller=None, build=False, autoSetMacs=False)
    sites: list[WorkerSite] = []
    if switch == "emulator":
        spine = net.addHost(f"{PREFIX}sp", ip=None)
        leaves = [net.addHost(f"{PREFIX}l{l}", ip=None) for l in range(racks)]
        for l, leaf in enumerate(leaves):
            net.addLink(leaf, spine, intfName1=f"{PREFIX}l{l}-up", intfName2=f"{PREFIX}sp-eth{l}")
        hosts = []
        for r in range(workers):
            l = rack_of(r, workers, racks)
            h = net.addHost(f"{PREFIX}h{r}", ip=f"10.0.{l + 1}.{r + 1}/24", mac=worker_mac(r))
            net.addLink(h, leaves[l], intfName1=f"{PREFIX}h{r}-eth0", intfName2=f"{PREFIX}l{l}-h{r}", **link.params())
            hosts.append(h)
        net.build()
        for l, leaf in enumerate(leaves):
            leaf.cmd(f"ip link add br0 type bridge && ip link set br0 up")
            for intf in leaf.intfList():
                if intf.name.startswith(f"{PREFIX}l{l}-"):
                    leaf.cmd(f"ip addr flush dev {intf.name}; ip link set {intf.name} master br0; ip link set {intf.name} up")
            spine.setIP(f"10.0.{l + 1}.254/24", intf=f"{PREFIX}sp-eth{l}")
        for r, h in enumerate(hosts):
            l = rack_of(r, workers, racks)
            sites.append(WorkerSite(h, f"10.0.{l + 1}.{r + 1}", f"10.0.{l + 1}.254", f"{PREFIX}h{r}-eth0"))
        dep = Deployment(net, sites, "emulator", HOMAGG_UDP_PORT, HOMAGG_UDP_PORT + 1, switch_nodes=leaves + [spine])
    elif switch == "bmv2":
        from .bmv2 import Bmv2Switch

        spine = net.addSwitch(f"{PREFIX}sp", cls=Bmv2Switch, device_id=0, grpc_port=9559, thrift_port=9090)
        leaves = [net.addSwitch(f"{PREFIX}l{l}", cls=Bmv2Switch, device_id=l + 1, grpc_port=9560 + l,
                                thrift_port=9091 + l) for l in range(racks)]
        for l, leaf in enumerate(leaves):
            net.addLink(leaf, spine, port1=1, port2=l + 1)
        hosts = []
        leaf_ports: list[int] = [1] * racks
        bmv2_hosts = []
        for r in range(workers):
            l = rack_of(r, workers, racks)
            h = net.addHost(f"{PREFIX}h{r}", ip=f"10.0.0.{r + 1}/24", mac=worker_mac(r))
            leaf_ports[l] += 1
            net.addLink(h, leaves[l], port2=leaf_ports[l], intfName1=f"{PREFIX}h{r}-eth0", **link.params())
            hosts.append(h)
            bmv2_hosts.append({"ip": f"10.0.0.{r + 1}", "mac": worker_mac(r), "rack": l, "leaf_port": leaf_ports[l]})
        net.build()
        for r, h in enumerate(hosts):
            h.cmd(f"arp -s {SERVICE_IP} {SERVICE_MAC}")
            sites.append(WorkerSite(h, f"10.0.0.{r + 1}", SERVICE_IP, f"{PREFIX}h{r}-eth0"))
        dep = Deployment(net, sites, "bmv2", HOMAGG_UDP_PORT, HOMAGG_UDP_PORT + 1, switch_nodes=[spine, *leaves])
        from .bmv2 import attach_two_tier

        attach_two_tier(dep, bmv2_hosts, racks)
    else:
        raise ValueError(f"unknown switch kind {switch!r}")
    dep.capture_intfs.extend((s.host, s.intf) for s in sites)
    return dep
