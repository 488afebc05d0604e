"""homagg: in-network, lossless, homomorphic gradient aggregation.

Public API::

    homagg.allreduce(tensor, port, scheme="auto", stats=None, **options)   # one worker's SUM
    homagg.History()                                                      # what earlier calls agreed
    homagg.testing.local_allreduce(tensors, scheme="auto", **options)      # W workers in-process
    homagg.CombineOp, homagg.Stream, homagg.SwitchPort, homagg.InProcessSwitch  # switch contract
    homagg.CodecConfig, homagg.WorkerStats, homagg.SCHEMES
    homagg.HomAggError and its subclasses (see homagg._errors)

Imports are lazy: ``import homagg`` loads only the exception tree and the codec options (no
torch), so ``homagg --help`` and the switch emulator (which uses :mod:`homagg.wire` and
:mod:`homagg.jobs`) start fast.  The names above load their modules on first access.

Importing homagg registers the ``homagg`` torch.distributed backend when torch is already
imported; otherwise torch's ``torch.backends`` entry point registers it when torch is imported
(so unmodified scripts work), or call :func:`homagg.torch.register`.
"""

from __future__ import annotations

import sys

from .codec._config import SCHEMES, CodecConfig
from ._errors import (
    AuthenticationError,
    ConfigError,
    GroupCreationError,
    PathWarning,
    HomAggError,
    InputError,
    IntegerOverflowError,
    NonFiniteError,
    ProtocolError,
    RankMismatchError,
    RankTimeoutError,
    SwitchTimeoutError,
    TransportError,
    WireFormatError,
)

from ._lazy import lazy_attributes

__version__ = "0.1.0"

#: public name -> module that defines it (imported on first access)
_LAZY = {
    "allreduce": ".codec._protocol",
    "History": ".codec._history",
    "WorkerStats": ".codec._stats",
    "CombineOp": ".wire",
    "Stream": ".transport",
    "SwitchPort": ".transport",
    "InProcessSwitch": ".transport",
}

__all__ = [
    "allreduce",
    "History",
    "CodecConfig",
    "SCHEMES",
    "WorkerStats",
    "CombineOp",
    "Stream",
    "SwitchPort",
    "InProcessSwitch",
    "HomAggError",
    "ConfigError",
    "AuthenticationError",
    "InputError",
    "NonFiniteError",
    "IntegerOverflowError",
    "ProtocolError",
    "RankMismatchError",
    "WireFormatError",
    "TransportError",
    "SwitchTimeoutError",
    "RankTimeoutError",
    "GroupCreationError",
    "PathWarning",
]


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY, __all__)


if "torch" in sys.modules:  # cheap then: registers "homagg" with torch.distributed
    from .torch import _backend as _torch_backend

    _torch_backend.register()
