"""The homagg wire format (v2): the single source of truth in code.

``docs/wire-format.md`` is the human summary of this module; the P4 program (``p4/``), the switch
emulator (``switch_emulator/``), the scapy layer (:mod:`homagg.wire_scapy`) and the worker's fast
path all use the constants below, and ``tests/test_wire.py`` proves they agree byte for byte.

Packet: Ethernet / IPv4 / UDP (destination port :data:`HOMAGG_UDP_PORT` towards the switch, source
port :data:`HOMAGG_UDP_PORT` on results in P4 mode) / homagg header (20 bytes) /
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
    |                          job token                            |   (v2)
    +---------------------------------------------------------------+
    |                 payload: word_count x int32                   |

v2 (this version) = v1 + the 32-bit ``token`` word: the per-job admission token agreed when the
job was admitted (:attr:`homagg.jobs.JobSpec.token`).  The switch drops a request whose token is
not its job's (``drop_token``) and echoes the token in results; workers ignore results with
another token.  What it protects (an off-path host that can spoof an admitted source but does not
see the job's traffic) and what not (on-path observers, replay within a job): docs and README.

Invariants:

* ``version == VERSION``; ``op`` in :data:`OPS` (the values of :class:`CombineOp`, the one op
  enum of homagg); ``reserved == 0`` when sent (ignored when parsed).
* ``len(datagram) == HEADER_LEN + 4 * word_count`` exactly; ``1 <= word_count <= MAX_WORDS_JUMBO``.
* ``worker_id < MAX_WORKERS``; ``slot < 2**15``; ``bank in (0, 1)``.
* ``tag`` and ``offset`` are opaque to the switch's arithmetic and echoed in results.
* ``0 <= token < 2**32``; results carry the token of the job they belong to.

Two paths over the same layout (:data:`HEADER_STRUCT` plus the bit packing in
:func:`pack_header_into` / :func:`unpack_header`, nowhere else):

* the *fast path*, used per datagram by the worker transport and the emulator:
  :func:`pack_header_into`, :func:`unpack_header`, :func:`set_flags`, :func:`set_worker_id`,
  :func:`payload_view` -- one :mod:`struct` call on a preallocated buffer, no validation (the
  caller checks what it needs: the emulator's parser stage, the worker's result matching);
* the *checked path* for tools and tests: :func:`pack_header`, :func:`pack_packet`,
  :func:`parse_header`, :func:`parse_packet` raise :class:`~homagg.WireFormatError`.

Nothing here imports scapy or torch.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import numpy as np

from ._errors import WireFormatError

__all__ = [
    "VERSION",
    "CombineOp",
    "OP_ADD",
    "OP_OR",
    "OP_MAX",
    "OPS",
    "FLAG_RESULT",
    "FLAG_RETRANSMIT",
    "HEADER_LEN",
    "P4_WORDS",
    "MAX_WORDS_JUMBO",
    "words_for_mtu",
    "MAX_WORKERS",
    "MAX_SLOTS",
    "HOMAGG_UDP_PORT",
    "WORD_DTYPE",
    "HEADER_STRUCT",
    "FLAGS_POS",
    "WORKER_ID_POS",
    "TAG_MASK",
    "TOKEN_POS",
    "TOKEN_MASK",
    "Header",
    "datagram_len",
    "pack_header_into",
    "unpack_header",
    "set_flags",
    "set_worker_id",
    "pack_header",
    "pack_packet",
    "parse_header",
    "parse_packet",
    "payload_view",
]

VERSION = 2


class CombineOp(enum.IntEnum):
    """How a switch combines one word stream; the values are the wire encoding of ``op``.

    * ``ADD`` -- two's complement addition modulo 2**32 (wraps, like P4 ``bit<32>`` arithmetic),
    * ``OR``  -- bitwise or,
    * ``MAX`` -- signed int32 maximum.
    """

    ADD = 0
    OR = 1
    MAX = 2


OP_ADD: int = int(CombineOp.ADD)  #: wrapping int32 addition
OP_OR: int = int(CombineOp.OR)  #: bitwise or
OP_MAX: int = int(CombineOp.MAX)  #: signed int32 maximum
OPS: tuple[int, ...] = tuple(int(o) for o in CombineOp)  #: every valid ``op`` value
FLAG_RESULT = 0x01  #: switch -> worker
FLAG_RETRANSMIT = 0x02  #: worker resent this packet after a timeout
HEADER_LEN = 20
P4_WORDS = 32  #: words per packet for the P4 target
MAX_WORDS_JUMBO = 16000  #: most words per packet the emulator accepts (one UDP datagram)
MAX_WORKERS = 32  #: width of the per-slot worker bitmap
MAX_SLOTS = 1 << 15  #: slot field width: 15 bits
HOMAGG_UDP_PORT = 18497  #: 0x4841, "HA"
WORD_DTYPE = np.dtype(">i4")  #: payload words as they lie on the wire

#: version|op (B), flags (B), job_id (H), worker_id (B), reserved (B), word_count (H),
#: bank|slot (H), tag (H), offset (I), token (I)
HEADER_STRUCT = struct.Struct("!BBHBBHHHII")
assert HEADER_STRUCT.size == HEADER_LEN

FLAGS_POS = 1  #: byte offset of ``flags`` in the header
WORKER_ID_POS = 4  #: byte offset of ``worker_id`` in the header
TAG_MASK = 0xFFFF  #: ``tag`` is 16 bits
TOKEN_POS = 16  #: byte offset of ``token`` in the header
TOKEN_MASK = 0xFFFFFFFF  #: ``token`` is 32 bits
_RESERVED_POS = 5
_SLOT_MASK = MAX_SLOTS - 1
_BANK_SHIFT = 15

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
    token: int = 0


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
    token: int = 0,
    pos: int = 0,
) -> None:
    """Write a version-``VERSION`` header at ``buf[pos:pos+HEADER_LEN]`` (fast path, no validation beyond struct's)."""
    _pack_into(
        buf, pos, (VERSION << 4) | op, flags, job_id, worker_id, 0, word_count, (bank << _BANK_SHIFT) | slot, tag,
        offset, token,
    )


def unpack_header(
    buf: bytes | bytearray | memoryview, pos: int = 0
) -> tuple[int, int, int, int, int, int, int, int, int, int, int, int]:
    """The header fields at ``buf[pos:]`` in :class:`Header` order (fast path: no validation at all).

    Returns ``(version, op, flags, job_id, worker_id, word_count, bank, slot, tag, offset, reserved,
    token)``; the caller checks version, op, lengths, token (``buf`` must hold at least
    :data:`HEADER_LEN` bytes).
    """
    vo, flags, job, wid, res, wc, bs, tag, off, tok = _unpack_from(buf, pos)
    return vo >> 4, vo & 0xF, flags, job, wid, wc, bs >> _BANK_SHIFT, bs & _SLOT_MASK, tag, off, res, tok


def set_flags(buf: bytearray | memoryview, flags: int, pos: int = 0) -> None:
    """Overwrite the ``flags`` byte of the header at ``buf[pos:]`` (e.g. mark a retransmission)."""
    buf[pos + FLAGS_POS] = flags


def set_worker_id(buf: bytearray | memoryview, worker_id: int, pos: int = 0) -> None:
    """Overwrite the ``worker_id`` byte of the header at ``buf[pos:]`` (per-copy rewrite of results)."""
    buf[pos + WORKER_ID_POS] = worker_id


def datagram_len(word_count: int) -> int:
    """Bytes of a datagram carrying ``word_count`` payload words."""
    return HEADER_LEN + 4 * word_count


def words_for_mtu(mtu: int) -> int:
    """Payload words of the largest homagg datagram one IPv4 packet of ``mtu`` bytes carries
    (IP 20 + UDP 8 + header + 4K <= mtu; at most MAX_WORDS_JUMBO): 363 at 1500, 2238 at 9000,
    16000 on loopback (65536)."""
    return max(1, min(MAX_WORDS_JUMBO, (mtu - 20 - 8 - HEADER_LEN) // 4))


def pack_header(h: Header) -> bytes:
    """Bytes of header ``h`` (validated)."""
    _validate(h)
    buf = bytearray(HEADER_LEN)
    pack_header_into(buf, h.op, h.flags, h.job_id, h.worker_id, h.word_count, h.bank, h.slot, h.tag, h.offset,
                     h.token)
    buf[_RESERVED_POS] = h.reserved  # validated: version == VERSION, so only ``reserved`` may differ
    return bytes(buf)


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
    h = Header(*unpack_header(buf))
    _validate(h)
    wc = h.word_count
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
    if not (0 <= h.flags < 256 and 0 <= h.job_id < 65536 and 0 <= h.tag < 65536 and 0 <= h.offset < 2**32
            and 0 <= h.token < 2**32):
        raise WireFormatError(f"header field out of range: {h}")
