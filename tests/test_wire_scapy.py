"""The scapy layer on the wire: golden bytes for ``IP() / UDP() / HomAgg(...)`` and dissection of
both directions (requests to the homagg port, results from it).

Oracle: a frame written out by hand from docs/wire-format.md and RFC 791/768 (checksums verified
below with an independent RFC 1071 sum), not scapy's own output.
"""

from __future__ import annotations

import pytest

from homagg import wire

pytest.importorskip("scapy")
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.packet import Raw  # noqa: E402

from homagg.wire_scapy import HomAgg  # noqa: E402

WORKER, SWITCH = "10.0.0.1", "10.0.0.254"
FIELDS = dict(flags=wire.FLAG_RETRANSMIT, job_id=7, worker_id=2, slot=5, tag=9, offset=64, token=0x01020304)
WORDS = [1, -2]
HOMAGG = bytes.fromhex(
    "20"  # version 2, op ADD
    "02"  # flags RETRANSMIT
    "0007"  # job_id
    "02" "00"  # worker_id, reserved
    "0002"  # word_count
    "0005"  # bank 0, slot 5
    "0009"  # tag
    "00000040"  # offset
    "01020304"  # token
    "00000001" "fffffffe"  # words 1, -2
)
#: worker 10.0.0.1:18500 -> switch 10.0.0.254:18497 (dport 0x4841), IPv4 id 1, TTL 64
REQUEST = bytes.fromhex(
    "45000038" "00010000" "401165b6" "0a000001" "0a0000fe"  # IPv4, total length 56, checksum 0x65b6
    "4844" "4841" "0024" "33c3"  # UDP 18500 -> 18497, length 36, checksum 0x33c3
) + HOMAGG


def _rfc1071(data: bytes) -> int:
    data += b"\0" * (len(data) % 2)
    s = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def test_golden_checksums_are_right() -> None:
    """The golden frame itself is valid: both checksums verify."""
    assert _rfc1071(REQUEST[:20]) == 0
    pseudo = REQUEST[12:20] + bytes([0, 17]) + REQUEST[24:26]
    assert _rfc1071(pseudo + REQUEST[20:]) == 0


def test_build_request_golden_bytes() -> None:
    """``UDP() / HomAgg()`` is addressed to the homagg port: the bytes equal the golden frame."""
    pkt = IP(src=WORKER, dst=SWITCH) / UDP(sport=18500) / HomAgg(**FIELDS, words=WORDS)
    assert bytes(pkt) == REQUEST


def test_build_sets_dport_only() -> None:
    """The layer binds dport on build and leaves sport at UDP's default (the old bug: sport 18497)."""
    udp = IP(bytes(IP() / UDP() / HomAgg(words=[1])))[UDP]
    assert (udp.dport, udp.sport) == (wire.HOMAGG_UDP_PORT, UDP().sport)
    assert udp.sport != wire.HOMAGG_UDP_PORT
    # a result, ports given explicitly: kept as given
    res = IP(bytes(IP() / UDP(sport=wire.HOMAGG_UDP_PORT, dport=40000) / HomAgg(words=[1])))[UDP]
    assert (res.sport, res.dport) == (wire.HOMAGG_UDP_PORT, 40000)


def test_dissect_request() -> None:
    pkt = IP(REQUEST)
    assert pkt.haslayer(HomAgg)
    h = pkt[HomAgg]
    assert {k: int(getattr(h, k)) for k in FIELDS} == FIELDS
    assert h.words == WORDS and h.word_count == len(WORDS)
    assert bytes(h) == HOMAGG


def test_dissect_result_from_the_switch() -> None:
    """A result (source port 18497, to the worker's port) is dissected as HomAgg too."""
    result_hdr = bytes([HOMAGG[0], HOMAGG[1] | wire.FLAG_RESULT]) + HOMAGG[2:]
    frame = bytes(IP(src=SWITCH, dst=WORKER) / UDP(sport=wire.HOMAGG_UDP_PORT, dport=18500, chksum=0)
                  / Raw(result_hdr))
    pkt = IP(frame)
    assert pkt[UDP].sport == wire.HOMAGG_UDP_PORT and pkt[UDP].dport == 18500
    assert pkt.haslayer(HomAgg)
    assert pkt[HomAgg].flags.value == wire.FLAG_RESULT | wire.FLAG_RETRANSMIT
    assert pkt[HomAgg].words == WORDS
    # the fast path reads the same datagram
    h, words = wire.parse_packet(bytes(pkt[UDP].payload))
    assert h.flags == wire.FLAG_RESULT | wire.FLAG_RETRANSMIT and words.tolist() == WORDS


def test_other_ports_are_not_homagg() -> None:
    pkt = IP(bytes(IP() / UDP(sport=1234, dport=5678) / Raw(HOMAGG)))
    assert not pkt.haslayer(HomAgg)
    assert bytes(pkt[Raw]) == HOMAGG
