"""Registration of the ``homagg`` backend with ``torch.distributed``.

:func:`register` is idempotent and cheap: it imports only ``torch.distributed`` and this package's
config and work modules, never the codec or the transport, so it is safe to call from the
``torch.backends`` entry point while ``import torch`` is still running.  The process group class
(and with it the codec) is imported when the first group is created.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

__all__ = ["BACKEND_NAME", "register", "is_registered"]

BACKEND_NAME = "homagg"
_lock = threading.Lock()
_atexit_installed = False


def is_registered() -> bool:
    """Whether ``torch.distributed`` knows the ``homagg`` backend in this process."""
    import torch.distributed as dist

    return dist.is_available() and BACKEND_NAME.upper() in dist.Backend._plugins


def register() -> None:
    """Register ``homagg`` (devices cpu and cuda) with ``torch.distributed``; safe to call twice."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    with _lock:
        if is_registered():
            return
        dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=["cpu", "cuda"])


def _create_process_group(dist_opts: Any, pg_options: Any) -> Any:
    """The creator torch calls for ``init_process_group("homagg")`` and ``new_group``."""
    global _atexit_installed
    from ._config import BackendConfig
    from ._process_group import ProcessGroupHomagg, shutdown_all

    config = BackendConfig.resolve(pg_options)
    with _lock:
        if not _atexit_installed:
            atexit.register(shutdown_all)
            _atexit_installed = True
    return ProcessGroupHomagg(
        dist_opts.store,
        dist_opts.group_rank,
        dist_opts.group_size,
        dist_opts.timeout,
        config,
        group_id=str(dist_opts.group_id),
    )
