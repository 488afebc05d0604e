"""A process group's presence sockets: how a rank stalled at the switch tells a dead peer from a late one.

At creation every rank of a group with a UDP switch opens its presence socket
(:func:`homagg.transport._peers.presence_socket`) on the address its switch port uses and
publishes it under ``homagg/presence/<rank>`` in the group's store, before the creation barrier;
after that barrier each rank reads its peers' addresses into a
:class:`~homagg.transport._peers.PeerWatch` that every switch port of the group (the first link's,
and one opened after a fallback) consults when a round stalls.  A rank whose process dies closes
its presence socket with it, and the ranks waiting for its words raise
:class:`~homagg.RankTimeoutError` naming it within about a second, where they would otherwise wait
for the switch's progress timeout (or, in a barrier, the group's).

Invariant: the presence socket is open from before the creation barrier until the group is
released, so a peer never finds a live rank's socket closed.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from ..transport._peers import PeerWatch, presence_socket
from ._link import SwitchLink

__all__ = ["Presence"]

_KEY = "homagg/presence"


class Presence:
    """This rank's presence socket and its watch of the peers' (see the module docstring)."""

    def __init__(self, store: Any, rank: int, link: SwitchLink) -> None:
        host = getattr(getattr(link, "port", None), "local_addr", None)
        self.sock: socket.socket | None = presence_socket(host[0]) if host is not None else None
        self.watch: PeerWatch | None = None
        address = list(self.sock.getsockname()) if self.sock is not None else None
        store.set(f"{_KEY}/{rank}", json.dumps(address))

    def connect(self, store: Any, rank: int, size: int) -> None:
        """Read the peers' addresses (every rank published before the creation barrier, which this
        rank has passed): the watch of every port :meth:`watched` returns."""
        peers = {}
        for peer in range(size):
            if peer != rank:
                address = json.loads(store.get(f"{_KEY}/{peer}").decode())
                if address is not None:
                    peers[peer] = (str(address[0]), int(address[1]))
        self.watch = PeerWatch(peers) if self.sock is not None and peers else None

    def watched(self, link: SwitchLink) -> SwitchLink:
        """``link``, its switch port watching the peers."""
        port = getattr(link, "port", None)
        if self.watch is not None and hasattr(port, "peers"):
            port.peers = self.watch
        return link

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
