"""Connect a homagg process group to its switch: embedded emulator, external switch, or gloo.

* ``embedded`` (default): group rank 0 starts (or shares) a Python switch emulator (bound
  to ``emulator_host``, else the rendezvous host when it is an address of this machine, else
  127.0.0.1), admits a job for the group, and publishes ``host:port`` and the job in the group's
  store; every rank then opens a UDP port to it.  Each process group gets its own job.
* ``host:port``: an external emulator or BMv2 switch; group rank 0 admits the job through the
  switch's control client and publishes it the same way.
* ``gloo``: :class:`~homagg.transport.GlooSwitchPort` over the worker's private gloo group.

Also the group's store barrier (:func:`await_ranks`), used when a group is created (it returns
only once every rank registered with the switch) and by ``monitored_barrier``.

Invariants: every rank of the group agrees on the switch, scheme and codec options (rank 0
publishes its options, the others compare and raise :class:`~homagg.ConfigError` on mismatch);
every store wait is bounded by the group timeout and a timeout names the ranks that are missing;
:meth:`SwitchLink.close` releases the port and stops an owned emulator, and is idempotent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from .._errors import ConfigError, HomAggError, RankTimeoutError, TransportError
from ..transport import GlooSwitchPort, transport_error
from ._config import BackendConfig
from ..wire import MAX_WORKERS
from ._link import SwitchLink

__all__ = ["SwitchLink", "open_switch", "reopen_switch", "probe_switch", "await_ranks", "report_failure",
           "absent_ranks"]

_CONFIG_KEY = "homagg/config"
_SWITCH_KEY = "homagg/switch"


def _store_get(store: dist.Store, key: str, timeout_s: float, what: str) -> bytes:
    t0 = time.monotonic()
    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # torch's DistStoreError (a RuntimeError) on timeout
        raise transport_error(exc, f"homagg: {what} not published by group rank 0", timeout_s=timeout_s,
                              waited_s=time.monotonic() - t0) from exc
    return store.get(key)


def _agree_on_config(config: BackendConfig, store: dist.Store, rank: int, timeout_s: float) -> None:
    mine = json.dumps(
        {"switch": config.switch, "scheme": config.scheme, "codec": dict(config.codec), "compress": config.compress,
         "fallback": config.fallback, "probe_interval": config.probe_interval,
         "return_attempts": config.return_attempts},
        sort_keys=True, default=repr
    )
    if rank == 0:
        store.set(_CONFIG_KEY, mine)
        return
    theirs = _store_get(store, _CONFIG_KEY, timeout_s, "options").decode()
    if theirs != mine:
        raise ConfigError(f"homagg options differ across ranks: rank 0 has {theirs}, rank {rank} has {mine}")


def open_switch(
    config: BackendConfig,
    store: dist.Store,
    rank: int,
    size: int,
    private_gloo: dist.ProcessGroup,
    group_id: str,
    group_timeout_s: float,
) -> SwitchLink:
    """Open this rank's switch port for the group (see the module docstring for the modes)."""
    _agree_on_config(config, store, rank, group_timeout_s)
    if config.switch == "gloo":
        port = GlooSwitchPort(private_gloo, rank, size, timeout_s=group_timeout_s)
        return SwitchLink(port, "gloo", _closers=[port.close])
    try:
        return _open_udp(config, store, rank, size, group_id, group_timeout_s, _SWITCH_KEY)
    except HomAggError:
        raise
    except OSError as exc:
        raise ConfigError(f"homagg: cannot reach or start the switch ({config.switch}): {exc}") from exc


def reopen_switch(config: BackendConfig, store: dist.Store, rank: int, size: int, group_id: str,
                  group_timeout_s: float, epoch: int) -> SwitchLink:
    """A new link to the group's switch after it failed (collective, like :func:`open_switch`):
    rank 0 admits a new job (the embedded emulator is started again if it died) and publishes it
    under a key of its own (``epoch``), every rank registers a new port."""
    try:
        return _open_udp(config, store, rank, size, group_id, group_timeout_s, f"{_SWITCH_KEY}/{epoch}")
    except HomAggError:
        raise
    except OSError as exc:
        raise TransportError(f"homagg: cannot reach the switch again ({config.switch}): {exc}") from exc


def _open_udp(config: BackendConfig, store: dist.Store, rank: int, size: int, group_id: str, group_timeout_s: float,
              key: str) -> SwitchLink:
    """One switch (:mod:`._udp_link`), or a tree of switches (:mod:`._tree_link`) for a tree job
    file or an embedded group of more ranks than one switch takes; each imports the transport and
    the emulator only when used."""
    if config.tree_file is not None or (config.switch == "embedded" and size > MAX_WORKERS):
        from ._tree_link import open_tree

        return open_tree(config, store, rank, size, group_timeout_s, _store_get, key)
    from . import _udp_link

    return _udp_link.open_udp(config, store, rank, size, group_id, group_timeout_s, _store_get, key)


def probe_switch(config: BackendConfig, link: SwitchLink, timeout_s: float = 0.5) -> bool:
    """Does the failed switch answer again?  An embedded emulator (or tree) is started anew by
    :func:`reopen_switch` (always worth a try); an external switch must accept a connection on its
    control port (the same test as :class:`~homagg.transport._liveness.Liveness`), every switch of
    a tree job file on theirs."""
    if config.switch == "embedded":
        return True
    from ..transport._liveness import control_silent

    if config.tree_file is not None:  # every switch of the tree must answer
        from .._treefile import load_tree_file

        try:
            switches = load_tree_file(config.tree_file).switches
        except ConfigError:
            return False  # the file went bad meanwhile: nothing to return to
        return all(control_silent(s.control, timeout_s) is None for s in switches)
    control = config.control_address or link.control
    return control is not None and control_silent(control, timeout_s) is None


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def absent_ranks(store: dist.Store, key: str, size: int) -> list[int]:
    """Group ranks that have not arrived at barrier ``key`` (store lookups only, no waiting)."""
    return [r for r in range(size) if not store.check([f"{key}/{r}"])]


def report_failure(store: dist.Store, key: str, rank: int, message: str) -> None:
    """Tell the ranks waiting at barrier ``key`` that this rank failed (best effort: the store may be gone)."""
    try:
        store.set(f"{key}/failed/{rank}", message[:500])
        store.add(f"{key}/failed", 1)
    except RuntimeError:
        pass


def await_ranks(
    store: dist.Store, key: str, rank: int, size: int, timeout_s: float, what: str, *, all_ranks: bool = True
) -> None:
    """Store barrier: arrive at ``key``, then wait until all ``size`` ranks arrived.

    Bounded by ``timeout_s``; on timeout raises :class:`~homagg.RankTimeoutError` whose ``ranks``
    are the ranks that did not arrive (all of them, or with ``all_ranks=False`` the first, as gloo's
    ``monitored_barrier`` reports).  A rank that reported a failure (:func:`report_failure`) ends
    the wait at once with its message.  An unreachable store raises :class:`~homagg.TransportError`.
    Every key is used once: callers number successive barriers.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.002
    try:
        store.set(f"{key}/{rank}", b"1")
        arrived = store.add(key, 1)
        while arrived < size:
            if store.add(f"{key}/failed", 0) > 0:
                failed = [r for r in range(size) if store.check([f"{key}/failed/{r}"])]
                notes = "; ".join(f"rank {r}: {store.get(f'{key}/failed/{r}').decode()}" for r in failed)
                raise RankTimeoutError(f"homagg {what}: {_ranks_text(failed)} failed ({notes})", tuple(failed))
            if time.monotonic() >= deadline:
                missing = absent_ranks(store, key, size)
                if not missing:  # the last ones arrived just now
                    return
                named = missing if all_ranks else missing[:1]
                lead = (f"Rank {rank} timed out in monitoredBarrier after {int(timeout_s * 1000)} ms: "
                        if what == "monitored_barrier" else "")  # gloo's wording, which callers match
                raise RankTimeoutError(
                    f"{lead}homagg {what}: {_ranks_text(named)} did not arrive within {timeout_s:.1f}s "
                    f"(rank {rank} waited; {arrived} of {size} arrived)", tuple(named))
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            arrived = store.add(key, 0)
    except RankTimeoutError:
        raise
    except RuntimeError as exc:  # torch's DistNetworkError/DistStoreError: the store itself is gone
        raise TransportError(f"homagg {what}: the rendezvous store is unreachable from rank {rank} "
                             f"(the process hosting it may have died): {exc}") from exc
