"""The P4 program agrees with the wire-format module (runs everywhere; no p4c needed).

Oracle: :mod:`homagg.wire`.  Every wire constant in ``p4/configuration.p4`` must equal its Python
twin, and the homagg header declared in ``p4/headers.p4`` must decode bytes packed by
:func:`homagg.wire.pack_header` into the same field values (so widths *and* order agree).
"""

from __future__ import annotations

import math
import re

import pytest

from homagg import wire
from homagg.p4 import P4_DIR, drop_reason_names, header_fields, p4_constants
from homagg.p4.source import strip_comments

WIRE_TWINS = {
    # P4 name            wire.py name
    "HOMAGG_VERSION": "VERSION",
    "OP_ADD": "OP_ADD",
    "OP_OR": "OP_OR",
    "OP_MAX": "OP_MAX",
    "FLAG_RESULT": "FLAG_RESULT",
    "FLAG_RETRANSMIT": "FLAG_RETRANSMIT",
    "HOMAGG_UDP_PORT": "HOMAGG_UDP_PORT",
    "HEADER_LEN": "HEADER_LEN",
    "P4_WORDS": "P4_WORDS",
    "MAX_WORKERS": "MAX_WORKERS",
    "MAX_SLOTS": "MAX_SLOTS",
}


@pytest.mark.parametrize("p4_name,wire_name", sorted(WIRE_TWINS.items()))
def test_constant_equals_wire(p4_name: str, wire_name: str) -> None:
    consts = p4_constants()
    assert p4_name in consts, f"configuration.p4 lacks {p4_name}"
    assert consts[p4_name].value == getattr(wire, wire_name)


def _bits_of(header: str) -> dict[str, int]:
    return dict(header_fields(header))


def test_field_widths_hold_the_constants() -> None:
    c = p4_constants()
    hf = _bits_of("homagg_t")
    assert c["HOMAGG_VERSION"].width == hf["version"]
    for op in ("OP_ADD", "OP_OR", "OP_MAX"):
        assert c[op].width == hf["op"]
    for flag in ("FLAG_RESULT", "FLAG_RETRANSMIT"):
        assert c[flag].width == hf["flags"]
    assert c["HOMAGG_UDP_PORT"].width == dict(header_fields("udp_t"))["dst_port"]
    assert 2 ** hf["slot"] == wire.MAX_SLOTS
    assert 2 ** hf["worker_id"] >= wire.MAX_WORKERS
    assert hf["bank"] == 1


def test_header_length_and_payload() -> None:
    fields = header_fields("homagg_t")
    assert sum(b for _, b in fields) == 8 * wire.HEADER_LEN
    assert header_fields("word_t") == [("value", 32)], "payload words are int32"
    src = strip_comments((P4_DIR / "headers.p4").read_text())
    m = re.search(r"\bword_t\[(\d+)\]\s+words\s*;", src)
    assert m and int(m.group(1)) == wire.P4_WORDS
    assert sum(b for _, b in header_fields("ethernet_t")) == 14 * 8
    assert sum(b for _, b in header_fields("ipv4_t")) == 20 * 8
    assert sum(b for _, b in header_fields("udp_t")) == 8 * 8


def _decode(layout: list[tuple[str, int]], data: bytes) -> dict[str, int]:
    value = int.from_bytes(data, "big")
    total = sum(b for _, b in layout)
    out: dict[str, int] = {}
    pos = total
    for name, bits in layout:
        pos -= bits
        out[name] = (value >> pos) & ((1 << bits) - 1)
    return out


@pytest.mark.parametrize(
    "hdr",
    [
        wire.Header(wire.VERSION, wire.OP_MAX, wire.FLAG_RESULT | wire.FLAG_RETRANSMIT, 0xBEEF, 31,
                    wire.P4_WORDS, 1, 0x7FFF, 0xCAFE, 0xDEADBEEF, token=0xFEDCBA98),
        wire.Header(wire.VERSION, wire.OP_ADD, 0, 1, 0, 1, 0, 0, 0, 0),
        wire.Header(wire.VERSION, wire.OP_OR, wire.FLAG_RETRANSMIT, 0x1234, 7, 16000, 1, 0x1357, 0x2468, 0x01020304,
                    token=1),
    ],
)
def test_p4_layout_decodes_wire_bytes(hdr: wire.Header) -> None:
    got = _decode(header_fields("homagg_t"), wire.pack_header(hdr))
    assert got == {
        "version": hdr.version, "op": hdr.op, "flags": hdr.flags, "job_id": hdr.job_id,
        "worker_id": hdr.worker_id, "reserved": 0, "word_count": hdr.word_count,
        "bank": hdr.bank, "slot": hdr.slot, "tag": hdr.tag, "offset": hdr.offset, "token": hdr.token,
    }


def test_resources_consistent() -> None:
    c = p4_constants()
    assert c["POOL_CELLS"].value == 2 * c["SLOT_POOL_SIZE"].value
    assert c["SLOT_POOL_SIZE"].value <= wire.MAX_SLOTS
    assert c["ADMISSION_ENTRIES"].value >= wire.MAX_WORKERS
    # the per-cell worker bitmap register is MAX_WORKERS bits wide
    src = strip_comments((P4_DIR / "state.p4").read_text())
    m = re.search(r"register<bit<(\d+)>>\(POOL_CELLS\)\s+worker_bitmap", src)
    assert m and int(m.group(1)) == wire.MAX_WORKERS
    # the contribution counter can count to MAX_WORKERS
    m = re.search(r"register<bit<(\d+)>>\(POOL_CELLS\)\s+contributions", src)
    assert m and 2 ** int(m.group(1)) > wire.MAX_WORKERS
    # the use key holds offset ++ tag ++ op ++ word_count (8 bits each for op and word_count)
    m = re.search(r"register<bit<(\d+)>>\(POOL_CELLS\)\s+use_key", src)
    assert m and int(m.group(1)) == 32 + 16 + 8 + 8 and wire.P4_WORDS < 256
    # the payload words are stored in P4_WORDS registers of 32 bits, one per header-stack index
    assert '#include "words.p4"' in src
    words_src = strip_comments((P4_DIR / "words.p4").read_text())
    chain = re.findall(r"#define WORDS_UPTO_(\d+)\(X\) WORDS_UPTO_(\d+)\(X\) X\((\d+), (\d+), (\d+)\)", words_src)
    assert chain == [(str(k), str(k - 1), f"{k - 1:02d}", str(k - 1), str(k)) for k in range(1, wire.P4_WORDS + 1)]
    assert re.search(rf"#define FOR_EACH_WORD\(X\) WORDS_UPTO_{wire.P4_WORDS}\(X\)\n", words_src)
    assert math.log2(c["SLOT_POOL_SIZE"].value).is_integer()


def test_top_file_only_includes() -> None:
    src = strip_comments((P4_DIR / "homagg.p4").read_text())
    code = re.sub(r"#include[^\n]*", "", src)
    assert not re.search(r"\b(control|parser|action|table|header|struct)\b", code), "top file holds only includes"
    for block in ("admission", "slot_select", "worker_bitmap", "counter", "combine", "replicate",
                  "forward", "deparser", "parser", "headers", "metadata", "configuration", "ingress", "state"):
        assert f'#include "{block}.p4"' in src


def test_drop_reason_names_are_the_emulator_counters() -> None:
    """The controller names BMv2's drop_reasons counter indices from configuration.p4; oracle: the
    emulator's counter names (``drop_<reason>``), which must cover every P4 drop and vice versa."""
    from switch_emulator.counters import DROP_REASONS

    names = drop_reason_names()
    c = p4_constants()
    assert names[c["DROP_VERSION"].value] == "drop_version"
    assert names[c["DROP_SHORT"].value] == "drop_short"
    assert names[c["DROP_CONSUMED"].value] == "consumed"  # absorbed, not a drop
    assert c["DROP_NONE"].value not in names and max(names) < c["DROP_REASONS"].value
    drops = {n for n in names.values() if n.startswith("drop_")}
    assert drops == {f"drop_{r}" for r in DROP_REASONS if r != "injected"}  # injection: emulator only
    assert len(names) == len(drops) + 1


def test_tree_event_names_are_the_emulator_counters() -> None:
    """Trees (docs/trees.md): BMv2's tree_events counter is named from configuration.p4's TREE_*
    constants; oracle: the emulator's tree counters (``up``, ``retransmit_up``, ``result_down``)."""
    from homagg.p4 import tree_event_names
    from switch_emulator.counters import Counters

    names = tree_event_names()
    assert set(names.values()) == {"up", "retransmit_up", "result_down"}
    assert set(names.values()) <= set(Counters().snapshot())
    assert sorted(names) == list(range(p4_constants()["TREE_EVENTS"].value))
