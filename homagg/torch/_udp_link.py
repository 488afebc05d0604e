"""UDP link of a homagg process group: the embedded emulator or an external switch.

Group rank 0 admits one job per process group (its own slots, so several groups run at once;
the embedded emulator is shared by the groups whose rank 0 lives in this process)
and publishes ``{"data", "control", "job"}`` under the group's store; every rank opens a
:class:`~homagg.transport.UdpSwitchPort` (which registers its source address with the switch).
On close each rank releases its port and counts itself out in the store; rank 0 waits (bounded)
for the others before it removes the job and stops an owned emulator, so no rank loses the
switch while its last results (or retransmissions) are in flight.

Security: the embedded emulator gets a fresh control secret (through its environment, never its
command line); rank 0 publishes it with the job in the group's store, so only the group's ranks can
admit, register or remove jobs on it.  With an external switch each rank finds the secret itself
(``HOMAGG_SWITCH_SECRET`` / ``HOMAGG_SWITCH_SECRET_FILE``).  The job's data-plane token comes with
the job.  The embedded emulator refuses fault injection unless ``HOMAGG_EMULATOR_FAULTS=1`` was set
when the group was created (tests that inject faults set it).

Crash: if the embedded emulator dies, the ports' waits end with :class:`~homagg.SwitchTimeoutError`
within the group timeout, and the next process group starts a new emulator (a dead one is never
handed out again).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from .._errors import ConfigError, TransportError
from ._config import BackendConfig
from ._link import SwitchLink, await_ports_closed, port_closer

__all__ = ["open_udp", "emulator_host", "embedded_packet_shape"]

_CLOSE_WAIT_S = 10.0
_START_TIMEOUT_S = 60.0
_emulators: dict[str, list[Any]] = {}  # host -> [RunningSwitch, users]; one emulator per process
_emulators_lock = threading.Lock()


def embedded_packet_shape(host: str, words: int | None, slots: int | None) -> tuple[int, int]:
    """(words per packet, slots) of a job on an embedded emulator bound to ``host``: by default
    datagrams fill one frame of the link that reaches it (:func:`~homagg.transport._sockets.link_mtu`:
    16000 words on loopback, 2238 at MTU 9000, 363 at 1500: never an IP fragment), and the slot
    window keeps as many bytes in flight as 16 slots of 16000 words do (up to 1024 slots)."""
    from ..jobs import EMULATOR
    from ..transport._sockets import link_mtu
    from ..wire import words_for_mtu

    if words is None:
        mtu = link_mtu(host)
        words = EMULATOR.words_per_packet if mtu is None else words_for_mtu(mtu)
    if slots is None:
        full = EMULATOR.n_slots * EMULATOR.words_per_packet
        slots = min(1024, max(EMULATOR.n_slots, -(-full // words)))
    return words, slots


def _acquire_emulator(host: str) -> Any:
    """The process's embedded emulator on ``host`` (started on first use, reference counted;
    replaced when the previous one died)."""
    import switch_emulator

    with _emulators_lock:
        entry = _emulators.get(host)
        if entry is not None and entry[0].process is not None and entry[0].process.poll() is not None:
            entry[0].stop()  # crashed or killed: reaped, its pipes closed; its users get errors
            entry = None  # new groups get a new emulator
        if entry is None:
            try:
                # its own process (own GIL), stopped with the last group; gone if this process dies
                emulator = switch_emulator.spawn(
                    listen=(host, 0), control=(host, 0), timeout=_START_TIMEOUT_S,
                    allow_faults=os.environ.get("HOMAGG_EMULATOR_FAULTS", "0") == "1",
                    log_level=os.environ.get("HOMAGG_EMULATOR_LOG_LEVEL", "warning"))
                entry = _emulators[host] = [emulator, 0]
            except (OSError, TransportError) as exc:
                raise ConfigError(f"homagg: cannot start the embedded emulator on {host}: {exc}") from exc
        entry[1] += 1
        return entry[0]


def _release_emulator(host: str, emulator: Any) -> None:
    """Drop one user of ``emulator``; the last one stops it (bounded).  A replaced (dead) one is
    only reaped."""
    with _emulators_lock:
        entry = _emulators.get(host)
        if entry is None or entry[0] is not emulator:
            pass  # already replaced after it died: nothing shared to count down
        else:
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _emulators[host]
    emulator.stop()


def _rendezvous_host(store: Any) -> str | None:
    host = os.environ.get("MASTER_ADDR")
    if host:
        return host
    while store is not None:
        if isinstance(store, dist.TCPStore):
            return store.host
        store = getattr(store, "underlying_store", None)
    return None


def emulator_host(config: BackendConfig, store: Any) -> str:
    """Address the embedded emulator binds to: configured, else the rendezvous host if local."""
    if config.emulator_host:
        return config.emulator_host
    host = _rendezvous_host(store)
    if not host:
        return "127.0.0.1"
    try:
        ip = socket.gethostbyname(host)
        if ipaddress.ip_address(ip).is_loopback:
            return ip
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind((ip, 0))  # is it an address of this machine?
        return ip
    except OSError:
        return "127.0.0.1"


def open_udp(
    config: BackendConfig,
    store: dist.Store,
    rank: int,
    size: int,
    group_id: str,
    group_timeout_s: float,
    store_get: Callable[[dist.Store, str, float, str], bytes],
    key: str,
) -> SwitchLink:
    from ..jobs import P4, JobSpec
    from ..transport import ControlClient, UdpSwitchPort

    emulator = None
    host = ""
    if rank == 0:
        # everything rank 0 does before publishing may fail (the emulator does not start, the
        # switch refuses the job): the others then learn it from the store at once
        try:
            if config.switch == "embedded":
                host = emulator_host(config, store)
                emulator = _acquire_emulator(host)
                data_addr, ctl_addr = tuple(emulator.data_addr), tuple(emulator.control_addr)
                words, slots = embedded_packet_shape(data_addr[0], config.words_per_packet, config.slots)
            else:
                data_addr, ctl_addr = config.external_address, config.control_address  # type: ignore[assignment]
                words = config.words_per_packet or P4.words_per_packet
                slots = config.slots or P4.n_slots
            secret = emulator.secret if emulator is not None else None
            with ControlClient(ctl_addr, timeout=min(config.timeout, 10.0), secret=secret) as ctl:
                job = ctl.admit(size, n_slots=slots, words_per_packet=words)
        except BaseException as exc:
            if emulator is not None:
                _release_emulator(host, emulator)
            # the other ranks learn it at once instead of waiting for the group timeout
            try:
                store.set(key, json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}))
            except RuntimeError:
                pass  # the store is gone: the others' waits end at their bound
            raise
        store.set(key, json.dumps({"data": list(data_addr), "control": list(ctl_addr), "job": job.to_dict(),
                                   "secret": secret}))
    info = json.loads(store_get(store, key, group_timeout_s, "the switch address").decode())
    if "error" in info:
        raise TransportError("homagg: group rank 0 could not open the switch (start the embedded emulator, admit "
                             f"the job): {info['error']}")
    job = JobSpec.from_dict(info["job"])
    data_addr, ctl_addr = tuple(info["data"]), tuple(info["control"])
    secret = info.get("secret")
    try:
        port = UdpSwitchPort(data_addr, rank=rank, job=job, control=ctl_addr, timeout=config.timeout, secret=secret)
    except BaseException:
        if emulator is not None:
            _release_emulator(host, emulator)
        raise
    kind = "embedded" if config.switch == "embedded" else "external"
    link = SwitchLink(port, kind, data_addr, job.job_id, ctl_addr, emulator)

    def release_job() -> None:
        await_ports_closed(store, key, size, min(_CLOSE_WAIT_S, config.timeout))
        try:
            with ControlClient(ctl_addr, timeout=min(config.timeout, 5.0), secret=secret) as ctl:
                ctl.remove(job.job_id)
        except (TransportError, OSError) as exc:  # switch gone: no job left to remove
            warnings.warn(f"homagg: could not remove job {job.job_id} from {ctl_addr}: {exc}", stacklevel=2)
        finally:
            if emulator is not None:
                _release_emulator(host, emulator)

    if rank == 0:
        link._closers.append(release_job)
    link._closers.append(port_closer(port, store, key))  # closers run in reverse: port first, then the job
    return link
