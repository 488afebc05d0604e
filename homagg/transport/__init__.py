"""Transports implementing the switch contract (:class:`homagg._switch.SwitchPort`) over a network.

* :class:`UdpSwitchPort` — one worker's UDP port to the emulator or a BMv2 switch,
* :class:`ControlClient` — admit/register/remove jobs, read counters (JSON lines over TCP),
* :func:`parse_addr` — ``"HOST:PORT"`` -> tuple.

An embedded emulator for tests and single-host runs: :func:`switch_emulator.start` (thread) and
:func:`switch_emulator.spawn` (subprocess).
"""

from .control import ControlClient, parse_addr
from .udp import UdpSwitchPort

__all__ = ["UdpSwitchPort", "ControlClient", "parse_addr"]
