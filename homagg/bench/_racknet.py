"""Two tiers of network namespaces with rate-shaped links: R racks (a leaf switch host and its
workers each) under one spine host (``homagg bench net --racks``).

::

                             ha<id>sp (spine)   10.77.255.1 on lo: the star's emulator (port 18497)
                             |         |                     and the tree's root (port 18499)
             dn0 10.79.0.1/24          dn1 10.79.1.1/24  ...      routes: each rack's /24s via its leaf
                 ||  uplink (shaped both ways: uplink_bw)  ||
             up0 10.79.0.2/24          up1 10.79.1.2/24
           ha<id>l0 (leaf 0)          ha<id>l1 (leaf 1)   br0: the rack's bridge, 10.78.k.1/32 = the
           br0: hs0 .. hs<n-1>        br0: hs<n> ..         leaf's emulator (port 18497), 10.77.r.1/24
             || (bw)                    ||                  per worker link (its gateway)
           ha<id>w0 .. w<n-1>         ha<id>w<n> .. w<2n-1>  worker r: hw<r> 10.77.r.2/24, default via .1

Rack ``k`` holds the contiguous ranks ``[k * n, (k + 1) * n)`` (``n = rack_size``; the placement of
:func:`homagg.tree.plan_tree`'s balanced leaves).  Every veth end is shaped with ``tc tbf`` on its
egress: worker links to ``bw_mbit``, uplinks to ``uplink_bw_mbit``.  The leaves and the spine route
(IP forwarding, ICMP redirects off): a worker's traffic to another rack (gloo's ring, the star's
streams) crosses its leaf, its uplink, the spine, the other uplink and leaf.  Multicast stays inside
a rack: a leaf's emulator sends a result once to the job's group on ``br0`` and the bridge copies
it to the rack's worker links (the uplink is routed, not bridged).  The spine's emulators send one
copy per member (``--no-multicast``): the star one per worker, each crossing that worker's uplink;
the tree's root one per leaf.

Three kinds of emulator process, started with the net and idle until a job is admitted:

* ``star``: at the spine, every worker one member (today's two-tier: the leaves only forward);
* ``root``: at the spine, the tree's root, each leaf's emulator one member (``child_id = k``);
* ``leaf k``: at leaf ``k``, its rack's workers (docs/trees.md: the job's ``parent`` = the root).

Each rack's bytes are counted at its leaf's uplink interface (``up<k>``: ``tx`` = towards the
spine, ``rx`` = from it; kernel counters, Ethernet frames with their headers).  Needs root;
:class:`RackNet` is a context manager: leaving it stops the emulators and deletes the namespaces.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError
from ..transport._auth import SECRET_ENV, new_secret
from ..wire import MAX_WORKERS, words_for_mtu
from ._netns import BRIDGE, MAX_MTU, MTU, REPLICATIONS, SWITCH_IP, Namespaces, _in, shape, start_emulator
from ._netns import stop_emulator
from ._ranks import launch_ranks

__all__ = ["RackNet", "Switches", "tree_engine", "ENGINES", "SWITCH_PORT", "ROOT_PORT"]

SWITCH_PORT = 18497  #: data port of the star's emulator at the spine and of each leaf's (control: + 1)
ROOT_PORT = 18499  #: data port of the tree's root at the spine (control: + 1)
ENGINES = ("auto", "python", "native")  #: the emulators' engine option


def leaf_ip(k: int) -> str:
    """Leaf ``k``'s emulator address (on its bridge)."""
    return f"10.78.{k}.1"


def tree_engine(asked: str) -> str:
    """The engine for the tree's emulators: ``asked``, except that ``auto`` is ``python`` where the
    built native engine has no tree roles (it counts no ``up``: switch_emulator/native.py)."""
    if asked != "auto":
        return asked
    from switch_emulator import native

    return "native" if native.AVAILABLE and "up" in native.COUNTER_NAMES else "python"


@dataclass(frozen=True)
class Switches:
    """Where a rank finds the emulators (JSON-compatible, handed to the ranks): ``star`` and
    ``root`` data addresses at the spine, ``leaves[k]`` leaf k's; control = data port + 1."""

    star: tuple[str, int]
    root: tuple[str, int]
    leaves: tuple[tuple[str, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"star": list(self.star), "root": list(self.root), "leaves": [list(a) for a in self.leaves]}


class RackNet(Namespaces):
    """``racks`` leaves of ``rack_size`` workers each under one spine; worker links ``bw_mbit``,
    uplinks ``uplink_bw_mbit`` (both directions), MTU ``mtu``; leaves send results to their rack by
    ``replication`` (``multicast``: the rack's bridge copies; ``unicast``: one send per worker).
    ``engine``: the star's emulator engine; the tree's is :func:`tree_engine` of it."""

    def __init__(self, racks: int, rack_size: int, bw_mbit: float, uplink_bw_mbit: float, mtu: int = MTU,
                 replication: str = "multicast", engine: str = "auto") -> None:
        if not 1 <= racks <= min(MAX_WORKERS, 200) or not 1 <= rack_size <= MAX_WORKERS:
            raise ConfigError(f"bench net: need 1 <= racks <= {min(MAX_WORKERS, 200)} and 1 <= workers per rack "
                              f"<= {MAX_WORKERS} (the worker bitmap), got {racks} racks of {rack_size}")
        if racks * rack_size > 250:
            raise ConfigError(f"bench net: at most 250 worker hosts, got {racks} x {rack_size}")
        if not bw_mbit > 0 or not uplink_bw_mbit > 0:
            raise ConfigError(f"bench net: link rates must be > 0 Mbit/s, got {bw_mbit}, {uplink_bw_mbit}")
        if not 1280 <= mtu <= MAX_MTU:
            raise ConfigError(f"bench net: the link MTU must be in [1280, {MAX_MTU}] bytes, got {mtu}")
        if replication not in REPLICATIONS:
            raise ConfigError(f"bench net: replication must be one of {list(REPLICATIONS)}, got {replication!r}")
        if engine not in ENGINES:
            raise ConfigError(f"bench net: engine must be one of {list(ENGINES)}, got {engine!r}")
        self.racks, self.rack_size, self.world = racks, rack_size, racks * rack_size
        self.bw_mbit, self.uplink_bw_mbit, self.mtu = bw_mbit, uplink_bw_mbit, mtu
        self.replication, self.engine, self.tree_engine = replication, engine, tree_engine(engine)
        tag = f"ha{os.getpid() % 100000}"
        self.spine_ns = f"{tag}sp"
        self.leaf_ns = [f"{tag}l{k}" for k in range(racks)]
        self.worker_ns = [f"{tag}w{r}" for r in range(self.world)]
        self.secret = new_secret()  #: every emulator's control secret (environment only, never argv)
        self.switches = Switches((SWITCH_IP, SWITCH_PORT), (SWITCH_IP, ROOT_PORT),
                                 tuple((leaf_ip(k), SWITCH_PORT) for k in range(racks)))
        self.emulators: dict[str, Any] = {}  #: "star", "root", "leaf<k>" -> its process
        self._made: list[str] = []

    @property
    def oversubscription(self) -> float:
        """A rack's worker links over its uplink: ``rack_size * bw / uplink_bw``."""
        return self.rack_size * self.bw_mbit / self.uplink_bw_mbit

    # ------------------------------------------------------------------ set-up / tear-down
    def _build(self) -> None:
        sp = self.spine_ns
        self._namespace(sp)
        _in(sp, "ip", "addr", "add", f"{SWITCH_IP}/32", "dev", "lo")
        self._router(sp)
        for k, leaf in enumerate(self.leaf_ns):
            self._namespace(leaf)
            self._bridge(leaf, leaf_ip(k))
            self._router(leaf, BRIDGE)
            up, dn = f"up{k}", f"dn{k}"
            self._veth(leaf, up, sp, dn)
            _in(leaf, "ip", "addr", "add", f"10.79.{k}.2/24", "dev", up)
            _in(leaf, "ip", "link", "set", up, "up")
            _in(sp, "ip", "addr", "add", f"10.79.{k}.1/24", "dev", dn)
            _in(sp, "ip", "link", "set", dn, "up")
            _in(leaf, "ip", "route", "add", "default", "via", f"10.79.{k}.1")
            _in(sp, "ip", "route", "add", f"{leaf_ip(k)}/32", "via", f"10.79.{k}.2")
            shape(leaf, up, self.uplink_bw_mbit, self.mtu)
            shape(sp, dn, self.uplink_bw_mbit, self.mtu)
            for r in range(k * self.rack_size, (k + 1) * self.rack_size):
                self._worker_host(r, self.worker_ns[r], leaf)
                _in(sp, "ip", "route", "add", f"10.77.{r}.0/24", "via", f"10.79.{k}.2")
            _in(leaf, "ip", "link", "set", BRIDGE, "mtu", str(self.mtu), "up")

    def _start_emulators(self) -> None:
        sp = self.spine_ns
        self.emulators["star"] = start_emulator(sp, SWITCH_IP, SWITCH_PORT, self.secret, multicast=False,
                                                engine=self.engine)
        self.emulators["root"] = start_emulator(sp, SWITCH_IP, ROOT_PORT, self.secret, multicast=False,
                                                engine=self.tree_engine)
        for k, leaf in enumerate(self.leaf_ns):
            self.emulators[f"leaf{k}"] = start_emulator(leaf, leaf_ip(k), SWITCH_PORT, self.secret,
                                                        multicast=self.replication == "multicast",
                                                        engine=self.tree_engine)

    def _stop_emulators(self) -> None:
        while self.emulators:
            stop_emulator(self.emulators.popitem()[1])

    # ------------------------------------------------------------------ ranks
    def emulator_pids(self, topology: str) -> list[int]:
        """The processes that aggregate ``topology`` (``star``: one; ``tree``: the root and the leaves)."""
        names = ["star"] if topology == "star" else ["root", *(f"leaf{k}" for k in range(self.racks))]
        return [self.emulators[n].pid for n in names if n in self.emulators]

    def uplinks(self) -> list[tuple[str, str]]:
        """(namespace, interface) of each rack's uplink at its leaf, rack order."""
        return [(ns, f"up{k}") for k, ns in enumerate(self.leaf_ns)]

    def rank_env(self, rank: int) -> dict[str, str]:
        """What rank ``rank`` needs: gloo's interface, its namespace, the emulators' control secret."""
        return {"GLOO_SOCKET_IFNAME": f"hw{rank}", SECRET_ENV: self.secret, "HOMAGG_NS_TAG": self.worker_ns[rank][2:],
                "HOMAGG_WORDS_PER_PACKET": str(words_for_mtu(self.mtu)),
                "HOMAGG_SLOTS": os.environ.get("HOMAGG_SLOTS", "64"),
                "HOMAGG_UDP_GSO": os.environ.get("HOMAGG_UDP_GSO", "1")}  # as StarNet (homagg/bench/_netns.py)

    def launch(self, cmd: Sequence[str], world: int, *, label: str, stall_timeout: float,
               env: Mapping[str, str] | None = None,
               on_line: Callable[[int, str], None] | None = None) -> list[list[str]]:
        """:func:`launch_ranks` with rank ``r`` inside worker namespace ``r`` (rendezvous on rank 0)."""
        if world != self.world:
            raise ConfigError(f"bench net: {world} ranks on {self.racks} racks of {self.rack_size} hosts")
        wrapped = ["sh", "-c", 'exec ip netns exec "ha$HOMAGG_NS_TAG" "$@"', "sh", *cmd]
        base: dict[str, Any] = dict(os.environ if env is None else env)
        return launch_ranks(wrapped, world, label=label, stall_timeout=stall_timeout, env=base, on_line=on_line,
                            master_addr="10.77.0.2", rank_env=self.rank_env)
