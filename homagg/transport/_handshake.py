"""Challenge-response on the control connection: the shared secret never travels.

Both ends know the switch's secret ``S`` (:mod:`._auth` says where from).  On a new TCP connection,
before its first authenticated request, the client runs::

    client -> {"cmd": "challenge"}
    switch <- {"ok": true, "nonce": Ns}                      Ns: 32 fresh random bytes, hex, one use
    client -> {"cmd": "auth", "nonce": Nc, "mac": HMAC(S, "client" | Ns | Nc)}
    switch <- {"ok": true, "mac": HMAC(S, "server" | Ns | Nc)}   (the client checks it: mutual)

Then both hold the session key ``K = HMAC(S, "session" | Ns | Nc)`` and every request on that
connection carries ``"seq"`` (1, 2, 3, ... per connection) and ``"mac" = HMAC(K, "request" | seq |
canonical JSON of the request without "mac")``; the switch accepts exactly the next ``seq``.

Why each part (the tests replay a captured exchange against each):

* a replayed ``auth`` fails: the switch's nonce is fresh per connection and consumed by one
  attempt (right or wrong);
* a reflected MAC fails: each HMAC input starts with its role ("client", "server", "session",
  "request"), so the switch's proof is never a valid client proof, nor a request MAC;
* a replayed or reordered request fails: ``seq`` must be the next one, and ``K`` differs on every
  connection; a modified request fails its MAC;
* every comparison is :func:`hmac.compare_digest` (constant time).

What it does not do: encrypt (requests and answers are readable on the wire; they hold no secret:
the job token a response carries is readable by anyone on the data path anyway), or MAC the
answers (a machine in the middle could alter an answer; the data plane's token check is not
weakened by that).  HMAC-SHA256 throughout, stdlib ``hmac`` and ``secrets``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any

__all__ = ["new_nonce", "proof", "session_key", "request_mac", "check", "canonical"]

_ROLES = frozenset({"client", "server", "session"})


def new_nonce() -> str:
    """32 fresh random bytes, hex."""
    return secrets.token_hex(32)


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "|".join(parts).encode(), hashlib.sha256).hexdigest()


def proof(secret: str, role: str, server_nonce: str, client_nonce: str) -> str:
    """``HMAC(S, role | Ns | Nc)``, role "client" or "server" (what each side sends)."""
    if role not in _ROLES - {"session"}:
        raise ValueError(f"bad role {role!r}")
    return _mac(secret.encode(), role, server_nonce, client_nonce)


def session_key(secret: str, server_nonce: str, client_nonce: str) -> bytes:
    """``K = HMAC(S, "session" | Ns | Nc)``: the key of this connection's request MACs."""
    return bytes.fromhex(_mac(secret.encode(), "session", server_nonce, client_nonce))


def canonical(req: dict[str, Any]) -> str:
    """The request as MACed: sorted keys, no spaces, without its ``mac`` field."""
    return json.dumps({k: v for k, v in req.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))


def request_mac(key: bytes, seq: int, req: dict[str, Any]) -> str:
    """``HMAC(K, "request" | seq | canonical(req))``."""
    return _mac(key, "request", str(seq), canonical(req))


def check(expected: str, given: object) -> bool:
    """Constant-time comparison of a hex MAC with what the peer sent (anything)."""
    return isinstance(given, str) and hmac.compare_digest(expected.encode(), given.encode())
