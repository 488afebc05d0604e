"""Control protocol client: admit/register/remove jobs and read counters on a homagg switch.

Protocol (the emulator serves it): JSON lines over TCP.  Each request is one JSON object on one
line with a ``cmd``; each response is one line, ``{"ok": true, ...}`` or ``{"ok": false, "error":
"..."}``.  Every command but ``ping`` is authenticated with the switch's shared secret (:mod:`._auth`
says where client and switch find it) by challenge and response, the secret never on the wire:
once per connection ``challenge`` / ``auth``, then a ``seq`` and ``mac`` in every request
(:mod:`._handshake`).  A refused one answers ``"refused": "secret"``
(:class:`~homagg.AuthenticationError`).

=================  ==========================================  =================================
cmd                request fields                              response fields
=================  ==========================================  =================================
``ping``           -                                           ``version``, ``data`` [ip, port]
``admit``          ``job``: JobSpec dict; ``job_id``,          ``job``: the admitted JobSpec
                   ``slot_base`` and ``token`` may be null     (with its token)
                   (switch picks)
``register``       ``job_id``, ``worker_id``, ``ip``, ``port``  ``job``
``group``          ``job_id``                                  ``group``: [ip, port] of the job's
                                                               result multicast group, or null
``probe``          ``job_id``, ``nonce`` (str)                 - ; sends ``homagg-group-probe:<nonce>``
                                                               to the group (delivery check)
``subscribe``      ``job_id``, ``worker_id``, ``on`` (bool)     ``subscribed``: worker ids that get
                                                               results through the group
``remove``         ``job_id``                                  ``removed``: bool
``status``         ``jobs_only`` (optional, bool): ``jobs``    ``counters``, ``jobs``, ``faults``
                   alone will do (BMv2's agent then skips      (``jobs`` alone with ``jobs_only``
                   its P4Runtime read)                         on BMv2's agent)
``slot``           ``job_id``, ``slot`` (absolute)             ``banks``: [{bank, bitmap, count,
                                                               complete, missing, tag, offset}]
``faults``         ``drop``, ``duplicate``, ``reorder``,       ``faults``; refused unless the
                   ``seed``, ``mute`` (emulator only)          switch was started with faults on
``reset_counters`` -                                           -
=================  ==========================================  =================================

Admission works with OS-picked UDP ports: admit the job with its ``world_size`` (and no
``workers``), then every worker binds its socket and ``register`` s its own (ip, port) before it
sends (:class:`homagg.transport.UdpSwitchPort` does this when given ``control=``).  Where the
switch offers a result multicast group (``group``; the emulator on loopback), a worker that has
joined it (and received a ``probe`` through it) says so with ``subscribe`` and then receives each result through one send to the group
(registering again unsubscribes: the new socket has not joined).  Packets from
unregistered sources are dropped by the switch (``drop_unknown_source``).

Usage::

    ctl = ControlClient(("127.0.0.1", 18498))
    job = ctl.admit(world_size=4, n_slots=64, words_per_packet=2048)   # -> JobSpec
    ...                                                                # workers register + run
    ctl.remove(job.job_id)                                             # slots reclaimed

:func:`parse_addr` (re-exported here) is :func:`homagg.jobs.parse_addr`, the one address parser.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from typing import Any

from .._errors import AuthenticationError, ConfigError
from ..jobs import P4, JobSpec, format_addr, parse_addr
from . import _handshake as hs
from ._auth import resolve_secret
from ._errmap import transport_error

__all__ = ["ControlClient", "parse_addr"]


class ControlClient:
    """A blocking client of the control protocol; one TCP connection, reopened on demand.

    ``secret``: the switch's shared secret; None finds it as :func:`._auth.resolve_secret` says
    (a switch this process started, else ``HOMAGG_SWITCH_SECRET`` / ``HOMAGG_SWITCH_SECRET_FILE``).
    """

    def __init__(self, addr: str | tuple[str, int], timeout: float = 10.0, *, secret: str | None = None) -> None:
        self.addr = parse_addr(addr)
        self.timeout = timeout
        self._secret = resolve_secret(self.addr, secret)
        self._sock: socket.socket | None = None
        self._rfile: Any = None
        self._key: bytes | None = None  # this connection's session key (after the handshake)
        self._seq = 0

    def request(self, cmd: str, **fields: Any) -> dict[str, Any]:
        """Send one request; return the response (raise TransportError/ConfigError on failure,
        AuthenticationError when the switch refused the secret)."""
        for attempt in (0, 1):
            try:
                if self._sock is None:
                    self._sock = socket.create_connection(self.addr, timeout=self.timeout)
                    self._rfile = self._sock.makefile("rb")
                    if self._secret is not None and cmd != "ping":
                        self._handshake()
                elif self._key is None and self._secret is not None and cmd != "ping":
                    self._handshake()
                req = {"cmd": cmd, **fields}
                if self._key is not None and cmd != "ping":
                    self._seq += 1
                    req["seq"] = self._seq
                    req["mac"] = hs.request_mac(self._key, self._seq, req)
                resp = self._exchange(req)
                break
            except OSError as exc:
                self.close()
                if attempt:
                    raise transport_error(exc, f"switch control {self.addr[0]}:{self.addr[1]} ({cmd})",
                                          timeout_s=self.timeout) from exc
        if not resp.get("ok"):
            if resp.get("refused") == "secret":
                how = "no secret was given" if self._secret is None else "the secret given is not the switch's"
                raise AuthenticationError(
                    f"switch control {self.addr[0]}:{self.addr[1]} refused {cmd}: {how} (set "
                    f"HOMAGG_SWITCH_SECRET or HOMAGG_SWITCH_SECRET_FILE, or pass secret=)")
            raise ConfigError(f"switch refused {cmd}: {resp.get('error')}")
        return resp

    def _exchange(self, req: dict[str, Any]) -> dict[str, Any]:
        assert self._sock is not None
        self._sock.sendall(json.dumps(req).encode() + b"\n")
        line = self._rfile.readline()
        if not line:
            raise ConnectionError("control connection closed")
        resp: dict[str, Any] = json.loads(line)
        return resp

    def _handshake(self) -> None:
        """Challenge and response on this connection (:mod:`._handshake`); sets the session key.
        A refused proof is left to the next request's refusal (AuthenticationError there)."""
        assert self._secret is not None
        ch = self._exchange({"cmd": "challenge"})
        ns, nc = ch.get("nonce"), hs.new_nonce()
        if not ch.get("ok") or not isinstance(ns, str):
            raise ConfigError(f"switch control {self.addr[0]}:{self.addr[1]} offers no challenge "
                              f"(an older homagg switch?): {ch.get('error')}")
        r = self._exchange({"cmd": "auth", "nonce": nc, "mac": hs.proof(self._secret, "client", ns, nc)})
        if not r.get("ok"):
            return  # wrong secret: the request that follows is refused and says so
        if not hs.check(hs.proof(self._secret, "server", ns, nc), r.get("mac")):
            raise AuthenticationError(f"switch control {self.addr[0]}:{self.addr[1]} did not prove that it "
                                      "knows the secret (another service on that port?)")
        self._key, self._seq = hs.session_key(self._secret, ns, nc), 0

    def ping(self) -> dict[str, Any]:
        return self.request("ping")

    def admit(
        self,
        world_size: int,
        *,
        job_id: int | None = None,
        slot_base: int | None = None,
        n_slots: int = P4.n_slots,
        words_per_packet: int = P4.words_per_packet,
        workers: list[dict[str, Any]] | None = None,
        idle_timeout_s: float | None = None,
        token: int | None = None,
        parent: tuple[str, int] | None = None,
        child_id: int = 0,
    ) -> JobSpec:
        """Admit a job; ``job_id``/``slot_base``/``token`` None let the switch choose (a random
        token).  Returns the admitted spec, with the token its workers must put in their packets.
        Trees (docs/trees.md): ``parent`` (the parent switch's data address) and ``child_id`` (this
        switch's worker id there) make this switch a child for the job."""
        job = {"job_id": job_id, "world_size": world_size, "slot_base": slot_base, "n_slots": n_slots,
               "words_per_packet": words_per_packet, "workers": workers or [], "idle_timeout_s": idle_timeout_s,
               "token": token, "parent": None if parent is None else format_addr(parent), "child_id": child_id}
        return JobSpec.from_dict(self.request("admit", job=job)["job"])

    def register(self, job_id: int, worker_id: int, addr: tuple[str, int]) -> JobSpec:
        r = self.request("register", job_id=job_id, worker_id=worker_id, ip=addr[0], port=addr[1])
        return JobSpec.from_dict(r["job"])

    def group(self, job_id: int) -> tuple[str, int] | None:
        """The job's result multicast group, or None where the switch offers none."""
        g = self.request("group", job_id=job_id)["group"]
        return None if g is None else (str(g[0]), int(g[1]))

    def probe_group(self, job_id: int, nonce: str) -> None:
        """Ask the switch to send ``PROBE_PREFIX + nonce`` to the job's group (delivery check)."""
        self.request("probe", job_id=job_id, nonce=nonce)

    def subscribe(self, job_id: int, worker_id: int, on: bool = True) -> list[int]:
        """Tell the switch that ``worker_id`` receives results through the group (or no longer)."""
        return list(self.request("subscribe", job_id=job_id, worker_id=worker_id, on=on)["subscribed"])

    def remove(self, job_id: int) -> bool:
        return bool(self.request("remove", job_id=job_id)["removed"])

    def status(self) -> dict[str, Any]:
        return self.request("status")

    def slot_status(self, job_id: int, slot: int) -> dict[str, Any]:
        return self.request("slot", job_id=job_id, slot=slot)

    def set_faults(self, drop: float = 0.0, duplicate: float = 0.0, reorder: float = 0.0,
                   seed: int | None = None, mute: Sequence[int] = ()) -> dict[str, Any]:
        """Set the emulator's fault injection (:class:`switch_emulator.FaultConfig`): rates per
        datagram, and ``mute``: worker ids that get no result at all."""
        return self.request("faults", drop=drop, duplicate=duplicate, reorder=reorder, seed=seed,
                            mute=list(mute))["faults"]

    def reset_counters(self) -> None:
        self.request("reset_counters")

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._rfile.close()
                self._sock.close()
            finally:
                self._sock = None
                self._rfile = None
                self._key = None

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
