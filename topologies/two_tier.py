"""Two-tier: racks of workers under leaf switches, one spine that aggregates.

By default aggregation happens at one level, the spine: leaves are plain L2 switches; the spine
sees every worker's packets and the multicast reaches every rack.  With ``tree`` the leaves
aggregate too (docs/trees.md): its rack's workers send to their leaf, which sends each completed
use up to the spine as one worker (its child id = its rack) and passes the spine's result down to
its rack; the spine's members are the leaves (``Deployment.tree_links``: per leaf, its data
address as the spine sees it and the spine's as it sees it).

``--switch emulator``: leaves are Mininet hosts bridging their ports (Linux bridge); the spine is a
host running the emulator with one interface per rack (rack ``l`` is ``10.0.<l+1>.0/24``, the
spine is ``.254`` in it).  With ``tree`` each leaf runs an emulator too, at ``10.0.<l+1>.254`` on
its bridge, and reaches the spine over a routed uplink (``10.9.<l>.1`` -> ``10.9.<l>.254``).
``--switch bmv2``: leaves and spine all run ``p4/homagg.p4``; leaves have
no service address (pure L2 forwarding), the spine aggregates (``10.0.0.254``); with ``tree`` the
leaves have one too and every worker sends to its leaf's.
"""

from __future__ import annotations

from homagg.wire import HOMAGG_UDP_PORT

from ._addresses import PREFIX, SERVICE_IP, SERVICE_MAC, leaf_service, worker_mac
from ._deploy import Deployment, LinkOpts, WorkerSite
from ._mn import import_mininet

__all__ = ["build_two_tier", "rack_of"]


def rack_of(rank: int, workers: int, racks: int) -> int:
    """Ranks are spread over racks in contiguous blocks."""
    return rank * racks // workers


def build_two_tier(workers: int, switch: str, link: LinkOpts, racks: int = 2, tree: bool = False,
                   uplink: LinkOpts | None = None) -> Deployment:
    """Racks of workers (``link``: each worker's link) under leaves under one spine; ``uplink``:
    each leaf-spine link's parameters (default: unshaped); ``tree``: the leaves aggregate."""
    if not 1 <= racks <= workers:
        raise ValueError(f"racks must be in [1, workers], got {racks}")
    import_mininet()
    from mininet.link import TCLink
    from mininet.net import Mininet

    net = Mininet(topo=None, link=TCLink, controller=None, build=False, autoSetMacs=False)
    up = uplink.params() if uplink is not None else {}
    sites: list[WorkerSite] = []
    if switch == "emulator":
        spine = net.addHost(f"{PREFIX}sp", ip=None)
        leaves = [net.addHost(f"{PREFIX}l{l}", ip=None) for l in range(racks)]
        for l, leaf in enumerate(leaves):
            net.addLink(leaf, spine, intfName1=f"{PREFIX}l{l}-up", intfName2=f"{PREFIX}sp-eth{l}", **up)
        hosts = []
        for r in range(workers):
            l = rack_of(r, workers, racks)
            h = net.addHost(f"{PREFIX}h{r}", ip=f"10.0.{l + 1}.{r + 1}/24", mac=worker_mac(r))
            net.addLink(h, leaves[l], intfName1=f"{PREFIX}h{r}-eth0", intfName2=f"{PREFIX}l{l}-h{r}", **link.params())
            hosts.append(h)
        net.build()
        for l, leaf in enumerate(leaves):
            uplink = f"{PREFIX}l{l}-up"
            leaf.cmd(f"ip link add br0 type bridge && ip link set br0 up")
            for intf in leaf.intfList():
                if intf.name.startswith(f"{PREFIX}l{l}-") and not (tree and intf.name == uplink):
                    leaf.cmd(f"ip addr flush dev {intf.name}; ip link set {intf.name} master br0; ip link set {intf.name} up")
            if tree:  # the leaf's emulator: the rack's switch address on the bridge, a routed uplink
                leaf.cmd(f"ip addr add 10.0.{l + 1}.254/24 dev br0")
                leaf.setIP(f"10.9.{l}.1/24", intf=uplink)
                spine.setIP(f"10.9.{l}.254/24", intf=f"{PREFIX}sp-eth{l}")
            else:
                spine.setIP(f"10.0.{l + 1}.254/24", intf=f"{PREFIX}sp-eth{l}")
        for r, h in enumerate(hosts):
            l = rack_of(r, workers, racks)
            sites.append(WorkerSite(h, f"10.0.{l + 1}.{r + 1}", f"10.0.{l + 1}.254", f"{PREFIX}h{r}-eth0"))
        dep = Deployment(net, sites, "emulator", HOMAGG_UDP_PORT, HOMAGG_UDP_PORT + 1,
                         switch_nodes=([spine, *leaves] if tree else leaves + [spine]))
        dep.uplinks = [(leaf, f"{PREFIX}l{l}-up") for l, leaf in enumerate(leaves)]
        if tree:
            dep.tree_links = [((f"10.9.{l}.1", HOMAGG_UDP_PORT), (f"10.9.{l}.254", HOMAGG_UDP_PORT))
                              for l in range(racks)]
    elif switch == "bmv2":
        from .bmv2 import Bmv2Switch

        spine = net.addSwitch(f"{PREFIX}sp", cls=Bmv2Switch, device_id=0, grpc_port=9559, thrift_port=9090)
        leaves = [net.addSwitch(f"{PREFIX}l{l}", cls=Bmv2Switch, device_id=l + 1, grpc_port=9560 + l,
                                thrift_port=9091 + l) for l in range(racks)]
        for l, leaf in enumerate(leaves):
            net.addLink(leaf, spine, port1=1, port2=l + 1, **up)
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
            ip, mac = leaf_service(rack_of(r, workers, racks)) if tree else (SERVICE_IP, SERVICE_MAC)
            h.cmd(f"arp -s {ip} {mac}")
            sites.append(WorkerSite(h, f"10.0.0.{r + 1}", ip, f"{PREFIX}h{r}-eth0"))
        dep = Deployment(net, sites, "bmv2", HOMAGG_UDP_PORT, HOMAGG_UDP_PORT + 1, switch_nodes=[spine, *leaves])
        dep.uplinks = [(leaf, leaf.intfs[1].name) for leaf in leaves]  # port 1: up to the spine
        if tree:
            dep.tree_links = [((leaf_service(l)[0], HOMAGG_UDP_PORT), (SERVICE_IP, HOMAGG_UDP_PORT))
                              for l in range(racks)]
        from .bmv2 import attach_two_tier

        attach_two_tier(dep, bmv2_hosts, racks, tree=tree)
    else:
        raise ValueError(f"unknown switch kind {switch!r}")
    dep.capture_intfs.extend((s.host, s.intf) for s in sites)
    return dep
