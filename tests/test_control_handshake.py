"""The control port's challenge-response (homagg/transport/_handshake.py) against captured traffic.

A recording TCP proxy sits between a real :class:`ControlClient` and a real emulator; the oracle
is what the switch does with the captured lines replayed, reflected or tampered with: every such
request is refused and nothing is admitted, while the honest client works and its secret never
appears in the bytes on the wire.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

import switch_emulator
from homagg.transport import ControlClient
from homagg.transport import _handshake as hs


class RecordingProxy:
    """Forwards one TCP connection at a time to ``target``, recording both directions' bytes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.addr = self.lsock.getsockname()[:2]
        self.up = bytearray()  # client -> switch
        self.down = bytearray()  # switch -> client
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(c, s, self.up), daemon=True).start()
            threading.Thread(target=self._pipe, args=(s, c, self.down), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, log: bytearray) -> None:
        try:
            while data := src.recv(65536):
                log += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def lines(self, direction: str) -> list[dict]:
        raw = self.up if direction == "up" else self.down
        return [json.loads(ln) for ln in bytes(raw).splitlines() if ln.strip()]

    def close(self) -> None:
        self.lsock.close()


class Conn:
    """A raw control connection: one JSON line out, one back."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.sock = socket.create_connection(addr, timeout=10)
        self.rfile = self.sock.makefile("rb")

    def send(self, req: dict) -> dict:
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        return json.loads(self.rfile.readline())

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


@pytest.fixture
def captured() -> Iterator[tuple[switch_emulator.RunningSwitch, list[dict], list[dict]]]:
    """A switch, and the lines of one honest client's session through the proxy (admit, status)."""
    with switch_emulator.start() as sw:
        proxy = RecordingProxy(sw.control_addr)
        try:
            with ControlClient(proxy.addr, secret=sw.secret) as ctl:
                job = ctl.admit(2, job_id=7)
                assert job.job_id == 7 and ctl.status()["jobs"]
                assert ctl.remove(7)
            up, down = proxy.lines("up"), proxy.lines("down")
            assert sw.secret.encode() not in bytes(proxy.up) + bytes(proxy.down)  # never on the wire
        finally:
            proxy.close()
        yield sw, up, down


def test_the_honest_exchange_is_challenge_auth_then_sequenced_macs(captured) -> None:
    sw, up, down = captured
    assert [r["cmd"] for r in up] == ["challenge", "auth", "admit", "status", "remove"]
    assert [r.get("seq") for r in up[2:]] == [1, 2, 3]
    ns, nc = down[0]["nonce"], up[1]["nonce"]
    assert up[1]["mac"] == hs.proof(sw.secret, "client", ns, nc)
    assert down[1]["mac"] == hs.proof(sw.secret, "server", ns, nc)  # the switch proved it too
    assert all(r["ok"] for r in down)


def test_a_replayed_session_is_refused_and_admits_nothing(captured) -> None:
    sw, up, _ = captured
    conn = Conn(sw.control_addr)
    try:
        fresh = conn.send(up[0])  # challenge: a new nonce
        assert fresh["ok"] and fresh["nonce"] != captured[2][0]["nonce"]
        r = conn.send(up[1])  # the captured proof is for the old nonce
        assert not r["ok"] and r["refused"] == "secret"
        for req in up[2:]:  # the captured, MACed requests
            r = conn.send(req)
            assert not r["ok"] and r["refused"] == "secret", (req["cmd"], r)
    finally:
        conn.close()
    assert 7 not in sw.switch.admission.jobs


def test_within_a_session_a_replayed_reordered_or_tampered_request_is_refused(captured) -> None:
    sw, _, _ = captured
    conn = Conn(sw.control_addr)
    try:
        ns = conn.send({"cmd": "challenge"})["nonce"]
        nc = hs.new_nonce()
        assert conn.send({"cmd": "auth", "nonce": nc, "mac": hs.proof(sw.secret, "client", ns, nc)})["ok"]
        key = hs.session_key(sw.secret, ns, nc)

        def signed(seq: int, **req: object) -> dict:
            req["seq"] = seq
            return {**req, "mac": hs.request_mac(key, seq, req)}

        first = signed(1, cmd="status")
        assert conn.send(first)["ok"]
        assert conn.send(first)["refused"] == "secret"  # the same line again
        assert conn.send(signed(5, cmd="status"))["refused"] == "secret"  # skips ahead
        admit = signed(2, cmd="admit", job={"world_size": 2, "job_id": 9})
        admit["job"] = {"world_size": 3, "job_id": 9}  # tampered after signing
        assert conn.send(admit)["refused"] == "secret"
        assert 9 not in sw.switch.admission.jobs
        assert conn.send(signed(2, cmd="admit", job={"world_size": 2, "job_id": 9}))["ok"]  # the honest one
        assert sw.switch.admission.jobs[9].world_size == 2
    finally:
        conn.close()


def test_a_reflected_proof_and_a_reused_nonce_are_refused(captured) -> None:
    sw, _, _ = captured
    conn = Conn(sw.control_addr)
    try:
        ns = conn.send({"cmd": "challenge"})["nonce"]
        nc = hs.new_nonce()
        # the switch's own proof for these nonces, sent back as the client's: refused (roles differ)
        reflected = hs.proof(sw.secret, "server", ns, nc)
        assert conn.send({"cmd": "auth", "nonce": nc, "mac": reflected})["refused"] == "secret"
        # that attempt consumed the challenge: even the right proof for it is refused now
        right = hs.proof(sw.secret, "client", ns, nc)
        assert conn.send({"cmd": "auth", "nonce": nc, "mac": right})["refused"] == "secret"
        assert conn.send({"cmd": "status", "seq": 1, "mac": "0" * 64})["refused"] == "secret"
    finally:
        conn.close()


def test_a_switch_that_cannot_prove_the_secret_is_refused_by_the_client() -> None:
    """A service on the control port that answers the challenge but does not know the secret."""
    srv = socket.create_server(("127.0.0.1", 0))

    def impostor() -> None:
        c, _ = srv.accept()
        f = c.makefile("rb")
        for line in f:
            cmd = json.loads(line)["cmd"]
            resp = {"ok": True, "nonce": "ab" * 32} if cmd == "challenge" else {"ok": True, "mac": "cd" * 32}
            c.sendall(json.dumps(resp).encode() + b"\n")
        c.close()

    threading.Thread(target=impostor, daemon=True).start()
    from homagg import AuthenticationError

    with ControlClient(srv.getsockname()[:2], secret="s" * 32) as ctl:
        with pytest.raises(AuthenticationError, match="did not prove"):
            ctl.status()
    srv.close()
