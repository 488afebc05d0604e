"""UDP socket set-up shared by the worker port and the emulator: buffers and result multicast.

Result multicast (one send per completed slot instead of one per worker) works wherever the
switch and all its workers share an IP multicast domain; the emulator offers it on loopback by
default, and on any other address it is bound to when told so (``--multicast``: e.g. a switch
host whose worker links are ports of one bridge, :mod:`homagg.bench._netns`):

* group of job ``j`` on a switch whose data port is ``p``: ``(239.255.(j >> 8).(j & 255), p)``
  (:func:`multicast_group`; distinct per job and per emulator on one host);
* the sender (:func:`enable_multicast_send`) sets ``IP_MULTICAST_IF`` to its own address,
  ``IP_MULTICAST_LOOP`` = 1 and TTL 1 (the datagrams never leave the host/link: no router
  forwards them); the group's interface is the one holding that address;
* a worker (:func:`join_group`) binds a second socket to the group address with ``SO_REUSEADDR``
  (several workers of one host bind the same group; each receives every datagram) and joins it
  with ``IP_ADD_MEMBERSHIP`` on the interface of its unicast address;
* :func:`join_results_group` does the whole worker side over the control client: ask for the
  group, join, have the switch send a probe to the group and wait for it (a host whose loopback
  does not deliver multicast would otherwise lose every result), then ``subscribe``.  Any
  failure short of a control-channel error leaves the worker on unicast results.

Invariants: every function either returns a configured socket or raises ``OSError`` having
closed what it opened; buffer enlargement is best effort (``*BUFFORCE`` needs CAP_NET_ADMIN).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import select
import socket
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ConfigError
from ._errmap import transport_error

__all__ = ["BUFFER_BYTES", "PROBE_PREFIX", "UDP_GRO", "set_buffers", "set_udp_gro", "link_mtu", "interface_of", "send_datagram", "multicast_group", "enable_multicast_send", "join_group",
           "join_results_group", "gso_env", "gso_default"]

BUFFER_BYTES = 32 << 20
UDP_GRO = 104  #: <linux/udp.h>: the socket accepts coalesced datagrams (homagg/_udpseg.h)
PROBE_PREFIX = b"homagg-group-probe:"  #: a probe datagram: this prefix + the worker's nonce (not a homagg packet)
PROBE_WAIT_S = 1.0


def set_buffers(sock: socket.socket, nbytes: int = BUFFER_BYTES, send: bool = True) -> None:
    """Best-effort large receive (and send) buffers (FORCE variants first, then the plain ones)."""
    pairs = [(getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF)]
    if send:
        pairs.append((getattr(socket, "SO_SNDBUFFORCE", 32), socket.SO_SNDBUF))
    for force, plain in pairs:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, nbytes)
        except OSError:
            try:
                sock.setsockopt(socket.SOL_SOCKET, plain, nbytes)
            except OSError:
                pass


def set_udp_gro(sock: socket.socket, on: bool = True) -> bool:
    """UDP_GRO on (or off) for ``sock``: a receive may then hand over several datagrams of one flow
    in one buffer, which only the C loops split (the worker's datapath, the emulator's native
    engine).  False where the kernel has no UDP_GRO (before 5.0): one datagram per buffer, as without."""
    try:
        sock.setsockopt(socket.IPPROTO_UDP, UDP_GRO, int(on))
    except OSError:
        return False
    return True


def multicast_group(job_id: int, port: int) -> tuple[str, int]:
    """The result group of job ``job_id`` on a switch with data port ``port``."""
    return (f"239.255.{(job_id >> 8) & 0xFF}.{job_id & 0xFF}", port)


def enable_multicast_send(sock: socket.socket, local_ip: str, allow_any: bool = False) -> bool:
    """Let ``sock`` (bound to ``local_ip``) send to groups out of the interface of ``local_ip``;
    True if enabled.  Only on a loopback address unless ``allow_any`` (an IPv4 unicast address the
    socket is bound to, not the wildcard: ``IP_MULTICAST_IF`` needs one interface)."""
    try:
        addr = ipaddress.ip_address(local_ip)
        if addr.version != 4 or addr.is_unspecified or addr.is_multicast:
            return False
        if not (addr.is_loopback or allow_any):
            return False
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(local_ip))
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    except (OSError, ValueError):
        return False
    return True


def join_group(group: tuple[str, int], local_ip: str) -> socket.socket:
    """A non-blocking socket receiving ``group``'s datagrams on the interface of ``local_ip``."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        set_buffers(s, send=False)
        s.bind(group)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                     socket.inet_aton(group[0]) + socket.inet_aton(local_ip))
        s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


def join_results_group(ctl: Any, job_id: int, worker_id: int, local_ip: str,
                       wait_s: float = PROBE_WAIT_S) -> socket.socket | None:
    """Worker side of result multicast through control client ``ctl``: the joined, probed and
    subscribed group socket, or None (results by unicast) where the switch offers no group, the
    join fails, or the probe does not arrive within ``wait_s`` seconds."""
    try:
        group = ctl.group(job_id)
    except ConfigError:  # a switch without result groups (e.g. the BMv2 controller)
        return None
    if group is None:
        return None
    try:
        msock = join_group(group, local_ip)
    except OSError:
        return None
    try:
        nonce = os.urandom(8).hex()
        ctl.probe_group(job_id, nonce)
        if not _await_probe(msock, PROBE_PREFIX + nonce.encode(), wait_s):
            msock.close()
            return None
        ctl.subscribe(job_id, worker_id)
    except BaseException:
        msock.close()
        raise
    return msock


def _await_probe(sock: socket.socket, expected: bytes, wait_s: float) -> bool:
    """Drain ``sock`` until ``expected`` arrives (True) or ``wait_s`` passes (False)."""
    deadline = time.monotonic() + wait_s
    buf = bytearray(len(expected) + 64)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not select.select([sock], [], [], left)[0]:
            continue
        try:
            n = sock.recv_into(buf)
        except BlockingIOError:
            continue
        if bytes(buf[:n]) == expected:
            return True


def interface_of(ip: str) -> str | None:
    """Name of the local interface holding IPv4 address ``ip``, or None."""
    try:
        packed = socket.inet_aton(ip)
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                if fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("16s16x", name.encode()[:15]))[20:24] == packed:
                    return name
            except OSError:
                continue
    return None


def link_mtu(ip: str) -> int | None:
    """MTU of the link a switch bound to ``ip`` is reached over: the interface holding ``ip`` (its
    MTU is what every worker's frames to it must fit), else the route's MTU to ``ip`` (Linux
    ``IP_MTU`` of a connected UDP socket: nothing is sent); None where neither can be read."""
    name = interface_of(ip)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        if name is not None:
            try:
                req = struct.pack("16s16x", name.encode()[:15])
                return int(struct.unpack("16si12x", fcntl.ioctl(s.fileno(), _SIOCGIFMTU, req))[1])
            except OSError:
                pass
        try:
            s.connect((ip, 9))
            return int(s.getsockopt(socket.IPPROTO_IP, getattr(socket, "IP_MTU", 14)))
        except OSError:
            return None


_SIOCGIFADDR, _SIOCGIFMTU = 0x8915, 0x8921  #: Linux ioctls: an interface's IPv4 address, its MTU


def send_datagram(sock: socket.socket, send: Any, dgram: memoryview, stats: dict[str, int], what: Any) -> None:
    """``send(dgram)`` on non-blocking ``sock``: a full buffer waits up to 50 ms once, then counts
    as loss (the sender's timer resends); ICMP port unreachable counts in ``stats["refused"]``;
    any other error raises :func:`transport_error` described by ``what()``."""
    try:
        send(dgram)
    except BlockingIOError:
        select.select([], [sock], [], 0.05)
        try:
            send(dgram)
        except OSError:
            pass  # treated as loss: retransmitted after the RTO
    except ConnectionRefusedError:  # ICMP port unreachable: switch not (yet) up, or gone
        stats["refused"] = stats.get("refused", 0) + 1
    except OSError as exc:
        raise transport_error(exc, what()) from exc


def gso_env() -> bool | None:
    """``HOMAGG_UDP_GSO`` as a bool (``0``, ``off``, ``no``, ``false`` or empty: False), None when unset."""
    env = os.environ.get("HOMAGG_UDP_GSO")
    return None if env is None else env.strip().lower() not in ("0", "", "false", "no", "off")


def gso_default(sock: socket.socket) -> bool:
    """Whether a port whose connected socket is ``sock`` sends GSO messages by default:
    ``HOMAGG_UDP_GSO`` when set, else True where the socket's local address is a loopback one (only
    sockets receive there: the kernel cuts a GSO message back into its datagrams for the
    emulator's socket, or hands it over whole to a UDP_GRO socket) or the interface holding it is a
    physical device (``/sys/class/net/<name>/device`` exists); False on veths and bridges, where
    a switch reading AF_PACKET (BMv2 in Mininet) would see one merged frame."""
    env = gso_env()
    if env is not None:
        return env
    local = sock.getsockname()[0]
    try:
        if ipaddress.ip_address(local).is_loopback:
            return True
    except ValueError:
        return False
    name = interface_of(local)
    return name is not None and (Path("/sys/class/net") / name / "device").exists()
