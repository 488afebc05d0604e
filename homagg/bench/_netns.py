"""A star of network namespaces with rate-shaped links: W worker hosts around one switch host.

::

                                              +-- ha<id>sw ---------------------------------+
    ha<id>w0   (10.77.0.2) --hw0==hs0-----+   | br0 (bridge; ports hs0 .. hs<W-1>):         |
    ha<id>w1   (10.77.1.2) --hw1==hs1-----+---|   10.77.r.1/24 per link (workers' gateway)  |
    ...                                   |   |   10.77.255.1/32 switch service (emulator)  |
    ha<id>w<r> (10.77.r.2) --hw<r>==hs<r>-+   +---------------------------------------------+

Every veth end is shaped with ``tc`` ``tbf`` to ``bw_mbit`` (egress, so each direction of each
link has that rate).  The switch ends ``hs<r>`` are ports of one Linux bridge ``br0`` (multicast
snooping off: a multicast frame floods to every port, i.e. one copy per link, each copy shaped by
that port's ``tbf``).  ``br0`` holds every link's gateway address and the switch service address.
Each worker is in its own /24 with its default route via ``10.77.r.1``, so worker-to-worker
traffic (gloo's ring) is IP-forwarded by the switch host (in and out of ``br0``; ICMP redirects
off), like hosts under one top-of-rack switch; homagg's workers talk to the emulator on the switch
host.  With ``replication="multicast"`` (default) the emulator sends each result once, to the
job's IP multicast group on ``br0`` (TTL 1), and the bridge replicates it to every link, as a
P4 switch's multicast group would; ``"unicast"`` starts it with ``--no-multicast`` (one send per
worker).  Reverse-path filtering, in any mode, drops nothing: every source arrives on the
interface of the route back to it (a worker: ``hw<r>``, its default route; the switch: ``br0``).
This kernel has no ``netem``, so links add no delay or loss: the comparison is about bandwidth.

Needs root (namespaces, veth, bridge, tc).  :class:`StarNet` is a context manager; leaving it
deletes every namespace it created (their veths and bridge go with them) and stops the emulator.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from .._errors import ConfigError, HomAggError
from ..transport._auth import SECRET_ENV, SECRET_FILE_ENV, new_secret
from ..wire import words_for_mtu
from ._cpu import SWITCH_PID_ENV
from ._ranks import launch_ranks

__all__ = ["Namespaces", "StarNet", "SWITCH_IP", "MTU", "REPLICATIONS", "require_root", "shape", "start_emulator", "stop_emulator",
           "delete_namespaces"]

SWITCH_IP = "10.77.255.1"
BRIDGE = "br0"  #: the switch host's bridge; every ``hs<r>`` is one of its ports
REPLICATIONS = ("multicast", "unicast")  #: how the emulator sends a result to the W workers
SWITCH_PORT = 18497
MTU = 9000  #: default link MTU: jumbo Ethernet frames
MAX_MTU = 65535  #: veth's largest MTU


WORDS_PER_PACKET = words_for_mtu(MTU)  #: one homagg datagram per jumbo frame


def require_root(command: str = "homagg bench net", instead: str = "there is no loopback fallback") -> None:
    """Raise :class:`ConfigError` saying what is needed unless root with ``ip`` and ``tc``."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        raise ConfigError(f"{command} needs root (network namespaces, veth links, tc rate shaping)"
                          + (f" and the tools {missing} (Debian: iproute2)" if missing else "")
                          + f"; {instead}")


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if res.returncode:
        raise HomAggError(f"ip {' '.join(args)}: {res.stderr.strip()}")


def _in(ns: str, *cmd: str) -> None:
    res = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=30)
    if res.returncode:
        raise HomAggError(f"[{ns}] {' '.join(cmd)}: {res.stderr.strip()}")


def shape(ns: str, dev: str, bw_mbit: float, mtu: int) -> None:
    """``tc tbf`` on ``dev``'s egress in namespace ``ns``: ``bw_mbit`` Mbit/s, a burst of a few frames."""
    rate_bytes = bw_mbit * 1e6 / 8
    burst = max(64 * 1024, 2 * mtu, int(rate_bytes / 250))  # a few frames, ~4 ms at rate
    _in(ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{bw_mbit}mbit", "burst", str(burst),
        "latency", "50ms")


def start_emulator(ns: str, ip: str, port: int, secret: str, *, multicast: bool,
                   engine: str = "auto") -> subprocess.Popen[str]:
    """A ``switch_emulator`` process in namespace ``ns``: data on ``ip:port``, control on ``ip:port + 1``,
    results to job groups (``multicast``) or one send per member; returns once it printed its ready
    line (:class:`HomAggError` after 60 s or a ready line that does not match).  Stopped by
    :func:`stop_emulator` (or its stdin closing: ``--watch-stdin``)."""
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "switch_emulator",
           "--listen", f"{ip}:{port}", "--control", f"{ip}:{port + 1}", "--engine", engine,
           "--ready-json", "--quiet", "--watch-stdin", "--log-level", "error",
           "--multicast" if multicast else "--no-multicast"]
    env = {**os.environ, SECRET_ENV: secret}
    env.pop(SECRET_FILE_ENV, None)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    if not line or not line[0].strip():
        stop_emulator(proc)
        raise HomAggError(f"bench net: the emulator did not start in {ns} within 60 s")
    ready = json.loads(line[0])
    if ready.get("multicast") != multicast:
        stop_emulator(proc)
        raise HomAggError(f"bench net: the emulator's result multicast is {ready.get('multicast')}, "
                          f"asked for {multicast}")
    return proc


def stop_emulator(proc: subprocess.Popen[str]) -> None:
    """Stop an emulator :func:`start_emulator` started (stdin closed, SIGTERM, SIGKILL after 10 s)."""
    if proc.stdin is not None:
        proc.stdin.close()
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def delete_namespaces(made: list[str]) -> None:
    """Delete the namespaces in ``made``, last first, emptying it (their veths and bridges go with them)."""
    while made:
        subprocess.run(["ip", "netns", "del", made.pop()], capture_output=True, timeout=30)


class Namespaces:
    """A context manager of network namespaces: entering needs root, builds (:meth:`_build`) and
    starts the emulators (:meth:`_start_emulators`), and on any failure there undoes all of it;
    leaving (or :meth:`close`) stops the emulators and deletes every namespace made."""

    _made: list[str]

    def __enter__(self) -> Self:
        require_root()
        try:
            self._build()
            self._start_emulators()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # subclasses set: ``mtu`` (every veth's), ``bw_mbit`` (worker links), ``_made`` (namespaces to delete)
    mtu: int
    bw_mbit: float
    _made: list[str]

    def _namespace(self, ns: str) -> None:
        """Create namespace ``ns`` (deleted by :meth:`close`), loopback up."""
        _ip("netns", "add", ns)
        self._made.append(ns)
        _in(ns, "ip", "link", "set", "lo", "up")

    def _router(self, ns: str, *devs: str) -> None:
        """IP forwarding on, ICMP redirects off (traffic between hosts keeps crossing this one);
        per namespace, no procps needed."""
        conf = "/proc/sys/net/ipv4/conf"
        _in(ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward; "
            + "; ".join(f"echo 0 > {conf}/{dev}/send_redirects" for dev in ("all", "default", *devs)))

    def _veth(self, ns_a: str, dev_a: str, ns_b: str, dev_b: str) -> None:
        mtu = str(self.mtu)
        _ip("link", "add", dev_a, "netns", ns_a, "mtu", mtu, "type", "veth", "peer", "name", dev_b, "netns", ns_b,
            "mtu", mtu)

    def _bridge(self, ns: str, ip: str) -> None:
        """The switch host's bridge ``BRIDGE`` in ``ns``, holding the host's address ``ip``/32."""
        _in(ns, "ip", "link", "add", BRIDGE, "mtu", str(self.mtu), "type", "bridge", "mcast_snooping", "0",
            "stp_state", "0", "forward_delay", "0")
        _in(ns, "ip", "addr", "add", f"{ip}/32", "dev", BRIDGE)

    def _worker_host(self, r: int, ns: str, switch_ns: str) -> None:
        """Worker host ``r`` in namespace ``ns`` (10.77.r.2/24, default route via 10.77.r.1), its
        link a port of ``switch_ns``'s bridge, shaped to ``bw_mbit`` at both ends (the bridge port's
        egress shapes every copy of a flooded multicast frame too)."""
        self._namespace(ns)
        hw, hs = f"hw{r}", f"hs{r}"
        self._veth(ns, hw, switch_ns, hs)
        _in(ns, "ip", "addr", "add", f"10.77.{r}.2/24", "dev", hw)
        _in(ns, "ip", "link", "set", hw, "up")
        _in(ns, "ip", "route", "add", "default", "via", f"10.77.{r}.1")
        _in(switch_ns, "ip", "link", "set", hs, "master", BRIDGE)
        _in(switch_ns, "ip", "addr", "add", f"10.77.{r}.1/24", "dev", BRIDGE)
        _in(switch_ns, "ip", "link", "set", hs, "up")
        shape(ns, hw, self.bw_mbit, self.mtu)
        shape(switch_ns, hs, self.bw_mbit, self.mtu)

    def _build(self) -> None:
        raise NotImplementedError

    def _start_emulators(self) -> None:
        raise NotImplementedError

    def _stop_emulators(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Stop the emulators and delete every namespace created (idempotent)."""
        self._stop_emulators()
        delete_namespaces(self._made)


class StarNet(Namespaces):
    """``world`` worker namespaces and one switch namespace, links shaped to ``bw_mbit``, every
    veth with MTU ``mtu`` (homagg datagrams fill one frame: :func:`homagg.wire.words_for_mtu`); results
    replicated by the bridge (``replication="multicast"``) or sent once per worker (``"unicast"``)."""

    def __init__(self, world: int, bw_mbit: float, mtu: int = MTU, replication: str = "multicast") -> None:
        if world < 1 or world > 250 or not bw_mbit > 0:
            raise ConfigError(f"bench net: need 1 <= world <= 250 and bw > 0, got {world}, {bw_mbit}")
        if not 1280 <= mtu <= MAX_MTU:
            raise ConfigError(f"bench net: the link MTU must be in [1280, {MAX_MTU}] bytes, got {mtu}")
        if replication not in REPLICATIONS:
            raise ConfigError(f"bench net: replication must be one of {list(REPLICATIONS)}, got {replication!r}")
        self.world, self.bw_mbit, self.mtu, self.replication = world, bw_mbit, mtu, replication
        tag = f"ha{os.getpid() % 100000}"
        self.switch_ns = f"{tag}sw"
        self.worker_ns = [f"{tag}w{r}" for r in range(world)]
        self.emulator: subprocess.Popen[str] | None = None
        self.secret = new_secret()  #: the emulator's control secret (environment only, never argv)
        self._made: list[str] = []

    # ------------------------------------------------------------------ set-up / tear-down
    def _build(self) -> None:
        sw = self.switch_ns
        self._namespace(sw)
        self._bridge(sw, SWITCH_IP)
        # route between the workers' /24s, all on br0, without telling them (ICMP redirects) to go
        # to each other directly: gloo's ring crosses the switch
        self._router(sw, BRIDGE)
        for r, ns in enumerate(self.worker_ns):
            self._worker_host(r, ns, sw)
        _in(sw, "ip", "link", "set", BRIDGE, "mtu", str(self.mtu), "up")

    def _start_emulators(self) -> None:
        self.emulator = start_emulator(self.switch_ns, SWITCH_IP, SWITCH_PORT, self.secret,
                                       multicast=self.replication == "multicast")

    def _stop_emulators(self) -> None:
        if self.emulator is not None:
            stop_emulator(self.emulator)
            self.emulator = None

    # ------------------------------------------------------------------ ranks
    def rank_env(self, rank: int) -> dict[str, str]:
        """What a rank in namespace ``rank`` needs: gloo's interface, the rendezvous, the switch and
        its control secret (and the emulator's pid, whose CPU a benchmark's rank 0 reads in ``/proc``:
        ``ip netns exec`` runs it in place, and namespaces share the host's process ids)."""
        pid = {SWITCH_PID_ENV: str(self.emulator.pid)} if self.emulator is not None else {}
        return {**pid, "GLOO_SOCKET_IFNAME": f"hw{rank}", "HOMAGG_SWITCH": f"{SWITCH_IP}:{SWITCH_PORT}",
                SECRET_ENV: self.secret,
                "HOMAGG_WORDS_PER_PACKET": str(words_for_mtu(self.mtu)),
                "HOMAGG_SLOTS": os.environ.get("HOMAGG_SLOTS", "64"),  # the job's slots: its send window
                # the switch here is the UDP emulator: a worker's GSO packet crosses the veth and the
                # bridge whole and its socket splits it (on veths GSO is off by default, for AF_PACKET
                # switches such as BMv2: homagg/transport/_fastpath.py)
                "HOMAGG_UDP_GSO": os.environ.get("HOMAGG_UDP_GSO", "1")}

    def launch(self, cmd: Sequence[str], world: int, *, label: str, stall_timeout: float,
               env: Mapping[str, str] | None = None,
               on_line: Callable[[int, str], None] | None = None) -> list[list[str]]:
        """:func:`launch_ranks` with rank ``r`` inside worker namespace ``r`` (rendezvous on rank 0)."""
        if world > self.world:
            raise ConfigError(f"bench net: {world} ranks on a star of {self.world} hosts")
        wrapped = ["sh", "-c", 'exec ip netns exec "ha$HOMAGG_NS_TAG" "$@"', "sh", *cmd]
        base: dict[str, Any] = dict(os.environ if env is None else env)
        return launch_ranks(wrapped, world, label=label, stall_timeout=stall_timeout, env=base, on_line=on_line,
                            master_addr="10.77.0.2", rank_env=self._rank_env_with_ns)

    def _rank_env_with_ns(self, rank: int) -> dict[str, str]:
        return {**self.rank_env(rank), "HOMAGG_NS_TAG": self.worker_ns[rank][2:]}
