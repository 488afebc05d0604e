"""The emulator's control server: JSON lines over TCP (protocol in :mod:`homagg.transport` (``ControlClient``)).

Every request but ``ping`` must be authenticated with the switch's shared secret by challenge and
response (:mod:`homagg.transport._handshake`: the secret never travels; each connection proves it
once, then MACs every request with a per-connection key and sequence number).  A request without
a valid MAC, a wrong proof, a replayed nonce or sequence number is refused with
``{"ok": false, "refused": "secret"}`` and logged (logger ``homagg.switch``, WARNING, with the peer
address; nothing secret is logged).  ``ping`` answers anyone: it tells the protocol version and
the data address, nothing else.
"""

from __future__ import annotations

import json
import logging
import socketserver
import threading
from typing import Any

from homagg._errors import ConfigError
from homagg.transport import _handshake as hs

from .switch import Switch

__all__ = ["ControlServer"]

log = logging.getLogger("homagg.switch")
_OPEN = frozenset({"ping"})  #: commands served without the secret


_REFUSED = {"ok": False, "refused": "secret", "error": "unauthorized: this switch requires its shared secret"}


class _Handler(socketserver.StreamRequestHandler):
    """One control connection: its challenge nonce, session key and last sequence number."""

    server: _Server

    def handle(self) -> None:
        self.peer = "%s:%d" % self.client_address[:2]
        self.nonce: str | None = None  # the pending challenge (one use)
        self.key: bytes | None = None  # the session key, once the client proved the secret
        self.seq = 0
        for line in self.rfile:
            if not line.strip():
                continue
            try:
                req: Any = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("request must be a JSON object")
                resp = self._serve(req)
            except ValueError as exc:
                resp = {"ok": False, "error": f"bad request: {exc}"}
            self.wfile.write(json.dumps(resp).encode() + b"\n")
            self.wfile.flush()

    def _serve(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd = req.get("cmd")
        if cmd == "challenge":
            self.nonce, self.key = hs.new_nonce(), None
            return {"ok": True, "nonce": self.nonce}
        if cmd == "auth":
            return self._auth(req)
        if cmd in _OPEN:
            return self.server.switch.control(req, self.peer)
        seq = req.get("seq")
        if self.key is None or not isinstance(seq, int) or seq != self.seq + 1 \
                or not hs.check(hs.request_mac(self.key, seq, req), req.get("mac")):
            why = ("not authenticated" if self.key is None else
                   "sequence number out of order (replayed?)" if seq != self.seq + 1 else "bad request MAC")
            return self._refuse(str(cmd), why)
        self.seq = seq
        return self.server.switch.control({k: v for k, v in req.items() if k not in ("seq", "mac")}, self.peer)

    def _auth(self, req: dict[str, Any]) -> dict[str, Any]:
        ns, self.nonce = self.nonce, None  # consumed by this attempt, right or wrong
        nc = req.get("nonce")
        secret = self.server.secret
        if ns is None or not isinstance(nc, str) or not nc \
                or not hs.check(hs.proof(secret, "client", ns, nc), req.get("mac")):
            return self._refuse("auth", "no challenge pending" if ns is None else "wrong proof")
        self.key, self.seq = hs.session_key(secret, ns, nc), 0
        return {"ok": True, "mac": hs.proof(secret, "server", ns, nc)}

    def _refuse(self, cmd: str, why: str) -> dict[str, Any]:
        log.warning("control request %r from %s refused: %s", cmd[:32], self.peer, why)
        return dict(_REFUSED)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    switch: Switch
    secret: str


class ControlServer:
    """Serves ``switch.control`` on ``listen`` in a daemon thread; ``addr`` is the bound address.

    ``secret`` (required, at least 16 characters): what clients must prove they know.
    """

    def __init__(self, switch: Switch, listen: tuple[str, int] = ("127.0.0.1", 0), *, secret: str) -> None:
        if not secret or len(secret) < 16:
            raise ConfigError("the control server needs a shared secret of at least 16 characters")
        self._srv = _Server(listen, _Handler)
        self._srv.switch = switch
        self._srv.secret = secret
        self.addr: tuple[str, int] = self._srv.server_address[:2]  # type: ignore[assignment]
        if not _is_loopback(self.addr[0]):
            log.warning("control port listens on %s:%d, beyond this machine: requests are authenticated, "
                        "not encrypted", *self.addr)
        self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="homagg-switch-control", daemon=True)

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()


def _is_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
