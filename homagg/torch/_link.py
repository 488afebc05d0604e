"""What a homagg process group aggregates through: its switch port and how to release it.

Kept apart from :mod:`._switch_setup` (which chooses and opens the link) and :mod:`._udp_link`
(the UDP kinds), so that both import it and neither imports the other at module level.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass, field

from ..transport import SwitchPort

__all__ = ["SwitchLink", "port_closer", "await_ports_closed", "close_quietly"]


@dataclass
class SwitchLink:
    """What a group aggregates through.  ``address``/``job_id`` are ``None`` for ``gloo`` and
    ``host`` (the host path a group takes while its switch has failed: :mod:`._fallback`)."""

    port: SwitchPort
    kind: str
    address: tuple[str, int] | None = None
    job_id: int | None = None
    control: tuple[str, int] | None = None  # the switch's control address (udp kinds)
    emulator: object | None = None  # the embedded emulator, on the rank that owns it (a tree: this rank's leaf)
    #: an embedded tree's emulators, root first (the plan's order), on the rank that started them
    emulators: tuple[object, ...] = ()
    _closers: list[Callable[[], None]] = field(default_factory=list)
    _close_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def close(self) -> None:
        """Close the port, then stop an owned emulator; re-raise the first failure after all ran.

        Idempotent and safe from several threads at once: each closer runs once (a shared
        emulator's reference count drops once), and a second caller returns only when the first
        has finished, so whoever sees ``close`` return knows the link is released."""
        with self._close_lock:
            closers, self._closers = self._closers, []
            first: BaseException | None = None
            for close in reversed(closers):
                try:
                    close()
                except Exception as exc:  # noqa: BLE001 - re-raised below once every closer ran
                    first = first or exc
        if first is not None:
            raise first


def port_closer(port: SwitchPort, store: Any, key: str) -> Callable[[], None]:
    """A closer that closes this rank's ``port``, then counts the rank out under ``key/closed`` in
    the group's store (for :func:`await_ports_closed` on rank 0; a store already gone is ignored:
    nothing waits for the count then)."""

    def close() -> None:
        port.close()
        try:
            store.add(f"{key}/closed", 1)
        except RuntimeError:
            pass

    return close


def await_ports_closed(store: Any, key: str, size: int, bound_s: float) -> None:
    """Rank 0, before it removes the job: wait until ``size`` ranks counted their ports closed
    under ``key`` (:func:`port_closer`), at most ``bound_s`` (an unreachable store ends the wait:
    the bound is what matters), so no rank loses the switch while its last results are in flight."""
    deadline = time.monotonic() + bound_s
    try:
        while store.add(f"{key}/closed", 0) < size and time.monotonic() < deadline:
            time.sleep(0.02)
    except RuntimeError:
        pass


def close_quietly(link: SwitchLink) -> threading.Thread:
    """Close a link whose switch failed, off the caller's thread (removing its job from an unreachable
    switch may wait for a connect timeout; its errors are dropped); the thread (the fallback's
    :meth:`~homagg.torch._fallback.PathPort.close` joins it)."""

    def run() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                link.close()
            except Exception:  # noqa: BLE001 - the switch is gone: nothing left to release
                pass

    thread = threading.Thread(target=run, name="homagg-close-failed-link", daemon=True)
    thread.start()
    return thread
