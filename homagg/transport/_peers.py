"""Is a peer rank still there?  Telling a dead rank from a late one while a round stalls.

A round waits at the switch until every worker of the job sent its words.  The switch cannot tell a
rank that died from one that is late (rank 0 writing a checkpoint while the others wait in a
barrier), and a barrier must wait for a late rank as long as the group's timeout allows.  A dead
rank leaves a trace that needs no cooperation from it: the kernel closes its sockets.

So every rank of a process group holds a *presence socket*: an unconnected UDP socket on the
address its switch port uses, never read, its receive buffer small (a probe that finds it full is
dropped silently: a live rank never answers with an error).  Its address goes to the peers through
the group's store at creation.  Once a round has stalled for ``min_stall_s`` (0.5 s), the port's
timer scan calls :meth:`PeerWatch.gone`, which, at most every ``interval_s`` (0.5 s), reads what the
last probes brought back and sends one byte to each peer's presence socket, each from a connected
UDP socket of its own.  A closed presence socket (the rank's process is gone, or its group was shut
down) answers with ICMP port unreachable, which the connected socket reports as ``ECONNREFUSED``.

The port's round loop then asks the switch (over its control port, where it has one) whether it
still waits for those ranks' words for the oldest pending chunk: a dead rank whose words it already
holds is not what the round waits for (a lost result is; the round's timeout names it).

Invariant: :meth:`PeerWatch.gone` names a rank only on that positive evidence.  A late rank, a rank
on a host that does not answer (host down, ICMP filtered) or an unreachable network is never
evidence: the round's own timeout decides then, as without the watch.  A stall shorter than
``min_stall_s`` sends nothing.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

__all__ = ["PeerWatch", "presence_socket"]

_PROBE = b"\x00"  #: a probe's payload (never read: the presence socket's buffer drops what overflows)
_RCVBUF = 4096  #: the presence socket's receive buffer: a handful of probes


def presence_socket(host: str) -> socket.socket:
    """This rank's presence socket: UDP, bound to ``host`` (the address its switch port uses), never
    read, open as long as the rank's group is."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


class PeerWatch:
    """One rank's view of its peers' presence sockets (``peers``: group rank -> address; never this
    rank's own).  Not thread-safe: one round at a time calls it, as one round at a time runs on a port."""

    def __init__(self, peers: Mapping[int, tuple[str, int]], min_stall_s: float = 0.5,
                 interval_s: float = 0.5) -> None:
        self.peers = dict(peers)
        self.min_stall_s, self.interval_s = min_stall_s, interval_s
        self._probes: dict[int, socket.socket] = {}  # made at the first stall, kept for the next
        self._next = float("-inf")
        self.sent = 0  #: probes sent so far
        self.dead: tuple[int, ...] = ()  #: the ranks the last reason named

    def gone(self, now: float, stalled_s: float) -> str | None:
        """Why some peers are known gone (a clause naming them), or None; probes as the module
        docstring says (``now``: monotonic seconds; ``stalled_s``: how long the round made no progress)."""
        if stalled_s < self.min_stall_s or now < self._next or not self.peers:
            return None
        self._next = now + self.interval_s
        dead = {rank for rank, sock in self._probes.items() if self._refused(sock)}
        if not dead:
            dead = self._probe()
        if not dead:
            return None
        self.dead = tuple(sorted(dead))
        where = ", ".join(f"{r} at {self.peers[r][0]}:{self.peers[r][1]}" for r in self.dead)
        return (f"rank(s) {', '.join(map(str, self.dead))} of the group are gone: their presence sockets answer "
                f"ICMP port unreachable ({where}; the process died or shut its group down)")

    def _probe(self) -> set[int]:
        """One probe to every peer; the ranks whose socket reported an earlier probe refused."""
        refused = set()
        for rank, addr in self.peers.items():
            sock = self._probes.get(rank)
            if sock is None:
                sock = self._probes[rank] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.setblocking(False)
                try:
                    sock.connect(addr)
                except OSError:  # no route now: no evidence; tried again at the next check
                    del self._probes[rank]
                    sock.close()
                    continue
            try:
                sock.send(_PROBE)
                self.sent += 1
            except ConnectionRefusedError:
                refused.add(rank)
            except OSError:  # a full buffer, an unreachable host or network: no evidence
                pass
        return refused

    @staticmethod
    def _refused(sock: socket.socket) -> bool:
        """Whether an ICMP port unreachable came back to this probe socket (reading clears it)."""
        try:
            sock.recv(16)  # nothing is ever sent back but errors; a datagram here is no evidence
        except ConnectionRefusedError:  # ECONNREFUSED
            return True
        except OSError:  # nothing queued (EAGAIN), or another ICMP error: no evidence
            return False
        return False

    def close(self) -> None:
        for sock in self._probes.values():
            sock.close()
        self._probes.clear()
