"""UDP socket backend (no root): one socket receives workers' datagrams and sends results.

The loop drains the socket without blocking (no poll per datagram while busy), flushes the fault
injector's held datagram and runs housekeeping when idle, and blocks in ``select`` with a short
timeout otherwise.  Receive/send buffers are enlarged (``SO_RCVBUFFORCE`` when permitted).
Bound to a loopback address, the backend can also send results to a job's IP multicast group
(:mod:`homagg.transport._sockets`); ``multicast=False`` turns that off.
"""

from __future__ import annotations

import select
import socket
import threading
import time

from homagg.transport._sockets import BUFFER_BYTES, enable_multicast_send, multicast_group, set_buffers

from .switch import Switch

__all__ = ["UdpBackend", "set_buffers", "BUFFER_BYTES"]


class UdpBackend:
    """Serve ``switch`` on a UDP socket bound to ``listen`` until :meth:`stop`."""

    name = "udp"

    def __init__(self, listen: tuple[str, int] = ("127.0.0.1", 0), multicast: bool = True) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_buffers(self.sock)
        self.sock.bind(listen)
        self.sock.setblocking(False)
        self.addr: tuple[str, int] = self.sock.getsockname()
        self.multicast = multicast and enable_multicast_send(self.sock, self.addr[0])
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

    def serve(self, switch: Switch) -> None:
        switch.data_addr = self.addr
        switch.backend = self.name
        switch.group_for = self.group_for if self.multicast else None
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
