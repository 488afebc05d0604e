"""Frames sized to the link: a homagg datagram of ``words_for_mtu(mtu)`` words fills one IPv4
packet of ``mtu`` bytes, and the embedded emulator's default job shape follows the MTU of the
link it is bound on (read from the interface itself)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from homagg.torch._udp_link import embedded_packet_shape
from homagg.transport._sockets import link_mtu
from homagg.wire import MAX_WORDS_JUMBO, datagram_len, words_for_mtu

IP_UDP = 28


def test_words_for_the_common_mtus() -> None:
    """Ethernet's 1500 and jumbo 9000 (the fill-one-packet property for any MTU:
    tests/test_bench_net.py); loopback's 65536 takes the emulator's most words."""
    assert (words_for_mtu(1500), words_for_mtu(9000), words_for_mtu(65536)) == (363, 2238, MAX_WORDS_JUMBO)
    assert IP_UDP + datagram_len(363) == 1500


def test_loopback_link_mtu_is_the_interface_mtu() -> None:
    lo = Path("/sys/class/net/lo/mtu")
    if not lo.exists():
        pytest.skip("no /sys/class/net/lo (not Linux)")
    assert link_mtu("127.0.0.1") == int(lo.read_text())
    assert link_mtu("not an address") is None


def test_embedded_shape_keeps_the_bytes_in_flight() -> None:
    words, slots = embedded_packet_shape("127.0.0.1", None, None)
    assert words == words_for_mtu(link_mtu("127.0.0.1"))
    assert slots * words >= 16 * 16000 or slots == 1024
    assert embedded_packet_shape("127.0.0.1", 100, 7) == (100, 7)  # what the user set wins
    assert embedded_packet_shape("127.0.0.1", 363, None) == (363, 706)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 (a namespace)")
def test_link_mtu_of_an_interface_in_a_namespace() -> None:
    """A veth pair with MTU 1500 in a namespace of the test's own: the emulator bound to its
    address gets 363-word datagrams, one 1500-byte frame each."""
    ns = f"hgmtu{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (["link", "add", "d0", "mtu", "1500", "type", "veth", "peer", "name", "d1", "mtu", "1500"],
                    ["addr", "add", "10.213.7.1/24", "dev", "d0"], ["link", "set", "d0", "up"], ["link", "set", "d1", "up"]):
            subprocess.run(["ip", "-n", ns, *cmd], check=True)
        code = ("from homagg.torch._udp_link import embedded_packet_shape as s; "
                "from homagg.transport._sockets import link_mtu as m; print(m('10.213.7.1'), *s('10.213.7.1', None, None))")
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], check=True, capture_output=True,
                             text=True, timeout=120).stdout.split()
        assert out == ["1500", "363", "706"]
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
