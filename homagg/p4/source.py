"""Read constants and header layouts straight out of the P4 sources in ``p4/``.

Used by ``tests/test_p4_constants.py`` (to prove ``p4/`` agrees with :mod:`homagg.wire`) and by
the controller (pool size, flood group, drop reason names), so no number is written down twice.

Only the subset of P4_16 the project writes is understood: ``const bit<N> NAME = VALUE;`` lines
and ``header name_t { bit<N> field; ... }`` blocks.  Comments are stripped first.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from .._errors import ConfigError

__all__ = ["P4_DIR", "P4Const", "p4_constants", "header_fields", "drop_reason_names", "tree_event_names", "strip_comments"]

#: the repository's ``p4/`` folder (the source tree; an installed wheel does not ship it)
P4_DIR = Path(__file__).resolve().parents[2] / "p4"

_CONST = re.compile(r"\bconst\s+bit<(\d+)>\s+(\w+)\s*=\s*([0-9a-fA-FxXbB_]+)\s*;")
_HEADER = re.compile(r"\bheader\s+(\w+)\s*\{(.*?)\}", re.S)
_FIELD = re.compile(r"\bbit<(\d+)>\s+(\w+)\s*;")


class P4Const(tuple):
    """``(width, value)`` of a ``const bit<width> NAME = value;`` declaration."""

    __slots__ = ()

    def __new__(cls, width: int, value: int) -> "P4Const":
        return super().__new__(cls, (width, value))

    @property
    def width(self) -> int:
        return self[0]

    @property
    def value(self) -> int:
        return self[1]


def strip_comments(text: str) -> str:
    """P4 source without ``/* ... */`` and ``// ...`` comments."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _read(name: str, p4_dir: Path | None) -> str:
    path = (p4_dir or P4_DIR) / name
    if not path.is_file():
        raise ConfigError(f"P4 source {path} not found (the p4/ folder ships with the source tree)")
    return strip_comments(path.read_text())


def _int(literal: str) -> int:
    lit = literal.replace("_", "").lower()
    if lit.startswith("0b"):
        return int(lit[2:], 2)
    return int(lit, 0)


@lru_cache(maxsize=None)
def p4_constants(p4_dir: Path | None = None, source: str = "configuration.p4") -> dict[str, P4Const]:
    """Every ``const bit<N> NAME = V;`` (V a literal) of ``source`` (relative to ``p4/``; e.g.
    ``tofino/tofino_config.p4``), as ``{NAME: (N, V)}``.

    Invariant checked here: each value fits its declared width.
    """
    out: dict[str, P4Const] = {}
    for width, name, value in _CONST.findall(_read(source, p4_dir)):
        v = _int(value)
        if v >= 1 << int(width):
            raise ConfigError(f"{source}: {name} = {v} does not fit bit<{width}>")
        out[name] = P4Const(int(width), v)
    return out


@lru_cache(maxsize=None)
def header_fields(header: str, p4_dir: Path | None = None) -> list[tuple[str, int]]:
    """``[(field, bits), ...]`` of ``header <header> { ... }`` in ``headers.p4``, in wire order."""
    for name, body in _HEADER.findall(_read("headers.p4", p4_dir)):
        if name == header:
            return [(field, int(bits)) for bits, field in _FIELD.findall(body)]
    raise ConfigError(f"headers.p4 declares no header {header!r}")


#: ``DROP_*`` constants that count something other than a drop (named without the ``drop_`` prefix)
NOT_DROPS = frozenset({"CONSUMED"})
#: ``DROP_*`` constants that are not counter indices: no reason, and the counter's size
_NOT_REASONS = frozenset({"NONE", "REASONS"})


@lru_cache(maxsize=None)
def drop_reason_names(p4_dir: Path | None = None) -> dict[int, str]:
    """``drop_reasons`` counter index -> counter name, from ``configuration.p4``'s ``DROP_*`` constants.

    ``DROP_<X>`` is named ``drop_<x>`` (the emulator's counter name for the same reason), except
    the reasons in :data:`NOT_DROPS` (``DROP_CONSUMED`` -> ``consumed``: absorbed, not an error).
    Invariants checked here: indices are distinct and below ``DROP_REASONS`` (the counter size).
    """
    consts = p4_constants(p4_dir)
    size = consts["DROP_REASONS"].value if "DROP_REASONS" in consts else 0
    out: dict[int, str] = {}
    for name, const in consts.items():
        if not name.startswith("DROP_") or name[5:] in _NOT_REASONS:
            continue
        reason = name[5:]
        if not 0 < const.value < size or const.value in out:
            raise ConfigError(f"configuration.p4: {name} = {const.value} is not a free index below DROP_REASONS")
        out[const.value] = reason.lower() if reason in NOT_DROPS else "drop_" + reason.lower()
    return out


@lru_cache(maxsize=None)
def tree_event_names(p4_dir: Path | None = None) -> dict[int, str]:
    """``tree_events`` counter index -> counter name, from ``configuration.p4``'s ``TREE_*`` constants
    (``TREE_<X>`` is the emulator's counter ``<x>``: ``up``, ``retransmit_up``, ``result_down``).
    Invariants checked here: indices are distinct and below ``TREE_EVENTS`` (the counter size)."""
    consts = p4_constants(p4_dir)
    size = consts["TREE_EVENTS"].value if "TREE_EVENTS" in consts else 0
    out: dict[int, str] = {}
    for name, const in consts.items():
        if not name.startswith("TREE_") or name == "TREE_EVENTS":
            continue
        if not 0 <= const.value < size or const.value in out:
            raise ConfigError(f"configuration.p4: {name} = {const.value} is not a free index below TREE_EVENTS")
        out[const.value] = name[5:].lower()
    return out
