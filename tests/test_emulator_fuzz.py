"""10k malformed and random datagrams hit the emulator during a legitimate job: it keeps running
and the job's result stays exact."""

from __future__ import annotations

import random
import socket
import struct
import threading

import pytest

import switch_emulator
from homagg import wire
from homagg.transport import ControlClient

from homagg.testing import run_on_switch

N_FUZZ = 10_000


def _socket_drops(port: int) -> int:
    """Datagrams the kernel dropped at the UDP socket bound to ``port`` (receive buffer full), from
    /proc/net/udp's ``drops`` column: they never reached the switch, so it cannot count them."""
    total = 0
    with open("/proc/net/udp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port:
                total += int(fields[-1])
    return total


def _garbage(rng: random.Random, legit_job: int, fuzz_layer) -> bytes:  # noqa: ANN001
    kind = rng.randrange(7)
    good = wire.pack_packet(wire.Header(wire.VERSION, rng.randrange(3), 0, legit_job, rng.randrange(4), 4, rng.randrange(2),
                                        rng.randrange(16), rng.randrange(65536), 0), [1, 2, 3, 4])
    if kind == 0:
        return bytes(fuzz_layer())  # scapy fuzz of every header field and the words
    if kind == 1:
        return good[: rng.randrange(0, wire.HEADER_LEN)]  # truncated header
    if kind == 2:
        return bytes([rng.choice([0x00, 0x20, 0xF0]) | (good[0] & 0xF)]) + good[1:]  # wrong version
    if kind == 3:
        return good[:6] + struct.pack("!H", rng.choice([0, 5, 3, 16001, 65535])) + good[8:]  # bad word count
    if kind == 4:
        return good[:2] + struct.pack("!H", rng.randrange(100, 65536)) + good[4:]  # unknown job
    if kind == 5:
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))  # noise
    return good  # well-formed, but from an address that was never admitted


@pytest.mark.slow
def test_fuzz_during_job_result_exact() -> None:
    pytest.importorskip("scapy")
    from scapy.packet import fuzz

    from homagg.wire_scapy import HomAgg

    def fuzz_layer():  # noqa: ANN202
        return fuzz(HomAgg(words=[0] * random.randrange(0, 8)))

    with switch_emulator.start() as sw:
        ctl = ControlClient(sw.control_addr)
        stop = threading.Event()
        sent = [0]

        rng = random.Random(5)
        payloads = [_garbage(rng, 1, fuzz_layer) for _ in range(N_FUZZ)]
        during = [0]

        def blast() -> None:
            # cycles through the payloads until the job is over and all were sent at least once
            socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(4)]
            try:
                while not stop.is_set() or sent[0] < N_FUZZ:
                    p = payloads[sent[0] % N_FUZZ]
                    socks[sent[0] % 4].sendto(p, sw.data_addr)
                    sent[0] += 1
                    if sent[0] % 8 == 0:  # spread the datagrams over the job, at a rate a loaded
                        stop.wait(0.001)  # Python switch can take in (so few are lost in socket buffers)
            finally:
                for s in socks:
                    s.close()

        t = threading.Thread(target=blast)
        t.start()
        run_on_switch(sw, 3, numel=15000, k=32, slots=8, schemes=["sketch", "dense"])
        during[0] = sent[0]
        stop.set()
        t.join(120)
        assert sent[0] >= N_FUZZ
        # the switch still answers and a further job is still exact
        assert ctl.ping()["version"] == wire.VERSION
        c = ctl.status()["counters"]
        lost = _socket_drops(sw.data_addr[1])  # lost in a full socket buffer (a loaded host)
        assert c["dropped"] + lost >= 0.9 * sent[0], (c, lost, sent)  # every garbage datagram it read
        assert c["accepted"] > 0 and during[0] > 1000, (c, during)
        run_on_switch(sw, 2, numel=3000, k=32, slots=8, schemes=["dense"])
