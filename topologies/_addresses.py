"""Names and addresses shared by every topology (and by the BMv2 switch configuration).

Invariants: ``worker_mac(r)`` is distinct for every rank ``r < 2**16`` and never the service MAC;
Mininet node names start with :data:`PREFIX` (the runner's teardown removes leftover ``hg*`` links).
"""

from __future__ import annotations

__all__ = ["SERVICE_IP", "SERVICE_MAC", "PREFIX", "worker_mac"]

#: the switch's service address where workers share one subnet (BMv2, raw emulator ports)
SERVICE_IP = "10.0.0.254"
SERVICE_MAC = "02:48:41:00:00:fe"
PREFIX = "hg"


def worker_mac(rank: int) -> str:
    """The MAC address of rank ``rank``'s host."""
    return f"02:48:41:00:{rank >> 8:02x}:{(rank & 0xFF) + 1:02x}"
