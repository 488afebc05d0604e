"""Names and addresses shared by every topology (and by the BMv2 switch configuration).

Invariants: ``worker_mac(r)`` is distinct for every rank ``r < 2**16`` and never the service MAC;
Mininet node names start with :data:`PREFIX` (the runner's teardown removes leftover ``hg*`` links).
"""

from __future__ import annotations

__all__ = ["SERVICE_IP", "SERVICE_MAC", "PREFIX", "worker_mac", "leaf_service"]

#: the switch's service address where workers share one subnet (BMv2, raw emulator ports)
SERVICE_IP = "10.0.0.254"
SERVICE_MAC = "02:48:41:00:00:fe"
PREFIX = "hg"


def worker_mac(rank: int) -> str:
    """The MAC address of rank ``rank``'s host."""
    return f"02:48:41:00:{rank >> 8:02x}:{(rank & 0xFF) + 1:02x}"


def leaf_service(leaf: int) -> tuple[str, str]:
    """``(IPv4, MAC)`` of leaf ``leaf``'s service address when the leaves aggregate (a tree, two_tier
    ``tree``): in the workers' subnet, below the spine's :data:`SERVICE_IP` (``10.0.0.253`` down)."""
    if not 0 <= leaf < 64:
        raise ValueError(f"leaf {leaf} outside 0..63")
    return f"10.0.0.{253 - leaf}", f"02:48:41:00:01:{leaf:02x}"
