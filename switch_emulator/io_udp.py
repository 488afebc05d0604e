"""UDP socket backend (no root): one socket receives workers' datagrams and sends results.

The loop drains the socket without blocking (no poll per datagram while busy), flushes the fault
injector's held datagram and runs housekeeping when idle, and blocks in ``select`` with a short
timeout otherwise.  Receive/send buffers are enlarged (``SO_RCVBUFFORCE`` when permitted).
Bound to a loopback address, the backend can also send results to a job's IP multicast group
(:mod:`homagg.transport._sockets`); ``multicast=False`` turns that off, ``multicast_any_address``
turns it on for any IPv4 address it is bound to (the groups go out of that address's interface,
TTL 1: e.g. a bridge whose ports are the worker links).  Invariant: ``multicast`` is True only if
the socket can send to groups; ``switch.group_for`` is set accordingly, so a worker is only
offered a group that this backend sends to.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time

from homagg._errors import ConfigError
from homagg.transport._sockets import BUFFER_BYTES, enable_multicast_send, multicast_group, set_buffers

from . import native
from .switch import Switch

__all__ = ["UdpBackend", "set_buffers", "BUFFER_BYTES"]


_said: set[str] = set()


def _say_once(msg: str) -> None:
    if msg not in _said:
        _said.add(msg)
        logging.getLogger("homagg.switch").warning(msg)


class UdpBackend:
    """Serve ``switch`` on a UDP socket bound to ``listen`` until :meth:`stop`."""

    name = "udp"

    def __init__(self, listen: tuple[str, int] = ("127.0.0.1", 0), multicast: bool = True,
                 multicast_any_address: bool = False, engine: str = "auto") -> None:
        """``multicast``: send results to groups where possible (loopback); with
        ``multicast_any_address`` also on a non-loopback address, and raise :class:`ConfigError`
        where that is impossible (IPv6, the wildcard address) rather than fall back silently.
        ``engine``: ``python`` (:mod:`.pipeline`, the reference), ``native`` (:mod:`.native`:
        C with batched syscalls; :class:`ConfigError` where it was not built) or ``auto``
        (native where built, unless the switch injects faults)."""
        if engine not in ("auto", "python", "native"):
            raise ConfigError(f"engine must be auto, python or native, not {engine!r}")
        if engine == "native" and not native.AVAILABLE:
            raise ConfigError("the native engine was not built (no C compiler at install?); use --engine python")
        self.engine = engine
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            set_buffers(self.sock)
            self.sock.bind(listen)
            self.sock.setblocking(False)
            self.addr: tuple[str, int] = self.sock.getsockname()
            self.multicast = multicast and enable_multicast_send(self.sock, self.addr[0],
                                                                 allow_any=multicast_any_address)
            if multicast and multicast_any_address and not self.multicast:
                raise ConfigError(f"the emulator cannot send results to multicast groups from {self.addr[0]} "
                                  "(needs one IPv4 address of an interface, not the wildcard)")
        except BaseException:
            self.sock.close()
            raise
        self._stop = threading.Event()
        self._sendto = self.sock.sendto

    def group_for(self, job_id: int) -> tuple[str, int]:
        """The result multicast group of ``job_id`` on this backend."""
        return multicast_group(job_id, self.addr[1])

    def send(self, dgram: memoryview, addr: tuple[str, int]) -> None:
        try:
            self._sendto(dgram, addr)
        except BlockingIOError:
            select.select([], [self.sock], [], 0.05)
            try:
                self._sendto(dgram, addr)
            except OSError:
                pass  # counted as loss by the workers' retransmissions
        except OSError:
            pass  # e.g. a worker went away; the worker side recovers by retransmission

    def check_engine(self, switch: Switch) -> None:
        """Decide the engine that will serve ``switch`` and record it (``switch.engine``, which the
        control ``status`` reports from the start, before the serving thread runs); raise
        :class:`ConfigError` if the asked engine cannot serve it (the native engine does not inject
        faults)."""
        switch.engine = self._resolve(switch)

    def _resolve(self, switch: Switch) -> str:
        if self.engine == "native" and (switch.faults.config.active or switch.allow_faults):
            raise ConfigError("fault injection runs in the python engine only (--engine python)")
        engine = self.engine
        if engine == "auto":
            engine = "native" if native.AVAILABLE and not (switch.faults.config.active or switch.allow_faults) else "python"
            if not native.AVAILABLE:
                _say_once("the native engine was not built (no C compiler at install?): the python engine serves")
            elif engine == "python":
                _say_once("fault injection is configured or allowed: the python engine serves (the native engine "
                          "injects no faults)")
        return engine

    def serve(self, switch: Switch) -> None:
        switch.data_addr = self.addr
        switch.backend = self.name
        switch.group_for = self.group_for if self.multicast else None
        engine = switch.engine = self._resolve(switch)
        if engine == "native":
            native.NativeEngine().serve(switch, self.sock, self._stop)
            return
        buf = bytearray(65536)
        recv = self.sock.recvfrom_into
        sock = self.sock
        stop = self._stop
        next_house = time.monotonic() + 0.5
        while not stop.is_set():
            ingress = switch.ingress
            try:
                for _ in range(256):
                    n, src = recv(buf)
                    ingress(buf, n, src)
                continue
            except BlockingIOError:
                pass
            except OSError:
                continue  # ICMP errors reported on the socket; ignore
            switch.faults.flush()
            now = time.monotonic()
            if now >= next_house:
                switch.housekeeping()
                next_house = now + 0.5
            select.select([sock], [], [], 0.05)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
