"""Connect a homagg process group to its switch: embedded emulator, external switch, or gloo.

* ``embedded`` (default): group rank 0 starts (or shares) a Python switch emulator (bound
  to ``emulator_host``, else the rendezvous host when it is an address of this machine, else
  127.0.0.1), admits a job for the group, and publishes ``host:port`` and the job in the group's
  store; every rank then opens a UDP port to it.  Each process group gets its own job.
* ``host:port``: an external emulator or BMv2 switch; group rank 0 admits the job through the
  switch's control client and publishes it the same way.
* ``gloo``: :class:`~homagg.transport.GlooSwitchPort` over the worker's private gloo group.

Invariants: every rank of the group agrees on the switch, scheme and codec options (rank 0
publishes its options, the others compare and raise :class:`~homagg.ConfigError` on mismatch);
every store wait is bounded by the group timeout; :meth:`SwitchLink.close` releases the port and
stops an owned emulator, and is idempotent.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import torch.distributed as dist

from .._errors import ConfigError, HomAggError
from ..transport import GlooSwitchPort, transport_error
from ._config import BackendConfig
from ._link import SwitchLink

__all__ = ["SwitchLink", "open_switch"]

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
        {"switch": config.switch, "scheme": config.scheme, "codec": dict(config.codec)}, sort_keys=True, default=repr
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
    from . import _udp_link  # imports the transport and the emulator only when they are used

    try:
        return _udp_link.open_udp(config, store, rank, size, group_id, group_timeout_s, _store_get, _SWITCH_KEY)
    except HomAggError:
        raise
    except OSError as exc:
        raise ConfigError(f"homagg: cannot reach or start the switch ({config.switch}): {exc}") from exc
