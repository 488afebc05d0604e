"""The homagg wire format (v1): the single source of truth in code.

``docs/wire-format.md`` is the human summary of this module; the P4 program (``p4/``), the switch
emulator (``switch_emulator/``), the scapy layer (:mod:`homagg.wire_scapy`) and the worker's fast
path all use the constants below, and ``tests/test_wire.py`` proves they agree byte for byte.

Packet: Ethernet / IPv4 / UDP (destination port :data:`HOMAGG_UDP_PORT` towards the switch, source
port :data:`HOMAGG_UDP_PORT` on results in P4 mode) / homagg header (16 bytes) /
``word_count`` x int32 payload words.  Everything is big-endian (network order)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-------+-------+---------------+-------------------------------+
    |version|  op   |     flags     |            job_id             |
    +-------+-------+---------------+-------------------------------+
    |   worker_id   |   reserved    |          word_count           |
    +-+-----------------------------+-------------------------------+
    |b|          slot (15)          |              tag              |
    +-+-----------------------------+-------------------------------+
    |                            offset                             |
    +---------------------------------------------------------------+
    |                 payload: word_count x int32                   |

Invariants:

* ``version == VERSION``; ``op`` in ``(OP_ADD, OP_OR, OP_MAX)`` (the values of
  :class:`homagg._switch.CombineOp`); ``reserved == 0`` when sent (ignored when parsed).
* ``len(datagram) == HEADER_LEN + 4 * word_count`` exactly; ``1 <= word_count <= MAX_WORDS_JUMBO``.
* ``worker_id < MAX_WORKERS``; ``slot < 2**15``; ``bank in (0, 1)``.
* ``tag`` and ``offset`` are opaque to the switch's arithmetic and echoed in results.

The fast path (:func:`pack_header_into`, :func:`parse_header`, :func:`payload_view`) works on
preallocated buffers with :mod:`struct` and numpy views; nothing here imports scapy.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from ._errors import WireFormatError

__all__ = [
    "VERSION",
    "OP_ADD",
    "OP_OR",
    "OP_MAX",
    "OPS",
    "FLAG_RESULT",
    "FLAG_RETRANSMIT",
    "HEADER_LEN",
    "P4_WORDS",
    "MAX_WORDS_JUMBO",
    "MAX_WORKERS",
    "MAX_SLOTS",
    "HOMAGG_UDP_PORT",
    "WORD_DTYPE",
    "HEADER_STRUCT",
    "Header",
    "pack_header_into",
    "pack_header",
    "pack_packet",
    "parse_header",
    "parse_packet",
    "payload_view",
]

VERSION = 1
OP_ADD = 0  #: wrapping int32 addition
OP_OR = 1  #: bitwise or
OP_MAX = 2  #: signed int32 maximum
OPS = (OP_ADD, OP_OR, OP_MAX)
FLAG_RESULT = 0x01  #: switch -> worker
FLAG_RETRANSMIT = 0x02  #: worker resent this packet after a timeout
HEADER_LEN = 16
P4_WORDS = 32  #: words per packet for the P4 target
MAX_WORDS_JUMBO = 16000  #: most words per packet the emulator accepts (one UDP datagram)
MAX_WORKERS = 32  #: width of the per-slot worker bitmap
MAX_SLOTS = 1 << 15  #: slot field width: 15 bits
HOMAGG_UDP_PORT = 18497  #: 0x4841, "HA"
WORD_DTYPE = np.dtype(">i4")  #: payload words as they lie on the wire

#: version|op (B), flags (B), job_id (H), worker_id (B), reserved (B), word_count (H),
#: bank|slot (H), tag (H), offset (I)
HEADER_STRUCT = struct.Struct("!BBHBBHHHI")
assert HEADER_STRUCT.size == HEADER_LEN

_pack_into = HEADER_STRUCT.pack_into
_unpack_from = HEADER_STRUCT.unpack_from


class Header(NamedTuple):
    """A parsed homagg header (field order = wire order)."""

    version: int
    op: int
    flags: int
    job_id: int
    worker_id: int
    word_count: int
    bank: int
    slot: int
    tag: int
    offset: int
    reserved: int = 0


def pack_header_into(
    buf: bytearray | memoryview,
    op: int,
    flags: int,
    job_id: int,
    worker_id: int,
    word_count: int,
    bank: int,
    slot: int,
    tag: int,
    offset: int,
    pos: int = 0,
) -> None:
    """Write a version-``VERSION`` header at ``buf[pos:pos+16]`` (fast path, no validation beyond struct's)."""
    _pack_into(
        buf, pos, (VERSION << 4) | op, flags, job_id, worker_id, 0, word_count, (bank << 15) | slot, tag, offset
    )


def pack_header(h: Header) -> bytes:
    """Bytes of header ``h`` (validated)."""
    _validate(h)
    return HEADER_STRUCT.pack(
        (h.version << 4) | h.op, h.flags, h.job_id, h.worker_id, h.reserved, h.word_count,
        (h.bank << 15) | h.slot, h.tag, h.offset,
    )


def pack_packet(h: Header, words: np.ndarray | list[int]) -> bytes:
    """Header + payload bytes; ``len(words)`` must equal ``h.word_count``."""
    arr = np.asarray(words, dtype=np.int64)
    if arr.ndim != 1 or arr.size != h.word_count:
        raise WireFormatError(f"payload has {arr.size} words, header says {h.word_count}")
    if arr.size and (arr.min() < -(2**31) or arr.max() > 2**31 - 1):
        raise WireFormatError("payload word outside int32")
    return pack_header(h) + arr.astype(WORD_DTYPE).tobytes()


def parse_header(buf: bytes | bytearray | memoryview, nbytes: int | None = None) -> Header:
    """Parse and validate the header of a datagram of ``nbytes`` bytes (default ``len(buf)``).

    Raises :class:`~homagg.WireFormatError` on a short datagram, wrong version, unknown op,
    bad word count or a length that does not match ``word_count``.
    """
    n = len(buf) if nbytes is None else nbytes
    if n < HEADER_LEN:
        raise WireFormatError(f"datagram of {n} bytes is shorter than the {HEADER_LEN}-byte header")
    vo, flags, job, wid, res, wc, bs, tag, off = _unpack_from(buf, 0)
    h = Header(vo >> 4, vo & 0xF, flags, job, wid, wc, bs >> 15, bs & 0x7FFF, tag, off, res)
    _validate(h)
    if n != HEADER_LEN + 4 * wc:
        raise WireFormatError(f"datagram of {n} bytes does not hold {wc} words after the header")
    return h


def payload_view(buf: bytes | bytearray | memoryview, word_count: int) -> np.ndarray:
    """Zero-copy big-endian int32 view of the payload of a datagram held in ``buf``."""
    return np.frombuffer(buf, dtype=WORD_DTYPE, count=word_count, offset=HEADER_LEN)


def parse_packet(buf: bytes | bytearray | memoryview) -> tuple[Header, np.ndarray]:
    """Header and payload (native int32 copy) of a whole datagram."""
    h = parse_header(buf)
    return h, payload_view(buf, h.word_count).astype(np.int32)


def _validate(h: Header) -> None:
    if h.version != VERSION:
        raise WireFormatError(f"version {h.version}, expected {VERSION}")
    if h.op not in OPS:
        raise WireFormatError(f"unknown combine op {h.op}")
    if not 1 <= h.word_count <= MAX_WORDS_JUMBO:
        raise WireFormatError(f"word_count {h.word_count} outside [1, {MAX_WORDS_JUMBO}]")
    if h.worker_id >= MAX_WORKERS:
        raise WireFormatError(f"worker_id {h.worker_id} >= MAX_WORKERS={MAX_WORKERS}")
    if not (0 <= h.slot < MAX_SLOTS and h.bank in (0, 1)):
        raise WireFormatError(f"bad slot/bank {h.slot}/{h.bank}")
    if not (0 <= h.flags < 256 and 0 <= h.job_id < 65536 and 0 <= h.tag < 65536 and 0 <= h.offset < 2**32):
        raise WireFormatError(f"header field out of range: {h}")
