"""What a compiled Tofino program aggregates, read from bf-p4c's outputs (nothing estimated).

A packet of ``word_count`` c is aggregated when the ingress parser takes exactly its c words and
each of them has its Word stage (``p4/tofino/pipeline.p4``):

* the parser: bf-p4c's graph of the ingress parser (``pipe/graphs/HomaggIngressParser.dot``,
  written with ``-g``) walked from ``parse_homagg`` with word_count = c, each select decided as
  the compiled keysets say (value, value &&& mask, range, default); the states it passes must be
  ``parse_word_0 .. parse_word_<c-1>`` in order, then ``accept`` (state ``parse_word_<i>``
  extracts ``words[i]``: ``p4/tofino/parser.p4``);
* the stages: the ``wNN.pool`` registers in ``bfrt.json``, one per Word stage, ``w00 .. w(K-1)``.

:func:`compiled_words` gives both limits; its ``per_pass``, the largest K for which every count
1 .. K is aggregated, is the admission limit (:func:`homagg.p4.bfrt.job_entries`): a job with more
words per packet would have packets the switch does not combine (a parser that stops early leaves
the words as payload: the completing packet would carry one worker's words as the "result").

Invariant: ``per_pass <= min(parser, registers)``, and a count c <= ``per_pass`` is parsed as
exactly c words into stages that exist.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..wire import P4_WORDS

__all__ = ["CompiledWords", "compiled_words", "register_words", "parser_words", "PARSER_GRAPH"]

#: bf-p4c's ingress parser graph in a ``-g`` build folder
PARSER_GRAPH = Path("pipe") / "graphs" / "HomaggIngressParser.dot"
_WORD_POOL = re.compile(r"\.w(\d\d)\.pool$")
_NODE = re.compile(r'^(\d+)\[label=(?:"([^"]*)"|([^,\]]*))', re.M)
_EDGE = re.compile(r'^(\d+) -> (\d+)\[label=(?:"([^"]*)"|([^,\]]*))', re.M)
_LITERAL = re.compile(r"^(?:\d+[ws])?(0x[0-9a-fA-F]+|\d+)$")
_WORD_STATE = re.compile(r"^parse_word_(\d+)$")


@dataclass(frozen=True)
class CompiledWords:
    """``parser``: largest K such that the parser takes exactly c words for every c in 1..K;
    ``registers``: the Word stages' registers; ``per_pass``: the words aggregated per pass."""

    parser: int
    registers: int
    per_pass: int


def register_words(bfrt: dict[str, Any]) -> int:
    """The ``wNN.pool`` registers of ``bfrt.json``; :class:`~homagg.ConfigError` unless they are
    ``w00 .. w(K-1)``."""
    idx = sorted(int(m.group(1)) for t in bfrt["tables"] if (m := _WORD_POOL.search(t["name"])))
    if idx != list(range(len(idx))):
        raise ConfigError(f"bfrt.json: word registers {idx} are not w00 .. w{len(idx) - 1:02d}")
    return len(idx)


def _value(text: str) -> int:
    m = _LITERAL.match(text.strip())
    if m is None:
        raise ConfigError(f"parser graph: keyset {text!r} is not a single value")
    return int(m.group(1), 0)


def _matches(keyset: str, v: int) -> bool:
    keyset = keyset.strip()
    if keyset in ("default", "always", "_"):
        return True
    if "&&&" in keyset:
        value, mask = (_value(t) for t in keyset.split("&&&"))
        return v & mask == value & mask
    if ".." in keyset:
        low, high = (_value(t) for t in keyset.split(".."))
        return low <= v <= high
    return v == _value(keyset)


def parser_words(graph: str, word_count: int) -> list[int]:
    """Indices of the words the parser extracts for a homagg packet of ``word_count`` (the
    ``parse_word_<i>`` states passed from ``parse_homagg`` to ``accept``; [] if none).  Raises
    :class:`~homagg.ConfigError` on a graph without ``parse_homagg``, a walk that rejects or does
    not end, or a state on the way that selects on something other than word_count."""
    names: dict[str, str] = {}
    keys: dict[str, str] = {}
    for m in _NODE.finditer(graph):
        label = (m.group(2) if m.group(2) is not None else m.group(3)).replace("\\n", "\n").strip()
        first, _, rest = label.partition("\n")
        names[m.group(1)], keys[m.group(1)] = first.strip(), rest.strip()
    edges: dict[str, list[tuple[str, str]]] = {}
    for m in _EDGE.finditer(graph):
        edges.setdefault(m.group(1), []).append((m.group(2), m.group(3) if m.group(3) is not None else m.group(4)))
    start = [n for n, name in names.items() if name == "parse_homagg"]
    if len(start) != 1:
        raise ConfigError("parser graph: no state parse_homagg")
    node, words = start[0], []
    for _ in range(4 * P4_WORDS):
        if keys[node] not in ("", "{ hdr.homagg.word_count }"):
            raise ConfigError(f"parser graph: state {names[node]} selects on {keys[node]}, not word_count")
        node = next((dst for dst, keyset in edges.get(node, []) if _matches(keyset, word_count)), "")
        name = names.get(node, "")
        if name == "accept":
            return words
        m = _WORD_STATE.match(name)
        if m is None:
            raise ConfigError(f"parser graph: word_count {word_count} leads to {name or 'nowhere'}")
        words.append(int(m.group(1)))
    raise ConfigError(f"parser graph: word_count {word_count} does not reach accept")


def compiled_words(build: str | Path) -> CompiledWords:
    """The words a ``-g`` build folder's program aggregates per pass (see the module docstring);
    :class:`~homagg.ConfigError` when its ``bfrt.json`` or parser graph is missing or unreadable."""
    out = Path(build)
    try:
        bfrt = json.loads((out / "bfrt.json").read_text())
        graph = (out / PARSER_GRAPH).read_text()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{out}: not a bf-p4c -g build of p4/tofino ({exc}); build it with "
                          "homagg p4 build --target tofino|tofino2") from exc
    parser = 0
    while parser < P4_WORDS and parser_words(graph, parser + 1) == list(range(parser + 1)):
        parser += 1
    registers = register_words(bfrt)
    return CompiledWords(parser, registers, min(parser, registers))
