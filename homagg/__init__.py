"""homagg: in-network, lossless, homomorphic gradient aggregation.

Public API::

    homagg.allreduce(tensor, port, scheme="auto", stats=None, **options)   # one worker's SUM
    homagg.testing.local_allreduce(tensors, scheme="auto", **options)      # W workers in-process
    homagg.CombineOp, homagg.Stream, homagg.SwitchPort, homagg.InProcessSwitch  # switch contract
    homagg.CodecConfig, homagg.WorkerStats, homagg.SCHEMES
    homagg.HomAggError and its subclasses (see homagg._errors)

Importing homagg registers the ``homagg`` torch.distributed backend (the ``torch.backends`` entry
point does it too, so unmodified scripts work).
"""

from __future__ import annotations

from ._config import SCHEMES, CodecConfig
from ._errors import (
    ConfigError,
    HomAggError,
    InputError,
    IntegerOverflowError,
    NonFiniteError,
    ProtocolError,
    SwitchTimeoutError,
    TransportError,
    WireFormatError,
)
from ._protocol import allreduce
from ._stats import WorkerStats
from ._switch import CombineOp, InProcessSwitch, Stream, SwitchPort
from . import torch as _torch_backend  # noqa: F401,E402  registers the "homagg" torch.distributed backend

__version__ = "0.1.0"

__all__ = [
    "allreduce",
    "CodecConfig",
    "SCHEMES",
    "WorkerStats",
    "CombineOp",
    "Stream",
    "SwitchPort",
    "InProcessSwitch",
    "HomAggError",
    "ConfigError",
    "InputError",
    "NonFiniteError",
    "IntegerOverflowError",
    "ProtocolError",
    "WireFormatError",
    "TransportError",
    "SwitchTimeoutError",
]
