"""homagg as a ``torch.distributed`` backend, and as a DDP comm hook.

After ``import homagg`` (or, through the ``torch.backends`` entry point, after ``import torch``)::

    dist.init_process_group("homagg")          # float SUM/AVG and int SUM through the switch

Options: environment variables ``HOMAGG_SWITCH``, ``HOMAGG_SCHEME``, ``HOMAGG_TIMEOUT``,
``HOMAGG_EMULATOR_HOST`` or a ``pg_options`` dict (see :mod:`homagg.torch._config`).
For users who keep another backend: :mod:`homagg.torch.hooks` (``State``, ``allreduce_hook``).

Importing this package is cheap and never imports the codec; :class:`ProcessGroupHomagg` and
:mod:`hooks` are loaded on first use.
"""

from __future__ import annotations

from typing import Any

from ._backend import BACKEND_NAME, is_registered, register
from ._config import BackendConfig

register()  # importing homagg (or homagg.torch) makes init_process_group("homagg") work

__all__ = ["BACKEND_NAME", "register", "is_registered", "BackendConfig", "ProcessGroupHomagg", "hooks"]


def __getattr__(name: str) -> Any:
    if name == "ProcessGroupHomagg":
        from ._process_group import ProcessGroupHomagg

        return ProcessGroupHomagg
    if name == "hooks":
        import importlib

        return importlib.import_module(f"{__name__}.hooks")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
