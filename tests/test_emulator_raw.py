"""Raw AF_PACKET backend: frame parsing, ARP, result frames (checked with scapy), without a link.

The backend's own sockets are replaced by fakes, so this runs unprivileged and sends nothing.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

from homagg import wire
from homagg.jobs import JobSpec
from switch_emulator.io_raw import RawBackend, ipv4_checksum
from switch_emulator.switch import Switch

scapy = pytest.importorskip("scapy")
from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import ARP, Ether  # noqa: E402

from homagg.wire_scapy import HomAgg  # noqa: E402

SW_MAC, SW_IP = "02:00:00:00:00:fe", "10.0.0.254"
W_MAC = ["02:00:00:00:00:01", "02:00:00:00:00:02"]
W_IP = ["10.0.0.1", "10.0.0.2"]


class FakeSock:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, frame: bytes) -> int:
        self.sent.append(bytes(frame))
        return len(frame)


def make_backend() -> tuple[RawBackend, FakeSock, Switch]:
    b = RawBackend.__new__(RawBackend)
    b.ifaces, b.udp_port, b.arp_ips = ["p0"], wire.HOMAGG_UDP_PORT, {socket.inet_aton(SW_IP)}
    fake = FakeSock()
    mac = bytes.fromhex(SW_MAC.replace(":", ""))
    b.socks = {0: (fake, "p0", mac)}  # type: ignore[dict-item]
    b.l2, b._ident, b.ignored, b.addr = {}, 0, 0, ("p0", wire.HOMAGG_UDP_PORT)
    sw = Switch(b.send, pool_slots=16)
    return b, fake, sw


def test_ipv4_checksum_known_value() -> None:
    assert ipv4_checksum(bytes.fromhex("450000730000400040110000c0a80001c0a800c7")) == 0xB861


def test_raw_frames_through_pipeline_and_results_on_the_wire() -> None:
    b, fake, sw = make_backend()
    sw.admission.admit(JobSpec.from_dict({"job_id": 3, "world_size": 2, "slot_base": 0, "n_slots": 4,
                                          "words_per_packet": 32,
                                          "workers": [{"worker_id": w, "ip": W_IP[w], "port": 40000 + w}
                                                      for w in range(2)]}))
    words = [np.arange(32, dtype=np.int64) * (w + 1) for w in range(2)]
    for w in range(2):
        frame = bytes(Ether(src=W_MAC[w], dst=SW_MAC) / IP(src=W_IP[w], dst=SW_IP) /
                      UDP(sport=40000 + w, dport=wire.HOMAGG_UDP_PORT) /
                      HomAgg(job_id=3, worker_id=w, slot=1, bank=1, tag=9, offset=64, words=words[w].tolist()))
        buf = bytearray(frame)
        b._frame(sw, fake, b.socks[0][2], memoryview(buf), len(buf))  # type: ignore[arg-type]
    assert sw.counters["completed"] == 1
    assert len(fake.sent) == 2
    for w, raw in enumerate(sorted(fake.sent, key=lambda f: Ether(f)[IP].dst)):
        pkt = Ether(raw)
        assert pkt.dst == W_MAC[w] and pkt.src == SW_MAC
        assert pkt[IP].src == SW_IP and pkt[IP].dst == W_IP[w]
        rebuilt = IP(bytes(pkt[IP]))
        del rebuilt.chksum
        assert IP(bytes(rebuilt)).chksum == pkt[IP].chksum  # checksum valid
        assert pkt[UDP].sport == wire.HOMAGG_UDP_PORT and pkt[UDP].dport == 40000 + w
        h = pkt[HomAgg]
        assert h.flags == wire.FLAG_RESULT and h.slot == 1 and h.bank == 1 and h.tag == 9 and h.offset == 64
        assert h.worker_id == w and h.words == (words[0] + words[1]).tolist()


def test_raw_ignores_other_traffic_and_answers_arp() -> None:
    b, fake, sw = make_backend()
    mac = b.socks[0][2]
    for frame in (
        bytes(Ether() / IP(dst=SW_IP) / UDP(dport=53) / b"x"),  # other UDP port
        bytes(Ether() / IP(dst=SW_IP, proto=6) / (b"\0" * 20)),  # not UDP
        bytes(Ether() / IP(dst=SW_IP, flags="MF") / UDP(dport=wire.HOMAGG_UDP_PORT) / (b"\0" * 16)),  # fragment
        b"\0" * 20,  # runt
    ):
        buf = bytearray(frame)
        b._frame(sw, fake, mac, memoryview(buf), len(buf))  # type: ignore[arg-type]
    assert sw.counters["rx"] == 0
    # a homagg datagram from an unknown source reaches the pipeline and is dropped there
    buf = bytearray(bytes(Ether() / IP(src="10.9.9.9", dst=SW_IP) / UDP(sport=1, dport=wire.HOMAGG_UDP_PORT) /
                          HomAgg(words=[1])))
    b._frame(sw, fake, mac, memoryview(buf), len(buf))  # type: ignore[arg-type]
    assert sw.counters["drop_unknown_source"] == 1
    req = bytearray(bytes(Ether(src=W_MAC[0], dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=W_MAC[0], psrc=W_IP[0],
                                                                             pdst=SW_IP)))
    b._frame(sw, fake, mac, memoryview(req), len(req))  # type: ignore[arg-type]
    reply = Ether(fake.sent[-1])
    assert reply[ARP].op == 2 and reply[ARP].hwsrc == SW_MAC and reply[ARP].psrc == SW_IP
    assert reply[ARP].pdst == W_IP[0] and reply.dst == W_MAC[0]
