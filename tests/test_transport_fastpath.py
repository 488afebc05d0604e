"""The worker port's two datapaths (homagg/transport/_datapath.py: Python, the reference;
homagg/transport/_fastpath.c: C with sendmmsg/recvmmsg) against each other, on real loopback sockets.

Oracle: the Python datapath.  Both must put the same bytes on the wire for the same chunks, and
turn the same received datagrams (matching results, late copies, another job's, a wrong token,
short ones, group probes) into the same completed chunks, output words and counts -- the native one
also when it sends runs of chunks as UDP GSO messages and when its socket hands it coalesced
buffers of results (UDP_GRO, homagg/_udpseg.h): loopback carries a GSO packet whole to a socket
with UDP_GRO, and cuts it into the datagrams for one without.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import numpy as np
import pytest
import torch

from homagg import ProtocolError, wire
from homagg.jobs import JobSpec
from homagg.transport import CombineOp, Stream, UdpSwitchPort
from homagg.transport._datapath import PyDatapath, Round
from homagg.transport._fastpath import AVAILABLE, NativeDatapath, Scratch
from homagg.transport._roundloop import chunk_table
from homagg.transport._sockets import PROBE_PREFIX, UDP_GRO, set_udp_gro
from homagg.transport._window import INITIAL_WINDOW
from tests.test_transport_rto import FakeSwitch

pytestmark = pytest.mark.skipif(not AVAILABLE, reason="the native datapath was not built (no C compiler at install)")

JOB = JobSpec(5, 2, slot_base=100, n_slots=8, words_per_packet=7, token=0xDEADBEEF).validate()


def _pair() -> tuple[socket.socket, socket.socket]:
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b.bind(("127.0.0.1", 0))
    a.connect(b.getsockname())
    b.connect(a.getsockname())
    a.setblocking(False)
    b.settimeout(2)
    return a, b


def _round(native: bool, seq0: int = 65530) -> tuple[Round, np.ndarray]:
    rng = np.random.default_rng(1)
    srcs = [rng.integers(-2**31, 2**31, 30, dtype=np.int64).astype(np.int32), np.arange(9, dtype=np.int32)]
    table = chunk_table([a.size for a in srcs], [0, 2], 7)
    assert table.tolist() == [[j, off, min(7, a.size - off), op] for j, (a, op) in enumerate(zip(srcs, (0, 2)))
                              for off in range(0, a.size, 7)]
    outs = [np.zeros(a.size, dtype=np.int32) for a in srcs]
    bufs = np.zeros(JOB.n_slots * 64, dtype=np.uint8)
    return Round(job=JOB, rank=1, seq0=seq0, table=table, srcs=srcs, outs=outs, bufs=bufs, stride=64), bufs


UDP_SEGMENT = 103  #: <linux/udp.h>


def _datapath(rnd: Round, sock: socket.socket, native: bool, gso: bool = False):
    return NativeDatapath(rnd, sock.fileno(), Scratch([sock], gso)) if native else PyDatapath(rnd, sock.send)


@pytest.mark.parametrize("gso", [False, True])
def test_both_datapaths_send_the_same_bytes(gso: bool) -> None:
    """The same datagrams from either datapath, received by a :class:`_GroSwitch` (a socket with
    UDP_GRO: each message arrives whole, so merging is counted where it arrives); the native one
    with ``gso`` sends each run of equal-length chunks as one message (the chunks hold 7, 7, 7, 7,
    2 words of stream 0, then 7, 2 of stream 1), without it one message per chunk."""
    wires, messages = {}, {}
    for native in (False, True):
        sw = _GroSwitch()
        a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            a.bind(("127.0.0.1", 0))
            a.connect(sw.addr)
            a.setblocking(False)
            rnd, _ = _round(native)
            dp = _datapath(rnd, a, native, gso)
            assert dp.send(list(range(rnd.total))) == rnd.total  # 7 chunks: slots wrap, the tag wraps at 2**16
            deadline = time.monotonic() + 10
            while len(sw.datagrams) < rnd.total and time.monotonic() < deadline:
                time.sleep(0.01)
            wires[native], messages[native] = list(sw.datagrams), list(sw.messages)
            if native:
                assert dp.scratch.gso.value == gso  # loopback takes GSO: it was not refused
        finally:
            sw.close()
            a.close()
    assert wires[True] == wires[False] and len(wires[True]) == 7
    assert messages[False] == [1] * 7  # the Python datapath: one send per chunk
    assert messages[True] == ([4, 1, 1, 1] if gso else [1] * 7)  # merged where lengths allow
    h, words = wire.parse_packet(wires[True][6])  # the last chunk: stream 1, words 7..8, MAX
    assert (h.op, h.offset, h.word_count, h.token, h.worker_id) == (wire.OP_MAX, 7, 2, JOB.token, 1)
    assert (h.slot, h.bank, h.tag) == (100 + (65530 + 6) % 8, ((65530 + 6) // 8) & 1, (65530 + 6) & 0xFFFF)
    assert words.tolist() == [7, 8]


def _result(rnd: Round, c: int, words: list[int], **change: int) -> bytes:
    g = rnd.seq0 + c
    j, off, wc, op = rnd.chunks[c]
    f = dict(op=op, flags=wire.FLAG_RESULT, job_id=JOB.job_id, worker_id=0, word_count=wc, bank=(g // 8) & 1,
             slot=100 + g % 8, tag=g & 0xFFFF, offset=off, token=JOB.token)
    f.update(change)
    return wire.pack_packet(wire.Header(version=wire.VERSION, reserved=0, **f), words[:f["word_count"]])


def _receive(dp, sock: socket.socket, rnd: Round) -> tuple:
    """Drain ``sock`` through ``dp`` once the datagrams sent to it arrived; what the round then
    holds: (events, late results, outputs, completed, cur, ignored, probes)."""
    events: list[int] = []
    late: list[tuple[int, int, int]] = []
    time.sleep(0.1)
    with pytest.raises(BlockingIOError):
        dp.recv(sock.fileno(), sock.recv_into, events, late)
    return (events, late, [o.tolist() for o in rnd.outs], bytes(rnd.completed), list(rnd.cur), rnd.ignored,
            rnd.probes)


def test_both_datapaths_match_results_alike() -> None:
    seen = {}
    for native in (False, True):
        a, b = _pair()
        rnd, _ = _round(native)
        dp = _datapath(rnd, a, native)
        dp.send([0, 1, 2, 3])
        for c in range(4):
            rnd.cur[(rnd.seq0 + c) % 8] = c
        datagrams = [
            _result(rnd, 2, list(range(100, 107))),  # matches chunk 2
            _result(rnd, 0, [-1] * 7),  # matches chunk 0
            _result(rnd, 0, [5] * 7),  # a second copy: late now
            _result(rnd, 1, [1] * 7, token=1),  # wrong token: ignored
            _result(rnd, 1, [1] * 7, job_id=6),  # another job: ignored
            _result(rnd, 1, [1] * 7, tag=3),  # a stale use of chunk 1's slot: late
            b"short",
            PROBE_PREFIX + b"abc",
            _result(rnd, 3, [2**31 - 1, -2**31, 0, 1, 2, 3, 4]),  # chunk 3: stream 0, words 21..27
        ]
        for d in datagrams:
            b.send(d)
        seen[native] = _receive(dp, a, rnd)
        a.close(), b.close()
    assert seen[True] == seen[False]
    events, late, outs, completed, cur, ignored, probes = seen[True]
    assert events == [2, 0, 3] and completed == bytes([1, 0, 1, 1, 0, 0, 0])
    assert len(late) == 2 and ignored == 3 and probes == 1
    assert outs[0][14:21] == list(range(100, 107)) and outs[0][21:28] == [2**31 - 1, -2**31, 0, 1, 2, 3, 4]


def test_a_coalesced_buffer_of_results_counts_as_its_datagrams() -> None:
    """Results sent as one GSO message reach a native port's UDP_GRO socket as one buffer: it must
    complete the same chunks with the same words as the Python datapath given them one by one."""
    seen = {}
    for native in (False, True):
        a, b = _pair()
        if native:
            assert set_udp_gro(a)
        rnd, _ = _round(native)
        dp = _datapath(rnd, a, native)
        dp.send([0, 1, 2, 3])
        for c in range(4):
            rnd.cur[(rnd.seq0 + c) % 8] = c
        # equal-length results of chunks 3, 0, 2, a late second copy of 0, then 1's with a wrong token
        datagrams = [_result(rnd, c, [c * 10 + i for i in range(7)]) for c in (3, 0, 2, 0)]
        datagrams.append(_result(rnd, 1, [1] * 7, token=1))
        if native:
            b.sendmsg([b"".join(datagrams)], [(socket.IPPROTO_UDP, UDP_SEGMENT, struct.pack("=H", len(datagrams[0])))])
        else:
            for d in datagrams:
                b.send(d)
        seen[native] = _receive(dp, a, rnd)
        a.close(), b.close()
    assert seen[True] == seen[False]
    events, late, outs, completed, _, ignored, _ = seen[True]
    assert events == [3, 0, 2] and len(late) == 1 and ignored == 1 and completed == bytes([1, 0, 1, 1, 0, 0, 0])
    assert outs[0][21:28] == list(range(30, 37)) and outs[0][0:7] == list(range(7))


@pytest.mark.parametrize("words", [1000, 123_457])
@pytest.mark.parametrize("gso", [False, True])
def test_a_port_gives_the_same_results_and_wire_bytes_either_way(words: int, gso: bool) -> None:
    x = torch.randint(-2**31, 2**31 - 1, (words,), dtype=torch.int32)
    got, wires = {}, {}
    for native in (False, True):
        fake = FakeSwitch(lambda i, h: [(0.0, 1)])
        try:
            with UdpSwitchPort(fake.addr, rank=0, job_id=1, world_size=1, n_slots=32, words_per_packet=500,
                               timeout=20.0, native=native, gso=gso) as port:
                (got[native],) = port.combine([Stream("x", CombineOp.ADD, x)])
                assert port.stats["retransmits"] == 0
                assert port.stats.get("gso", 0) == (native and gso)
        finally:
            fake.close()
        wires[native] = sorted(fake.received)
    assert torch.equal(got[True], x) and torch.equal(got[False], x)
    assert wires[True] == wires[False]


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("streams", [1, 2])
def test_stream_zero_is_verified_by_either_loop(native: bool, streams: int) -> None:
    """``Stream.verify`` runs once on stream 0's combined words, also when its last chunk
    completes the round (a single stream); a verifier that raises abandons the round at once."""
    fake = FakeSwitch(lambda i, h: [(0.0, 1)])
    seen: list[torch.Tensor] = []
    words = torch.arange(1, 301, dtype=torch.int32)
    try:
        with UdpSwitchPort(fake.addr, rank=0, job_id=1, world_size=1, n_slots=8, words_per_packet=16,
                           timeout=10.0, native=native) as port:
            rnd = [Stream("x", CombineOp.ADD, words, verify=lambda w: seen.append(w.clone()))]
            rnd += [Stream("y", CombineOp.MAX, words * 2)] * (streams - 1)
            outs = port.combine(rnd)

            def refuse(w: torch.Tensor) -> None:
                raise ProtocolError("ranks out of step")

            with pytest.raises(ProtocolError, match="out of step"):
                port.combine([Stream("x", CombineOp.ADD, words, verify=refuse)] + rnd[1:])
    finally:
        fake.close()
    assert torch.equal(outs[0], words) and len(seen) == 1 and torch.equal(seen[0], words)


class _GroSwitch:
    """A one-worker switch on loopback that counts the messages a port sends: its socket takes
    UDP_GRO, so loopback hands it each GSO message whole, as one buffer (the ``UDP_GRO`` control
    message gives the segment size), and each plain datagram as one buffer of its own.  It cuts
    every buffer into its datagrams and answers each with its words (``FLAG_RESULT``)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        assert set_udp_gro(self.sock), "the kernel has no UDP_GRO (before 5.0)"
        self.addr = self.sock.getsockname()
        self.messages: list[int] = []  #: per buffer received (one per message sent): its datagrams
        self.datagrams: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, anc, _, src = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(4))
            except TimeoutError:
                continue
            seg = len(data)
            for level, kind, value in anc:
                if level == socket.IPPROTO_UDP and kind == UDP_GRO:
                    (seg,) = struct.unpack("=i", value[:4])
            self.messages.append(-(-len(data) // seg))
            for at in range(0, len(data), seg):
                datagram = data[at: at + seg]
                self.datagrams.append(datagram)
                reply = bytearray(datagram)
                wire.set_flags(reply, wire.FLAG_RESULT)
                self.sock.sendto(reply, src)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def _count_messages(x: torch.Tensor) -> tuple[list[int], list[bytes], dict[str, int]]:
    """One round of ``x`` from a native port with GSO left to its default, against a
    :class:`_GroSwitch`: (datagrams per message received, the datagrams sorted, the port's stats)."""
    sw = _GroSwitch()
    try:
        with UdpSwitchPort(sw.addr, rank=0, job_id=1, world_size=1, n_slots=32, words_per_packet=500,
                           timeout=20.0, native=True) as port:
            (out,) = port.combine([Stream("x", CombineOp.ADD, x)])
            stats = dict(port.stats)
    finally:
        sw.close()
    assert torch.equal(out, x)
    return sw.messages, sorted(sw.datagrams), stats


def test_gso_is_on_by_default_towards_a_loopback_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only sockets receive on loopback (the kernel cuts a GSO message back into its datagrams for
    the emulator's socket), so a port sends GSO messages there unless ``HOMAGG_UDP_GSO`` says no;
    a port's round over loopback then leaves as fewer, merged messages with the same datagrams:
    counted where they arrive, at a switch socket that receives each message whole."""
    from homagg.transport._sockets import gso_default

    a, b = _pair()
    try:
        monkeypatch.delenv("HOMAGG_UDP_GSO", raising=False)
        assert gso_default(a)
        monkeypatch.setenv("HOMAGG_UDP_GSO", "0")
        assert not gso_default(a)
    finally:
        a.close(), b.close()
    x = torch.randint(-2**31, 2**31 - 1, (64 * 500,), dtype=torch.int32)  # 64 chunks of 500 words
    monkeypatch.setenv("HOMAGG_UDP_GSO", "0")
    plain, plain_datagrams, plain_stats = _count_messages(x)
    monkeypatch.delenv("HOMAGG_UDP_GSO")
    merged, merged_datagrams, merged_stats = _count_messages(x)
    assert plain_stats["retransmits"] == merged_stats["retransmits"] == 0  # one copy of each chunk
    assert plain_stats.get("gso", 0) == 0 and merged_stats["gso"] == 1
    assert plain == [1] * 64  # one message per datagram
    assert merged_datagrams == plain_datagrams  # the same datagrams on the wire
    # the first window (16 chunks of 2 KB, equal length: under GSO's 64 segments and 64 KB) leaves
    # as one message; later ones as results free room, in runs as long as the answers allow
    assert merged[0] == INITIAL_WINDOW and sum(merged) == 64 and len(merged) < 64, merged
