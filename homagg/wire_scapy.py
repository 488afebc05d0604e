"""Scapy layer for the homagg header, declared from :mod:`homagg.wire`'s constants.

Importing this module imports scapy (an optional dependency: ``pip install homagg[test]``) and
binds the layer under UDP on :data:`~homagg.wire.HOMAGG_UDP_PORT`: one binding per direction.
Building ``UDP() / HomAgg()`` sets ``dport`` to the homagg port (a request, worker -> switch);
dissection finds the layer behind UDP datagrams *to* the homagg port (requests) and *from* it
(results, switch -> worker)::

    >>> from homagg.wire_scapy import HomAgg
    >>> pkt = Ether() / IP() / UDP(sport=18500) / HomAgg(job_id=1, words=[1, 2, 3])   # dport 18497

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
from scapy.packet import Packet, bind_bottom_up, bind_layers

from . import wire

__all__ = ["HomAgg", "OP_NAMES", "FLAG_NAMES"]

OP_NAMES = {wire.OP_ADD: "ADD", wire.OP_OR: "OR", wire.OP_MAX: "MAX"}
#: bit i of ``flags`` -> name (FLAG_RESULT = bit 0, FLAG_RETRANSMIT = bit 1)
FLAG_NAMES = ["RESULT", "RETRANSMIT", "b2", "b3", "b4", "b5", "b6", "b7"]
assert 1 << FLAG_NAMES.index("RESULT") == wire.FLAG_RESULT
assert 1 << FLAG_NAMES.index("RETRANSMIT") == wire.FLAG_RETRANSMIT


class HomAgg(Packet):
    """homagg v2 header (v1 + the job token) + int32 payload words (see the diagram in :mod:`homagg.wire`)."""

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
        IntField("token", 0),
        FieldListField("words", [], SignedIntField("word", 0), count_from=lambda p: p.word_count),
    ]

    def mysummary(self) -> str:
        return self.sprintf(
            "HomAgg v%version% %op% job=%job_id% w=%worker_id% slot=%slot%/%bank% off=%offset% n=%word_count%"
            " token=%token%"
        )


assert len(HomAgg(words=[])) == wire.HEADER_LEN
# Requests (worker -> switch) go to the homagg port: bound both ways, so that building
# ``UDP() / HomAgg()`` sets dport = HOMAGG_UDP_PORT (and leaves sport alone).
bind_layers(UDP, HomAgg, dport=wire.HOMAGG_UDP_PORT)
# Results (switch -> worker) come from the homagg port: dissection only.  A second bind_layers
# would also register sport as the field to set on build, and the last binding wins there.
bind_bottom_up(UDP, HomAgg, sport=wire.HOMAGG_UDP_PORT)
