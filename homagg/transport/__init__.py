"""Switch ports: the switch contract and every transport that implements it, in one package.

The contract (module ``_base``): :class:`Stream`, :class:`SwitchPort` (the one base class of every
port; ``combine`` of Streams, ``combine_arrays`` of host int32 arrays: the small-call path, with
:func:`array_streams` its Stream equivalent and :func:`array_lengths` its check), the reference
combine :func:`combine_words` / :func:`wrap_int32`, and
:class:`~homagg.wire.CombineOp` (defined in :mod:`homagg.wire`, the wire encoding).

Ports, three siblings to copy for a new transport (RDMA, a real switch, ...):

* :class:`InProcessSwitch` (``_inprocess``) -- threads of one process; the reference,
* :class:`UdpSwitchPort` (``_udp``) -- one worker's UDP port to the emulator or a BMv2 switch,
* :class:`GlooSwitchPort` (``_gloo``) -- the switch emulated over a private gloo group.

Around them: :class:`ControlClient` (``_control``: admit/register/remove jobs, read counters;
JSON lines over TCP), :func:`parse_addr` (``"HOST:PORT"`` -> tuple) and
:func:`transport_error` (``_errmap``: the one mapping of transport failures to the
:class:`~homagg.HomAggError` tree).  An emulator for tests and single-host runs:
:func:`switch_emulator.start` (thread) and :func:`switch_emulator.spawn` (subprocess).

Names load their module on first access (``from homagg.transport import ControlClient`` does not
import torch; the emulator relies on that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if TYPE_CHECKING:
    from ..wire import CombineOp
    from ._base import (AgreementCheck, CheckOnce, OwnRound, Stream, SwitchPort, VerifyOnce, WordSource, array_lengths, array_streams, combine_words,
                        wrap_int32)
    from ._control import ControlClient, parse_addr
    from ._errmap import transport_error
    from ._gloo import GlooSwitchPort
    from ._inprocess import InProcessSwitch
    from ._udp import UdpSwitchPort

#: public name -> module that defines it (relative to this package)
_LAZY = {
    "CombineOp": "..wire",
    "Stream": "._base",
    "SwitchPort": "._base",
    "VerifyOnce": "._base",
    "AgreementCheck": "._base",
    "CheckOnce": "._base",
    "OwnRound": "._base",
    "WordSource": "._base",
    "array_lengths": "._base",
    "array_streams": "._base",
    "combine_words": "._base",
    "wrap_int32": "._base",
    "InProcessSwitch": "._inprocess",
    "UdpSwitchPort": "._udp",
    "GlooSwitchPort": "._gloo",
    "ControlClient": "._control",
    "parse_addr": "._control",
    "transport_error": "._errmap",
}

__all__ = [
    "CombineOp",
    "Stream",
    "WordSource",
    "SwitchPort",
    "VerifyOnce",
    "AgreementCheck",
    "CheckOnce",
    "OwnRound",
    "array_lengths",
    "array_streams",
    "combine_words",
    "wrap_int32",
    "InProcessSwitch",
    "UdpSwitchPort",
    "GlooSwitchPort",
    "ControlClient",
    "parse_addr",
    "transport_error",
]


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY, __all__)
