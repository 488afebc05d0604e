"""The emulator's control server: JSON lines over TCP (protocol in :mod:`homagg.transport` (``ControlClient``))."""

from __future__ import annotations

import json
import socketserver
import threading
from typing import Any

from .switch import Switch

__all__ = ["ControlServer"]


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        for line in self.rfile:
            if not line.strip():
                continue
            try:
                req: Any = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("request must be a JSON object")
                resp = self.server.switch.control(req)
            except ValueError as exc:
                resp = {"ok": False, "error": f"bad request: {exc}"}
            self.wfile.write(json.dumps(resp).encode() + b"\n")
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    switch: Switch


class ControlServer:
    """Serves ``switch.control`` on ``listen`` in a daemon thread; ``addr`` is the bound address."""

    def __init__(self, switch: Switch, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self._srv = _Server(listen, _Handler)
        self._srv.switch = switch
        self.addr: tuple[str, int] = self._srv.server_address[:2]  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="homagg-switch-control", daemon=True)

    def start(self) -> ControlServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()
