"""Golden packets: the fast path and the scapy layer agree with docs/wire-format.md byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from homagg import wire
import homagg
from homagg._errors import WireFormatError

GOLDEN_HEADER = bytes.fromhex(
    "22"  # version 2, op MAX (2)
    "03"  # flags RESULT | RETRANSMIT
    "0102"  # job_id 258
    "05"  # worker_id 5
    "00"  # reserved
    "0003"  # word_count 3
    "9234"  # bank 1, slot 0x1234
    "beef"  # tag
    "01020304"  # offset
    "a5c3e10f"  # token
)
GOLDEN_PAYLOAD = bytes.fromhex("00000001" "ffffffff" "7fffffff")
GOLDEN = GOLDEN_HEADER + GOLDEN_PAYLOAD
GOLDEN_FIELDS = dict(
    version=2, op=wire.OP_MAX, flags=3, job_id=258, worker_id=5, word_count=3, bank=1, slot=0x1234, tag=0xBEEF,
    offset=0x01020304, token=0xA5C3E10F,
)
GOLDEN_WORDS = [1, -1, 2**31 - 1]


def test_constants_match_doc_and_contract() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "wire-format.md").read_text()
    for name in ("VERSION", "OP_ADD", "OP_OR", "OP_MAX", "FLAG_RESULT", "FLAG_RETRANSMIT", "HEADER_LEN", "P4_WORDS",
                 "MAX_WORKERS", "HOMAGG_UDP_PORT", "MAX_WORDS_JUMBO"):
        m = re.search(rf"`{name} = (0x[0-9a-fA-F]+|\d+)`", doc)
        assert m, f"{name} not documented as `{name} = value`"
        assert int(m.group(1), 0) == getattr(wire, name), name
    assert homagg.CombineOp is wire.CombineOp  # one op enum, exported by the package
    assert wire.OPS == (wire.OP_ADD, wire.OP_OR, wire.OP_MAX) == tuple(int(o) for o in wire.CombineOp) == (0, 1, 2)
    assert wire.HOMAGG_UDP_PORT == 0x4841
    assert wire.HEADER_STRUCT.size == wire.HEADER_LEN == 20
    assert wire.HEADER_LEN + 4 * wire.MAX_WORDS_JUMBO <= 65507  # one UDP/IPv4 datagram


def test_fast_path_golden() -> None:
    h = wire.Header(**GOLDEN_FIELDS)
    assert wire.pack_packet(h, GOLDEN_WORDS) == GOLDEN
    buf = bytearray(64)
    wire.pack_header_into(buf, wire.OP_MAX, 3, 258, 5, 3, 1, 0x1234, 0xBEEF, 0x01020304, 0xA5C3E10F)
    assert bytes(buf[:20]) == GOLDEN_HEADER
    parsed, words = wire.parse_packet(GOLDEN)
    assert parsed == h
    assert words.tolist() == GOLDEN_WORDS
    assert words.dtype == np.int32
    assert wire.payload_view(GOLDEN, 3).tolist() == GOLDEN_WORDS


def test_fast_unpack_and_byte_rewrites_golden() -> None:
    """The per-datagram helpers read and rewrite exactly the documented bytes."""
    assert wire.unpack_header(GOLDEN) == tuple(wire.Header(**GOLDEN_FIELDS))
    assert wire.unpack_header(b"\0" * 3 + GOLDEN, pos=3) == tuple(wire.Header(**GOLDEN_FIELDS))
    buf = bytearray(GOLDEN)
    wire.set_flags(buf, wire.FLAG_RESULT)
    wire.set_worker_id(buf, 17)
    assert bytes(buf) == GOLDEN[:1] + b"\x01" + GOLDEN[2:4] + b"\x11" + GOLDEN[5:]
    got = wire.Header(*wire.unpack_header(buf))
    assert (got.flags, got.worker_id) == (wire.FLAG_RESULT, 17)
    assert wire.datagram_len(3) == len(GOLDEN)
    # reserved is carried by the checked path and ignored by nothing else
    assert wire.unpack_header(GOLDEN[:5] + b"\x09" + GOLDEN[6:])[-2] == 9
    assert wire.TOKEN_POS == 16 and GOLDEN[wire.TOKEN_POS:wire.HEADER_LEN] == bytes.fromhex("a5c3e10f")


def test_scapy_golden_build_parse_roundtrip() -> None:
    pytest.importorskip("scapy")
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    from homagg.wire_scapy import HomAgg

    pkt = HomAgg(**{k: v for k, v in GOLDEN_FIELDS.items() if k != "word_count"}, words=GOLDEN_WORDS)
    assert bytes(pkt) == GOLDEN  # word_count computed from words
    back = HomAgg(GOLDEN)
    for k, v in GOLDEN_FIELDS.items():
        assert int(getattr(back, k)) == v, k
    assert back.words == GOLDEN_WORDS
    # bound under UDP on the homagg port, both directions
    frame = Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=40000, dport=wire.HOMAGG_UDP_PORT) / back
    again = Ether(bytes(frame))
    assert again.haslayer(HomAgg) and bytes(again[HomAgg]) == GOLDEN
    reply = Ether(bytes(Ether() / IP() / UDP(sport=wire.HOMAGG_UDP_PORT, dport=40000) / HomAgg(words=[7])))
    assert reply[HomAgg].words == [7]
    # the fast path parses what scapy builds, and vice versa
    h, words = wire.parse_packet(bytes(again[HomAgg]))
    assert h == wire.Header(**GOLDEN_FIELDS) and words.tolist() == GOLDEN_WORDS


@pytest.mark.parametrize("seed", range(20))
def test_random_roundtrip_fast_vs_scapy(seed: int) -> None:
    pytest.importorskip("scapy")
    from homagg.wire_scapy import HomAgg

    rng = np.random.default_rng(seed)
    wc = int(rng.integers(1, 300))
    fields = dict(
        version=2, op=int(rng.integers(0, 3)), flags=int(rng.integers(0, 4)), job_id=int(rng.integers(0, 65536)),
        worker_id=int(rng.integers(0, 32)), word_count=wc, bank=int(rng.integers(0, 2)),
        slot=int(rng.integers(0, 2**15)), tag=int(rng.integers(0, 65536)), offset=int(rng.integers(0, 2**32)),
        token=int(rng.integers(0, 2**32)),
    )
    words = rng.integers(-(2**31), 2**31, size=wc, dtype=np.int64)
    fast = wire.pack_packet(wire.Header(**fields), words)
    assert bytes(HomAgg(**fields, words=words.tolist())) == fast
    h, back = wire.parse_packet(fast)
    assert h._asdict() == {**fields, "reserved": 0}
    assert np.array_equal(back, words)


@pytest.mark.parametrize(
    "data, match",
    [
        (GOLDEN[:19], "shorter"),
        (b"\x12" + GOLDEN[1:], "version"),  # a v1 header (16 bytes, no token)
        (b"\x23" + GOLDEN[1:], "op"),
        (GOLDEN[:6] + b"\x00\x00" + GOLDEN[8:], "word_count"),
        (GOLDEN[:6] + b"\x3f\x00" + GOLDEN[8:], "word_count"),
        (GOLDEN[:-1], "does not hold"),
        (GOLDEN + b"\x00" * 4, "does not hold"),
        (GOLDEN[:4] + b"\x20" + GOLDEN[5:], "worker_id"),
    ],
)
def test_malformed_rejected(data: bytes, match: str) -> None:
    with pytest.raises(WireFormatError, match=match):
        wire.parse_header(data)


def test_pack_rejects_bad_fields() -> None:
    with pytest.raises(WireFormatError):
        wire.pack_packet(wire.Header(**{**GOLDEN_FIELDS, "op": 7}), GOLDEN_WORDS)
    with pytest.raises(WireFormatError):
        wire.pack_packet(wire.Header(**GOLDEN_FIELDS), [1, 2])
    with pytest.raises(WireFormatError):
        wire.pack_packet(wire.Header(**GOLDEN_FIELDS), [1, 2, 2**31])
