"""Switch ports: the switch contract and every transport that implements it, in one package.

The contract (module ``_base``): :class:`Stream`, :class:`SwitchPort` (the one base class of every
port), the reference combine :func:`combine_words` / :func:`wrap_int32`, and
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
"""

from ..wire import CombineOp
from ._base import Stream, SwitchPort, combine_words, wrap_int32
from ._control import ControlClient, parse_addr
from ._errmap import transport_error
from ._gloo import GlooSwitchPort
from ._inprocess import InProcessSwitch
from ._udp import UdpSwitchPort

__all__ = [
    "CombineOp",
    "Stream",
    "SwitchPort",
    "combine_words",
    "wrap_int32",
    "InProcessSwitch",
    "UdpSwitchPort",
    "GlooSwitchPort",
    "ControlClient",
    "parse_addr",
    "transport_error",
]
