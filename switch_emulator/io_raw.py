"""Raw-port backend (AF_PACKET, needs root / CAP_NET_RAW): the emulator as a switch with ports.

Each ``--iface`` is a switch port.  Ingress: Ethernet / IPv4 (no options needed, any IHL) / UDP
with destination port ``udp_port`` (default :data:`~homagg.wire.HOMAGG_UDP_PORT`); the homagg
datagram goes through the same pipeline as in UDP mode, the source being ``(ipv4.src, udp.src)``
(the P4 admission key).  The port, MAC and the IPv4 the worker addressed are learned per source;
results go back out of that port as Ethernet / IPv4 / UDP (source port ``udp_port``, checksum 0)
/ homagg.  ARP requests for an address in ``answer_arp`` are answered with the port's MAC.

No IPv4 fragmentation: a job's K must fit the ports' MTU (``(MTU - 44) / 4`` words; 364 at 1500).
Frames the backend itself sent (``PACKET_OUTGOING``) and frames from ``udp_port`` are ignored.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Iterable

from homagg._errors import ConfigError
from homagg.wire import HOMAGG_UDP_PORT

from .io_udp import set_buffers
from .switch import Switch

__all__ = ["RawBackend", "ipv4_checksum"]

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
ETH_P_ARP = 0x0806
PACKET_OUTGOING = 4
_ETH = struct.Struct("!6s6sH")
_IP = struct.Struct("!BBHHHBBH4s4s")
_UDP = struct.Struct("!HHHH")


def ipv4_checksum(header: bytes | memoryview) -> int:
    """Internet checksum of an IPv4 header (checksum field included as zero by the caller)."""
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


class RawBackend:
    """Serve a :class:`Switch` on raw interfaces; ``addr`` is ``(iface list, udp_port)`` for display."""

    name = "raw"

    def __init__(self, ifaces: Iterable[str], udp_port: int = HOMAGG_UDP_PORT,
                 answer_arp: Iterable[str] = ()) -> None:
        self.ifaces = list(ifaces)
        if not self.ifaces:
            raise ConfigError("the raw backend needs at least one --iface")
        self.udp_port = udp_port
        self.arp_ips = {socket.inet_aton(ip) for ip in answer_arp}
        self.socks: dict[int, tuple[socket.socket, str, bytes]] = {}
        for name in self.ifaces:
            s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            set_buffers(s)
            s.bind((name, 0))
            s.setblocking(False)
            mac = s.getsockname()[4][:6].ljust(6, b"\0")
            self.socks[s.fileno()] = (s, name, mac)
        self.addr = (",".join(self.ifaces), udp_port)
        #: (ip, port) -> (socket, port MAC, peer MAC, switch IPv4 the peer addressed)
        self.l2: dict[tuple[str, int], tuple[socket.socket, bytes, bytes, bytes]] = {}
        self._stop = threading.Event()
        self._ident = 0
        self.ignored = 0

    def send(self, dgram: memoryview, addr: tuple[str, int]) -> None:
        entry = self.l2.get(addr)
        if entry is None:
            return
        sock, my_mac, peer_mac, my_ip = entry
        self._ident = (self._ident + 1) & 0xFFFF
        total = 20 + 8 + len(dgram)
        ip = bytearray(_IP.pack(0x45, 0, total, self._ident, 0x4000, 64, 17, 0, my_ip, socket.inet_aton(addr[0])))
        struct.pack_into("!H", ip, 10, ipv4_checksum(ip))
        frame = b"".join((_ETH.pack(peer_mac, my_mac, ETH_P_IP), ip,
                          _UDP.pack(self.udp_port, addr[1], 8 + len(dgram), 0), dgram))
        try:
            sock.send(frame)
        except OSError:
            pass  # recovered by the workers' retransmission

    def _arp(self, sock: socket.socket, mac: bytes, frame: memoryview) -> None:
        if len(frame) < 42:
            return
        htype, ptype, hlen, plen, op = struct.unpack_from("!HHBBH", frame, 14)
        if op != 1 or ptype != ETH_P_IP or hlen != 6 or plen != 4:
            return
        sha, spa, tpa = bytes(frame[22:28]), bytes(frame[28:32]), bytes(frame[38:42])
        if tpa in self.arp_ips:
            reply = _ETH.pack(sha, mac, ETH_P_ARP) + struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, 2, mac, tpa,
                                                                  sha, spa)
            sock.send(reply)

    def _frame(self, switch: Switch, sock: socket.socket, mac: bytes, mv: memoryview, n: int) -> None:
        if n < 14 + 20 + 8:
            self.ignored += 1
            return
        dst_mac, src_mac, etype = _ETH.unpack_from(mv, 0)
        if etype == ETH_P_ARP:
            self._arp(sock, mac, mv[:n])
            return
        if etype != ETH_P_IP:
            return
        vihl, _tos, total, _id, frag, _ttl, proto, _csum, src, dst = _IP.unpack_from(mv, 14)
        ihl = (vihl & 0xF) * 4
        if vihl >> 4 != 4 or proto != 17 or ihl < 20 or frag & 0x3FFF or 14 + total > n:
            return
        sport, dport, ulen, _ucsum = _UDP.unpack_from(mv, 14 + ihl)
        if dport != self.udp_port or sport == self.udp_port or ulen < 8 or 14 + ihl + ulen > n:
            return
        src_addr = (socket.inet_ntoa(src), sport)
        if src_addr not in self.l2 or self.l2[src_addr][2] != src_mac:
            self.l2[src_addr] = (sock, mac, bytes(src_mac), bytes(dst))
        start = 14 + ihl + 8
        switch.ingress(mv[start:start + ulen - 8], ulen - 8, src_addr)

    def serve(self, switch: Switch) -> None:
        switch.data_addr = self.addr
        switch.backend = self.name
        buf = bytearray(65536 + 64)
        mv = memoryview(buf)
        fds = list(self.socks)
        next_house = time.monotonic() + 0.5
        while not self._stop.is_set():
            ready, _, _ = select.select(fds, [], [], 0.05)
            for fd in ready:
                sock, _name, mac = self.socks[fd]
                for _ in range(256):
                    try:
                        n, meta = sock.recvfrom_into(buf)
                    except BlockingIOError:
                        break
                    except OSError:
                        break
                    if meta[2] == PACKET_OUTGOING:
                        continue
                    self._frame(switch, sock, mac, mv, n)
            if not ready:
                switch.faults.flush()
            now = time.monotonic()
            if now >= next_house:
                switch.housekeeping()
                next_house = now + 0.5

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        for s, _n, _m in self.socks.values():
            s.close()
