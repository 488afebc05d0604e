"""A tree of BMv2 switches on veth pairs, driven in-process (tests of ``p4/tree.p4``, docs/trees.md).

:class:`Bmv2Tree` starts one ``simple_switch_grpc`` per switch of a :class:`~homagg.tree.TreePlan`
(ports on veth pairs named ``<prefix>...``: port 1 of a child is its uplink, wired to port
``child_id + 2`` of its parent; port 2 of a leaf leads to its ranks), pushes the build and admits
the job at every switch in its role with :class:`homagg.p4.Controller` (a child: ``parent`` = its
parent's data address ``(service IP, 18497)``, its ``child_id``).  The ranks are played by this
process: one AF_PACKET socket on the far end of each leaf's rank link sends every rank's Ethernet /
IPv4 / UDP frames and reads the results that come back.  :meth:`Bmv2Tree.combine` (inherited from
:class:`homagg.testing.TreeNetwork`) is an :class:`~homagg.transport.InProcessSwitch` combiner: a
round's streams cut into chunks (one use of a (slot, bank) cell per chunk, windows of ``n_slots``
uses alternating the banks); here every rank sends every chunk of a window, a rank still missing
a result after ``rto`` seconds resends it flagged ``FLAG_RETRANSMIT`` (the transport's
worker-clocked recovery), so the switches see the packets a real job sends them.

``via_agents``: the job is admitted at every switch over the control protocol, through one
:class:`topologies.bmv2_agent.Bmv2ControlAgent` per switch (root first, every switch's members
given with the job), as a tree's rank 0 admits it; else directly with the controller.

``faults`` (:class:`homagg.testing.HopFaults`: seeded drop and duplicate rates per hop kind) loses
and duplicates datagrams on every hop: a rank's sends (``worker_leaf``) and the results it reads
(``leaf_worker``) here, and, when ``child_parent`` or ``parent_child`` is faulty, each link between
two switches runs through this process (two veth pairs and a relay serviced while results are
awaited), which loses and duplicates the frames crossing it in either direction.

Invariants: every process, socket and link this object made is gone after :meth:`Bmv2Tree.stop`
(also on a failed start); a window that still misses a result after ``max_resends`` resends
raises :class:`~homagg.ResultMismatchError` naming the rank and chunk; all ranks' results of a
round are equal (else the same error).  Needs root (veth pairs, packet sockets) and the BMv2 tools.
"""

from __future__ import annotations

import random
import select
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from homagg.jobs import JobSpec, WorkerAddr
from homagg.testing import HOPS, HopFaults, ResultMismatchError, TreeNetwork
from homagg.tree import TreePlan
from homagg.wire import (FLAG_RESULT, FLAG_RETRANSMIT, HEADER_LEN, HOMAGG_UDP_PORT, pack_header_into, payload_view,
                         unpack_header)

RANK_PORT = 40000  # every rank's UDP source port (ranks differ by IP)


def switch_ip(s: int) -> str:
    return f"10.1.{s}.254"


def switch_mac(s: int) -> str:
    return f"02:48:42:00:{s:02x}:fe"


def rank_ip(r: int) -> str:
    return f"10.2.{r >> 8}.{(r & 0xFF) + 1}"


def rank_mac(r: int) -> str:
    return f"02:48:43:00:{r >> 8:02x}:{r & 0xFF:02x}"


def _ipv4_udp(src: tuple[str, int], dst: tuple[str, int], payload: bytes) -> bytes:
    total = 28 + len(payload)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0, socket.inet_aton(src[0]),
                     socket.inet_aton(dst[0]))
    s = sum(struct.unpack("!10H", ip))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    ip = ip[:10] + struct.pack("!H", ~s & 0xFFFF) + ip[12:]
    return ip + struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload


class Bmv2Tree(TreeNetwork):
    """The switches of ``plan`` as BMv2 processes on veth pairs (see the module docstring); the
    round's chunking is :class:`~homagg.testing.TreeNetwork`'s, the network is BMv2."""

    def __init__(self, plan: TreePlan, built: Any, folder: Path, *, words_per_packet: int = 32, n_slots: int = 8,
                 job_id: int = 7, token: int = 0x5EED1234, rto: float = 0.4, max_resends: int = 20,
                 grpc_base: int = 50600, faults: HopFaults | None = None, prefix: str = "htr",
                 via_agents: bool = False) -> None:
        self.plan, self.k, self.n_slots, self.job_id, self.token = plan, words_per_packet, n_slots, job_id, token
        self.rto, self.max_resends = rto, max_resends
        self.faults, self.prefix, self.via_agents = faults or HopFaults(), prefix, via_agents
        self.agents: list[Any] = []  #: with via_agents, the switches' control agents (root first)
        self._rand = random.Random(self.faults.seed).random
        #: a link between switches whose hops have faults runs through this process: relay socket ->
        #: (the socket at the link's other end, the hop kind of frames read on the first)
        self.relays: dict[socket.socket, tuple[socket.socket, str]] = {}
        self.faulted = dict.fromkeys(HOPS, 0)  #: datagrams dropped or duplicated per hop kind
        self.links: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.socks: dict[int, socket.socket] = {}  # leaf index -> the ranks' end of its port 2
        self.cfgs: list[Any] = []
        self.built, self.folder = built, folder
        self._use = 0
        self.resends = 0  #: chunks a rank sent again, flagged (its result had not come within rto)
        try:
            self._start(built, grpc_base)
        except BaseException:
            self.stop()
            raise

    # -- setup -----------------------------------------------------------------------------------
    def _veth(self, a: str, b: str) -> None:
        subprocess.run(["ip", "link", "del", a], capture_output=True, check=False)
        subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
        self.links.append(a)
        for i in (a, b):
            subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{i}.disable_ipv6=1"], check=False)
            subprocess.run(["ethtool", "-K", i, "tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"],
                           capture_output=True, check=False)
            subprocess.run(["ip", "link", "set", i, "up"], check=True)

    @property
    def _faulty(self) -> bool:
        return bool(self.faults.drop or self.faults.duplicate)

    def _packet_socket(self, intf: str) -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        sock.bind((intf, 0))
        sock.setblocking(False)
        return sock

    def _fault(self, hop: str) -> str | None:
        """``"drop"``, ``"dup"`` or None for the next datagram on a hop of kind ``hop`` (seeded)."""
        f = self.faults
        if hop not in f.hops:
            return None
        action = "drop" if f.drop and self._rand() < f.drop else "dup" if f.duplicate and self._rand() < f.duplicate else None
        if action is not None:
            self.faulted[hop] += 1
        return action

    def _start(self, built: Any, grpc_base: int) -> None:
        from homagg.p4 import Controller, SwitchConfig

        plan = self.plan
        ports: list[dict[int, str]] = [{} for _ in plan.switches]
        hosts: list[list[dict[str, Any]]] = [[] for _ in plan.switches]
        for s in plan.switches:
            if s.parent is not None:  # its uplink: port 1 here, port child_id + 2 at the parent
                a, b = f"{self.prefix}{s.index}u", f"{self.prefix}{s.parent}c{s.child_id}"
                if {"child_parent", "parent_child"} & set(self.faults.hops) and self._faulty:
                    self._veth(a, a.upper())  # through this process: a lossy link
                    self._veth(b, b.upper())
                    up, down = self._packet_socket(a.upper()), self._packet_socket(b.upper())
                    self.relays[up] = (down, "child_parent")
                    self.relays[down] = (up, "parent_child")
                else:
                    self._veth(a, b)
                ports[s.index][1], ports[s.parent][s.child_id + 2] = a, b
                hosts[s.index].append({"ip": switch_ip(s.parent), "mac": switch_mac(s.parent), "port": 1})
                hosts[s.parent].append({"ip": switch_ip(s.index), "mac": switch_mac(s.index), "port": s.child_id + 2})
            if s.ranks is not None:
                a, b = f"{self.prefix}{s.index}w", f"{self.prefix}{s.index}r"
                self._veth(a, b)
                ports[s.index][2] = a
                hosts[s.index] += [{"ip": rank_ip(r), "mac": rank_mac(r), "port": 2} for r in s.ranks]
                self.socks[s.index] = self._packet_socket(b)
        self.folder.mkdir(parents=True, exist_ok=True)
        for s in plan.switches:
            grpc = f"127.0.0.1:{grpc_base + 2 * s.index}"
            args = [shutil.which("simple_switch_grpc") or "simple_switch_grpc", "--device-id", "0",
                    "--thrift-port", str(grpc_base + 2 * s.index + 1)]
            for p, intf in sorted(ports[s.index].items()):
                args += ["-i", f"{p}@{intf}"]
            args += ["--no-p4", "--", "--grpc-server-addr", grpc]
            with open(self.folder / f"bmv2-{s.index}.log", "wb") as log:
                self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
            self.cfgs.append(SwitchConfig.from_dict({
                "name": f"s{s.index}", "grpc": grpc, "service_ip": switch_ip(s.index),
                "service_mac": switch_mac(s.index), "ports": sorted(ports[s.index]), "hosts": hosts[s.index]}))
        for s, cfg in zip(plan.switches, self.cfgs):
            if s.ranks is not None:
                workers = tuple(WorkerAddr(w, rank_ip(r), RANK_PORT) for w, r in enumerate(s.ranks))
            else:
                workers = tuple(WorkerAddr(c.child_id, switch_ip(c.index), HOMAGG_UDP_PORT)
                                for c in plan.children(s.index))
            spec = JobSpec(self.job_id, s.members, 0, self.n_slots, self.k, workers, token=self.token,
                           parent=None if s.parent is None else (switch_ip(s.parent), HOMAGG_UDP_PORT),
                           child_id=s.child_id)
            with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=20) as ctl:
                ctl.push()
                ctl.configure(cfg)
                if not self.via_agents:
                    ctl.add_job(cfg, spec)
            if self.via_agents:
                self._admit_via_agent(s.index, cfg, spec)
        self._rank_of = {rank_ip(r): r for r in range(plan.world_size)}
        self._place = [plan.place(r) for r in range(plan.world_size)]

    def _admit_via_agent(self, index: int, cfg: Any, spec: JobSpec) -> None:
        """Admit ``spec`` over the control protocol at a :class:`topologies.bmv2_agent.Bmv2ControlAgent`
        started for switch ``index``, the workers given with the job (none registers: the ranks'
        addresses are fixed, a parent's members are switches), as a tree's rank 0 admits a job."""
        import os
        from types import SimpleNamespace

        from homagg.transport import ControlClient
        from tests._dist_scripts._launch import free_port
        from topologies.bmv2_agent import Bmv2ControlAgent

        secret, listen = os.urandom(16).hex(), ("127.0.0.1", free_port())
        agent = Bmv2ControlAgent(SimpleNamespace(proc=self.procs[index]), cfg, listen, secret, HOMAGG_UDP_PORT,
                                 gate=False, built=self.built)
        self.agents.append(agent.start())
        with ControlClient(listen, timeout=20, secret=secret) as ctl:
            got = ctl.admit(spec.world_size, job_id=spec.job_id, slot_base=spec.slot_base, n_slots=spec.n_slots,
                            words_per_packet=spec.words_per_packet, token=spec.token, parent=spec.parent,
                            child_id=spec.child_id,
                            workers=[{"worker_id": w.worker_id, "ip": w.ip, "port": w.port} for w in spec.workers])
        if got != spec:
            raise ResultMismatchError(f"switch {index}: the agent admitted {got}, not {spec}")

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.agents = []
        for sock in [*self.socks.values(), *self.relays]:
            sock.close()
        self.relays = {}
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for a in self.links:
            subprocess.run(["ip", "link", "del", a], capture_output=True, check=False)
        self.socks, self.procs, self.links = {}, [], []

    def counters(self) -> list[dict[str, Any]]:
        """Each switch's counters (root first): drop reasons and tree events by emulator name."""
        from homagg.p4 import Controller

        out = []
        for cfg in self.cfgs:
            with Controller(cfg.grpc, 0, p4info=self.built.p4info, bmv2_json=self.built.json, timeout=10) as ctl:
                out.append(ctl.read_counters())
        return out

    # -- the ranks -------------------------------------------------------------------------------
    def _send_frame(self, rank: int, dgram: bytes) -> None:
        leaf, _wid = self._place[rank]
        frame = (bytes.fromhex(switch_mac(leaf).replace(":", "")) + bytes.fromhex(rank_mac(rank).replace(":", ""))
                 + b"\x08\x00" + _ipv4_udp((rank_ip(rank), RANK_PORT), (switch_ip(leaf), HOMAGG_UDP_PORT), dgram))
        action = self._fault("worker_leaf")
        for _ in range(0 if action == "drop" else 2 if action == "dup" else 1):
            self.socks[leaf].send(frame)

    def _receive(self, inbox: list[dict[tuple[int, int, int], np.ndarray]], until: float,
                 done: Callable[[], bool]) -> None:
        """Read result frames into ``inbox[rank]`` until ``done()`` or ``until`` (monotonic)."""
        socks = [*self.socks.values(), *self.relays]
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select(socks, [], [], left)
            if not ready:
                return
            for sock in ready:
                while True:
                    try:
                        frame, addr = sock.recvfrom(65535)
                    except BlockingIOError:
                        break
                    if addr[2] == socket.PACKET_OUTGOING:
                        continue
                    if sock in self.relays:  # a frame crossing a lossy link between two switches
                        other, hop = self.relays[sock]
                        action = self._fault(hop) if frame[12:14] == b"\x08\x00" else None
                        for _ in range(0 if action == "drop" else 2 if action == "dup" else 1):
                            other.send(frame)
                        continue
                    if frame[12:14] != b"\x08\x00" or frame[23] != 17:
                        continue
                    rank = self._rank_of.get(socket.inet_ntoa(frame[30:34]))
                    dg = frame[42:]
                    if rank is None or len(dg) < HEADER_LEN:
                        continue
                    if self._fault("leaf_worker") == "drop":
                        continue
                    h = unpack_header(dg)
                    if h[2] & FLAG_RESULT and h[3] == self.job_id and h[11] == self.token:
                        key = (h[7] << 1 | h[6], h[8], h[9])
                        inbox[rank].setdefault(key, np.array(payload_view(dg, h[5]), dtype=np.int32))
            if done():
                return

    def _run_window(self, words: list[list[np.ndarray]], heads: list[tuple[int, ...]],
                    outs: list[list[np.ndarray]]) -> None:
        """One window of uses (:meth:`TreeNetwork.combine` cuts the round and calls this): every rank
        sends its chunks, then those still missing a result after ``rto`` again, flagged."""
        world = self.plan.world_size
        buf = bytearray(HEADER_LEN + 4 * self.k)
        order = [(r, h) for h in heads for r in range(world)]
        random.Random(self._use).shuffle(order)
        missing = {(r, h[0]) for r, h in order}
        inbox: list[dict[tuple[int, int, int], np.ndarray]] = [{} for _ in range(world)]

        def key(j: int) -> tuple[int, int, int]:
            slot, bank, tag, off = heads[j][:4]
            return ((slot << 1) | bank, tag, off & 0xFFFFFFFF)

        for attempt in range(self.max_resends + 1):
            for r, h in order:
                if (r, h[0]) not in missing:
                    continue
                slot, bank, tag, off, wc, op, stream = h
                pack_header_into(buf, op, FLAG_RETRANSMIT if attempt else 0, self.job_id, self._place[r][1], wc, bank,
                                 slot, tag, off & 0xFFFFFFFF, self.token)
                payload_view(buf, wc)[:] = words[r][stream][off:off + wc]
                self._send_frame(r, bytes(buf[:HEADER_LEN + 4 * wc]))
            self._receive(inbox, time.monotonic() + self.rto, lambda: all(key(j) in inbox[r] for r, j in missing))
            for r, j in list(missing):
                got = inbox[r].get(key(j))
                if got is not None:
                    slot, bank, tag, off, wc, op, stream = heads[j]
                    outs[r][stream][off:off + wc] = got
                    missing.discard((r, j))
            if not missing:
                return
            self.resends += len(missing)
        r, j = min(missing)
        raise ResultMismatchError(f"bmv2 tree: rank {r} has no result for chunk {j} of use {self._use} after "
                                  f"{self.max_resends} retransmissions")
