"""Scapy layer for the homagg header, declared from :mod:`homagg.wire`'s constants.

Importing this module imports scapy (an optional dependency: ``pip install homagg[test]``) and
binds the layer under UDP for :data:`~homagg.wire.HOMAGG_UDP_PORT` in both directions::

    >>> from homagg.wire_scapy import HomAgg
    >>> pkt = Ether() / IP() / UDP(dport=HOMAGG_UDP_PORT) / HomAgg(job_id=1, words=[1, 2, 3])

``word_count`` is computed from ``words`` when left unset.  Field names equal
:class:`homagg.wire.Header`'s, so ``HomAgg(**header._asdict(), words=...)`` works.
"""

from __future__ import annotations

from scapy.fields import (
    BitEnumField,
    BitField,
    ByteField,
    FieldLenField,
    FieldListField,
    FlagsField,
    IntField,
    ShortField,
    SignedIntField,
)
from scapy.layers.inet import UDP
from scapy.packet import Packet, bind_layers

from . import wire

__all__ = ["HomAgg", "OP_NAMES", "FLAG_NAMES"]

OP_NAMES = {wire.OP_ADD: "ADD", wire.OP_OR: "OR", wire.OP_MAX: "MAX"}
#: bit i of ``flags`` -> name (FLAG_RESULT = bit 0, FLAG_RETRANSMIT = bit 1)
FLAG_NAMES = ["RESULT", "RETRANSMIT", "b2", "b3", "b4", "b5", "b6", "b7"]
assert 1 << FLAG_NAMES.index("RESULT") == wire.FLAG_RESULT
assert 1 << FLAG_NAMES.index("RETRANSMIT") == wire.FLAG_RETRANSMIT


class HomAgg(Packet):
    """homagg v1 header + int32 payload words (see the diagram in :mod:`homagg.wire`)."""

    name = "HomAgg"
    fields_desc = [
        BitField("version", wire.VERSION, 4),
        BitEnumField("op", wire.OP_ADD, 4, OP_NAMES),
        FlagsField("flags", 0, 8, FLAG_NAMES),
        ShortField("job_id", 0),
        ByteField("worker_id", 0),
        ByteField("reserved", 0),
        FieldLenField("word_count", None, count_of="words", fmt="!H"),
        BitField("bank", 0, 1),
        BitField("slot", 0, 15),
        ShortField("tag", 0),
        IntField("offset", 0),
        FieldListField("words", [], SignedIntField("word", 0), count_from=lambda p: p.word_count),
    ]

    def mysummary(self) -> str:
        return self.sprintf(
            "HomAgg v%version% %op% job=%job_id% w=%worker_id% slot=%slot%/%bank% off=%offset% n=%word_count%"
        )


assert len(HomAgg(words=[])) == wire.HEADER_LEN
bind_layers(UDP, HomAgg, dport=wire.HOMAGG_UDP_PORT)
bind_layers(UDP, HomAgg, sport=wire.HOMAGG_UDP_PORT)
