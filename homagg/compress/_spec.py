"""Compression specs: ``"topk:0.01"``, ``"dgc:0.001,momentum=0.9"``, ``"qsgd:levels=16"``, ...

Grammar (whitespace ignored, names case-insensitive)::

    spec   := "" | "none" | "exact" | stage ("|" stage)*
    stage  := NAME [":" arg ("," arg)*]
    arg    := VALUE            (the stage's main parameter, first argument only)
            | KEY "=" VALUE

Several stages compose left to right (``"threshold:value=1e-4|topk:0.01"``); a quantiser
(``onebit``, ``twobit``, ``terngrad``, ``qsgd``) may only be the last stage and ``dgc`` only the first.
Every value is validated here; any problem raises :class:`~homagg.ConfigError` naming the spec.
This module does not import torch (the backend validates ``HOMAGG_COMPRESS`` with it).

Invariant: :func:`parse` returns ``None`` (no compression: the exact codec) or a tuple of
:class:`StageSpec` whose parameters are complete (defaults filled in) and in range, and
:func:`format_spec` of it parses back to an equal value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError

__all__ = ["StageSpec", "parse", "format_spec", "SPARSIFIERS", "QUANTIZERS", "STAGES"]

SPARSIFIERS = ("topk", "randk", "threshold", "dgc")
QUANTIZERS = ("onebit", "twobit", "terngrad", "qsgd")
STAGES = SPARSIFIERS + QUANTIZERS

# name -> (main parameter or None, {key: (type, default, check, description)})
_Check = Any
_FRACTION = (float, None, lambda v: 0.0 < v <= 1.0, "a fraction in (0, 1]")
_BOOL = (bool, None, None, "0/1")
_COMMON_Q = {
    "block": (int, 1024, lambda v: 1 <= v <= 1 << 24, "an int in [1, 2**24] (elements per shared scale)"),
    "steps": (int, 4, lambda v: 1 <= v <= 64, "an int in [1, 64] (scale grid points per octave)"),
    "seed": (int, 0, lambda v: 0 <= v < 2**62, "an int >= 0"),
}
_PARAMS: dict[str, tuple[str | None, dict[str, tuple[type, Any, _Check, str]]]] = {
    "topk": ("fraction", {"fraction": _FRACTION, "ef": (bool, True, None, "0/1")}),
    "randk": ("fraction", {"fraction": _FRACTION, "ef": (bool, True, None, "0/1"),
                           "shared": (bool, True, None, "0/1 (same indices on every worker)"),
                           "seed": (int, 0, lambda v: 0 <= v < 2**62, "an int >= 0")}),
    "threshold": ("value", {"value": (float, None, lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0"),
                            "density": (float, None, lambda v: 0.0 < v <= 1.0, "a fraction in (0, 1]"),
                            "sample": (int, 10000, lambda v: v >= 1, "an int >= 1"),
                            "ef": (bool, True, None, "0/1"),
                            "seed": (int, 0, lambda v: 0 <= v < 2**62, "an int >= 0")}),
    "dgc": ("density", {"density": _FRACTION,
                        "momentum": (float, 0.9, lambda v: 0.0 <= v < 1.0, "a number in [0, 1)"),
                        "clip": (float, 0.0, lambda v: v >= 0 and math.isfinite(v),
                                 "a finite number >= 0 (0: no local clipping)"),
                        "warmup": (int, 0, lambda v: v >= 0, "an int >= 0 (steps)"),
                        "stages": (int, 4, lambda v: v >= 1, "an int >= 1")}),
    "onebit": (None, {**_COMMON_Q, "ef": (bool, True, None, "0/1")}),
    "twobit": (None, {**_COMMON_Q, "ef": (bool, True, None, "0/1")}),
    "terngrad": (None, {**_COMMON_Q, "ef": (bool, False, None, "0/1")}),
    "qsgd": ("levels", {**_COMMON_Q, "levels": (int, 16, lambda v: 1 <= v <= 2**20, "an int in [1, 2**20]"),
                        "norm": (str, "l2", lambda v: v in ("l2", "max"), "'l2' or 'max'"),
                        "ef": (bool, False, None, "0/1")}),
}


@dataclass(frozen=True)
class StageSpec:
    """One validated stage: its name and every parameter (defaults filled in)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.params.items()))))

    @property
    def is_quantizer(self) -> bool:
        return self.name in QUANTIZERS


def _value(kind: type, text: str, where: str) -> Any:
    try:
        if kind is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            number = float(text)
            if not number.is_integer():
                raise ValueError(text)
            return int(number)
        if kind is float:
            return float(text)
        return text.lower()
    except ValueError:
        raise ConfigError(f"{where}: {text!r} is not {'an int' if kind is int else 'a ' + kind.__name__}") from None


def _stage(text: str, spec: str) -> StageSpec:
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name not in _PARAMS:
        raise ConfigError(f"compress spec {spec!r}: unknown stage {name!r}; known: {', '.join(STAGES)}")
    main, table = _PARAMS[name]
    given: dict[str, Any] = {}
    args = [a.strip() for a in rest.split(",")] if rest.strip() else []
    for i, arg in enumerate(args):
        key, eq, raw = arg.partition("=")
        key, raw = key.strip().lower(), raw.strip()
        if not eq:
            if i != 0 or main is None:
                raise ConfigError(f"compress spec {spec!r}: {name} takes key=value arguments, got {arg!r}")
            key, raw = main, arg
        if key not in table:
            raise ConfigError(f"compress spec {spec!r}: {name} has no parameter {key!r}; known: {sorted(table)}")
        if key in given:
            raise ConfigError(f"compress spec {spec!r}: {name}: {key} given twice")
        kind, _default, check, what = table[key]
        value = _value(kind, raw, f"compress spec {spec!r}: {name}.{key}")
        if check is not None and not check(value):
            raise ConfigError(f"compress spec {spec!r}: {name}.{key} must be {what}, got {raw!r}")
        given[key] = value
    if name == "threshold":
        if ("value" in given) == ("density" in given):
            raise ConfigError(f"compress spec {spec!r}: threshold needs exactly one of value=T or density=D")
    for key, (_kind, default, _check, _what) in table.items():
        if key not in given and default is None and name != "threshold":
            raise ConfigError(f"compress spec {spec!r}: {name} needs {key} (e.g. {name}:0.01)")
        given.setdefault(key, default)
    return StageSpec(name, given)


def parse(spec: str | None) -> tuple[StageSpec, ...] | None:
    """Validated stages of ``spec`` (``None`` for no compression); :class:`ConfigError` if invalid."""
    if spec is None:
        return None
    if not isinstance(spec, str):
        raise ConfigError(f"compress: expected a spec string such as 'topk:0.01', got {type(spec).__name__}")
    text = spec.strip()
    if text.lower() in ("", "none", "exact", "off"):
        return None
    parts = [p.strip() for p in text.split("|")]
    if any(not p for p in parts):
        raise ConfigError(f"compress spec {spec!r}: empty stage")
    stages = tuple(_stage(p, spec) for p in parts)
    for i, st in enumerate(stages):
        if st.is_quantizer and i != len(stages) - 1:
            raise ConfigError(f"compress spec {spec!r}: quantiser {st.name} must be the last stage")
        if st.name == "dgc" and i != 0:
            raise ConfigError(f"compress spec {spec!r}: dgc keeps its own accumulation and must be the first stage")
    return stages


def format_spec(stages: tuple[StageSpec, ...] | None) -> str:
    """The canonical spec string of parsed stages (``"none"`` for ``None``)."""
    if not stages:
        return "none"

    def fmt(v: Any) -> str:
        return str(int(v)) if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v)

    return "|".join(f"{s.name}:" + ",".join(f"{k}={fmt(v)}" for k, v in sorted(s.params.items()) if v is not None)
                    for s in stages)
