"""The emulator's control server: JSON lines over TCP (protocol in :mod:`homagg.transport` (``ControlClient``)).

Every request but ``ping`` must carry the switch's shared ``secret`` (compared in constant time);
one without it, or with another, is refused with ``{"ok": false, "refused": "secret"}`` and logged
(logger ``homagg.switch``, WARNING, with the peer address; the secret itself is never logged).
``ping`` answers anyone: it tells the protocol version and the data address, nothing else.
"""

from __future__ import annotations

import hmac
import json
import logging
import socketserver
import threading
from typing import Any

from homagg._errors import ConfigError

from .switch import Switch

__all__ = ["ControlServer"]

log = logging.getLogger("homagg.switch")
_OPEN = frozenset({"ping"})  #: commands served without the secret


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        peer = "%s:%d" % self.client_address[:2]
        for line in self.rfile:
            if not line.strip():
                continue
            try:
                req: Any = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("request must be a JSON object")
                given = req.pop("secret", None)
                if req.get("cmd") not in _OPEN and not self.server.authorized(given):
                    log.warning("control request %r from %s refused: %s", str(req.get("cmd"))[:32], peer,
                                "no secret" if given is None else "wrong secret")
                    resp = {"ok": False, "refused": "secret",
                            "error": "unauthorized: this switch requires its shared secret"}
                else:
                    resp = self.server.switch.control(req, peer)
            except ValueError as exc:
                resp = {"ok": False, "error": f"bad request: {exc}"}
            self.wfile.write(json.dumps(resp).encode() + b"\n")
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    switch: Switch
    secret: bytes

    def authorized(self, given: object) -> bool:
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.secret)


class ControlServer:
    """Serves ``switch.control`` on ``listen`` in a daemon thread; ``addr`` is the bound address.

    ``secret`` (required, at least 16 characters): what clients must send with each request.
    """

    def __init__(self, switch: Switch, listen: tuple[str, int] = ("127.0.0.1", 0), *, secret: str) -> None:
        if not secret or len(secret) < 16:
            raise ConfigError("the control server needs a shared secret of at least 16 characters")
        self._srv = _Server(listen, _Handler)
        self._srv.switch = switch
        self._srv.secret = secret.encode()
        self.addr: tuple[str, int] = self._srv.server_address[:2]  # type: ignore[assignment]
        if not _is_loopback(self.addr[0]):
            log.warning("control port listens on %s:%d, beyond this machine: the secret travels in clear",
                        *self.addr)
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
