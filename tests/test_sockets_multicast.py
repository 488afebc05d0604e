"""Who may send results to multicast groups: loopback by default, any bound IPv4 address when asked.

The real non-loopback path (a bridge in the switch namespace) is exercised end to end by
``tests/test_bench_multicast.py`` (root); here only what needs no root.
"""

from __future__ import annotations

import argparse
import socket

import pytest

from homagg import ConfigError
from homagg.transport._sockets import enable_multicast_send
from switch_emulator._cli import configure_parser
from switch_emulator.io_udp import UdpBackend


def _bound(ip: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 0))
    return s


@pytest.mark.parametrize("allow_any", [False, True])
def test_loopback_is_always_allowed(allow_any: bool) -> None:
    with _bound("127.0.0.1") as s:
        assert enable_multicast_send(s, "127.0.0.1", allow_any=allow_any)
        assert socket.inet_ntoa(s.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, 4)) == "127.0.0.1"
        assert s.getsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL) == 1


def test_the_wildcard_never_is() -> None:
    """``IP_MULTICAST_IF`` needs one interface: an unbound / wildcard socket gets no groups."""
    with _bound("0.0.0.0") as s:
        assert not enable_multicast_send(s, "0.0.0.0")
        assert not enable_multicast_send(s, "0.0.0.0", allow_any=True)
    with pytest.raises(ConfigError, match="multicast"):
        UdpBackend(("0.0.0.0", 0), multicast_any_address=True)
    backend = UdpBackend(("0.0.0.0", 0))  # the default just falls back to unicast
    try:
        assert backend.multicast is False
    finally:
        backend.close()


def test_a_non_loopback_address_only_when_asked() -> None:
    """Decided by the address alone (no setsockopt is reached without ``allow_any``)."""
    with _bound("127.0.0.1") as s:
        assert not enable_multicast_send(s, "10.77.255.1")
        assert not enable_multicast_send(s, "239.255.0.1", allow_any=True)  # a group is no source


def test_cli_multicast_flags() -> None:
    p = argparse.ArgumentParser()
    configure_parser(p)
    args = p.parse_args([])
    assert not args.multicast and not args.no_multicast
    assert p.parse_args(["--multicast"]).multicast
    with pytest.raises(SystemExit):
        p.parse_args(["--multicast", "--no-multicast"])


def test_module_entry_point_reports_a_config_error_without_a_traceback() -> None:
    """``python -m switch_emulator`` prints a refused option as ``homagg switch`` does (status 2)."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "switch_emulator", "--multicast", "--listen", "0.0.0.0:0", "--quiet"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "error: ConfigError" in res.stderr and "Traceback" not in res.stderr
