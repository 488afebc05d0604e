"""Options of the ``homagg`` process group: environment variables, ``pg_options``, validation.

Precedence (highest first): keys of the ``pg_options`` dict given to ``init_process_group`` /
``new_group``, then environment variables, then defaults.  Every value is validated once, when the
group is created; an invalid value raises :class:`~homagg.ConfigError` naming the key and source.

=================  ===========================  ==============================================
``pg_options`` key  environment variable          meaning
=================  ===========================  ==============================================
``switch``          ``HOMAGG_SWITCH``             ``embedded`` (default: group rank 0 starts an
                                                  emulator; beyond 32 ranks a tree of them),
                                                  ``host:port`` (external emulator or BMv2, up to
                                                  32 ranks), a tree job file (a ``.toml`` or
                                                  ``.json`` path: external switches in a tree,
                                                  :mod:`homagg._treefile`), or ``gloo``
                                                  (fallback: switch emulated with a private gloo
                                                  group, no network element)
``scheme``          ``HOMAGG_SCHEME``             ``auto`` (default), ``sketch``, ``compact``,
                                                  ``dense``
``timeout``         ``HOMAGG_TIMEOUT``            seconds one switch round may take before a
                                                  typed :class:`~homagg.SwitchTimeoutError`
                                                  (default: 30, never more than the group timeout)
``switch_control``  ``HOMAGG_SWITCH_CONTROL``     control address (``host:port``) of an external
                                                  switch (default: the ``switch`` port + 1)
``emulator_host``   ``HOMAGG_EMULATOR_HOST``      address the embedded emulator binds to and
                                                  publishes (default: the rendezvous host if it
                                                  is local, else 127.0.0.1)
``words_per_packet`` ``HOMAGG_WORDS_PER_PACKET``  payload words per datagram (default: for the
                                                  embedded emulator one frame of the link it is
                                                  bound on -- 16000 on loopback, 2238 at MTU 9000,
                                                  363 at 1500; 32 for external switches:
                                                  :data:`homagg.jobs.EMULATOR` / :data:`~homagg.jobs.P4`)
``slots``           ``HOMAGG_SLOTS``              switch slots of the group's job = send window
                                                  in packets (default: embedded 16 at 16000 words,
                                                  more for smaller frames, the same bytes in
                                                  flight, at most 1024; 64 external)
``compress``        ``HOMAGG_COMPRESS``           gradient compression in front of the codec
                                                  (default: none, exact), a spec such as
                                                  ``topk:0.01``, ``dgc:0.001``, ``onebit``,
                                                  ``qsgd:levels=16`` (:mod:`homagg.compress`),
                                                  applied to the allreduces issued during
                                                  backward (DDP's buckets); canonical form
``fallback``        ``HOMAGG_FALLBACK``           what a switch failure does: ``host`` (default:
                                                  the group continues on the host path, gloo,
                                                  and returns to the switch when it answers
                                                  again) or ``error`` (a typed error; the group
                                                  is unusable): :mod:`._fallback`
``probe_interval``  ``HOMAGG_PROBE_INTERVAL``     seconds between rank 0's probes of a failed
                                                  switch while on the host path (default: 1,
                                                  doubling after a failed return, up to 30)
``return_attempts`` ``HOMAGG_RETURN_ATTEMPTS``    failed returns to the switch in a row (the
                                                  re-admission, the canary round or the first
                                                  call after the return failed) after which
                                                  the group stays on the host path (default:
                                                  3; 0: never return)
``codec``           (none)                        dict of extra keyword options for
                                                  :func:`homagg.allreduce`
=================  ===========================  ==============================================

Invariant: a :class:`BackendConfig` is immutable and always valid; every rank of a group must
use the same ``switch`` and ``scheme`` (the group checks this through the store at creation).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..codec._config import SCHEMES
from .._errors import ConfigError
from .._treefile import is_tree_file, load_tree_file
from ..jobs import format_addr, parse_addr
from ..tree import plan_tree
from ..wire import MAX_SLOTS, MAX_WORDS_JUMBO, MAX_WORKERS

__all__ = ["BackendConfig", "ENV_VARS"]

ENV_VARS: dict[str, str] = {
    "switch": "HOMAGG_SWITCH",
    "scheme": "HOMAGG_SCHEME",
    "timeout": "HOMAGG_TIMEOUT",
    "switch_control": "HOMAGG_SWITCH_CONTROL",
    "emulator_host": "HOMAGG_EMULATOR_HOST",
    "words_per_packet": "HOMAGG_WORDS_PER_PACKET",
    "slots": "HOMAGG_SLOTS",
    "compress": "HOMAGG_COMPRESS",
    "fallback": "HOMAGG_FALLBACK",
    "probe_interval": "HOMAGG_PROBE_INTERVAL",
    "return_attempts": "HOMAGG_RETURN_ATTEMPTS",
}
DEFAULT_TIMEOUT_S = 30.0
_MAX_RETURN_ATTEMPTS = 1000
#: what a switch failure does (``fallback``): continue on the host path, or raise
FALLBACK_POLICIES = ("host", "error")


def _switch_address(text: str, *, source: str = "switch") -> tuple[str, int]:
    """A switch's ``host:port`` (``[v6]:port``) through :func:`homagg.jobs.parse_addr`; port 0 is
    refused (a switch address is connected to, not bound)."""
    return parse_addr(text, source=source, zero_port=False)


@dataclass(frozen=True)
class BackendConfig:
    """Validated options of one homagg process group.

    ``switch`` is ``"embedded"``, ``"gloo"`` or a normalised ``"host:port"``; ``timeout`` is the
    bound in seconds on one switch round (finite, > 0); ``codec`` holds extra keyword options for
    :func:`homagg.allreduce` (keys are identifiers).
    """

    switch: str = "embedded"
    scheme: str = "auto"
    timeout: float = DEFAULT_TIMEOUT_S
    switch_control: str | None = None
    emulator_host: str | None = None
    words_per_packet: int | None = None
    slots: int | None = None
    compress: str | None = None
    fallback: str = "host"
    probe_interval: float = 1.0
    return_attempts: int = 3
    codec: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.switch not in ("embedded", "gloo") and not is_tree_file(self.switch):
            _switch_address(self.switch)
        if self.scheme not in SCHEMES:
            raise ConfigError(f"scheme: {self.scheme!r} is not one of {', '.join(SCHEMES)}")
        if not isinstance(self.timeout, (int, float)) or not math.isfinite(self.timeout) or self.timeout <= 0:
            raise ConfigError(f"timeout: expected a finite number of seconds > 0, got {self.timeout!r}")
        if self.switch_control is not None:
            _switch_address(self.switch_control, source="switch_control")
        if self.fallback not in FALLBACK_POLICIES:
            raise ConfigError(f"fallback: {self.fallback!r} is not one of {', '.join(FALLBACK_POLICIES)}")
        if (isinstance(self.probe_interval, bool) or not isinstance(self.probe_interval, (int, float))
                or not math.isfinite(self.probe_interval) or self.probe_interval <= 0):
            raise ConfigError(f"probe_interval: expected a finite number of seconds > 0, got {self.probe_interval!r}")
        for key, low, high in (("words_per_packet", 1, MAX_WORDS_JUMBO), ("slots", 1, MAX_SLOTS),
                               ("return_attempts", 0, _MAX_RETURN_ATTEMPTS)):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
                raise ConfigError(f"{key}: expected an int in [{low}, {high}], got {value!r}")
        if self.emulator_host is not None and not self.emulator_host.strip():
            raise ConfigError("emulator_host: empty address")
        if self.compress is not None and _compress_spec(self.compress, source="compress") != self.compress:
            raise ConfigError(f"compress: {self.compress!r} is not a canonical spec (build it with BackendConfig.resolve)")
        if not isinstance(self.codec, Mapping) or not all(isinstance(k, str) and k.isidentifier() for k in self.codec):
            raise ConfigError(f"codec: expected a dict of keyword options, got {self.codec!r}")

    @property
    def control_address(self) -> tuple[str, int] | None:
        """Control address of an external switch: ``switch_control``, else the data port + 1."""
        data = self.external_address
        if data is None:
            return None
        if self.switch_control is not None:
            return _switch_address(self.switch_control, source="switch_control")
        return data[0], data[1] + 1

    @property
    def external_address(self) -> tuple[str, int] | None:
        """``(host, port)`` of an external switch, or ``None`` for embedded/gloo/a tree job file."""
        if self.switch in ("embedded", "gloo") or self.tree_file is not None:
            return None
        return _switch_address(self.switch)

    @property
    def tree_file(self) -> str | None:
        """The tree job file ``switch`` names (external switches in a tree), or None."""
        return self.switch if is_tree_file(self.switch) else None

    def capped(self, group_timeout_s: float) -> BackendConfig:
        """This config with ``timeout`` no larger than the process group's own timeout."""
        return replace(self, timeout=min(self.timeout, group_timeout_s)) if group_timeout_s > 0 else self

    def check_world(self, size: int) -> None:
        """Refuse a group its switches cannot take with a :class:`~homagg.ConfigError`, on every
        rank before anything is sent: one external switch takes 32 ranks (the worker bitmap), a
        tree job file exactly its ``world_size``, the embedded default a tree of up to 1024
        (:func:`homagg.tree.plan_tree` names the limit); ``gloo`` has no limit."""
        if self.switch == "gloo":
            return
        if self.tree_file is not None:
            tree = load_tree_file(self.tree_file)
            if tree.world_size != size:
                raise ConfigError(f"homagg: world_size {size} differs from the {tree.world_size} ranks of the tree job "
                                  f"file {self.tree_file}")
            return
        if self.switch != "embedded" and size > MAX_WORKERS:
            raise ConfigError(f"homagg: world_size {size} exceeds one switch's {MAX_WORKERS} workers (the worker "
                              f"bitmap); name a tree job file of switches instead (switch=/path/tree.toml, "
                              f"docs/trees.md), or use the embedded default or switch='gloo'")
        try:
            plan_tree(size)
        except ConfigError as exc:
            raise ConfigError(f"homagg: {exc}; switch='gloo' has no limit") from None

    @classmethod
    def resolve(cls, pg_options: Any = None, env: Mapping[str, str] | None = None) -> BackendConfig:
        """Build the config from ``pg_options`` (dict, :class:`BackendConfig` or ``None``) over ``env``."""
        if isinstance(pg_options, BackendConfig):
            return pg_options
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for key, var in ENV_VARS.items():
            raw = env.get(var, "").strip()
            if raw:
                values[key] = _convert(key, raw, source=var)
        if pg_options is not None:
            if not isinstance(pg_options, Mapping):
                raise ConfigError(
                    f"pg_options for backend 'homagg' must be a dict or homagg.torch.BackendConfig, "
                    f"got {type(pg_options).__name__}"
                )
            unknown = sorted(set(pg_options) - set(ENV_VARS) - {"codec"})
            if unknown:
                raise ConfigError(f"pg_options: unknown keys {unknown}; known: {sorted([*ENV_VARS, 'codec'])}")
            for key, value in pg_options.items():
                if key == "codec":
                    values[key] = dict(value) if isinstance(value, Mapping) else value
                else:
                    values[key] = _convert(key, value, source=f"pg_options[{key!r}]")
        return cls(**values)


def _compress_spec(value: Any, *, source: str) -> str | None:
    """The canonical form of a compression spec (``None`` for none/exact); ConfigError if invalid."""
    from ..compress._spec import format_spec, parse

    if not isinstance(value, str):
        raise ConfigError(f"{source}: expected a compression spec string such as 'topk:0.01', got {type(value).__name__}")
    try:
        stages = parse(value)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return None if stages is None else format_spec(stages)


def _convert(key: str, value: Any, *, source: str) -> Any:
    """Normalise one raw option value (a string from the environment or a Python value)."""
    if key in ("timeout", "probe_interval"):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{source}: {key} {value!r} is not a number of seconds") from None
        if not math.isfinite(seconds) or seconds <= 0:
            raise ConfigError(f"{source}: {key} must be finite and > 0, got {value!r}")
        return seconds
    if key in ("words_per_packet", "slots", "return_attempts"):
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{source}: {key} {value!r} is not an integer") from None
        if isinstance(value, float) and number != value:
            raise ConfigError(f"{source}: {key} {value!r} is not an integer")
        return number
    if key == "compress":
        return None if value is None else _compress_spec(value, source=source)
    if not isinstance(value, str):
        raise ConfigError(f"{source}: expected a string, got {type(value).__name__}")
    value = value.strip()
    if key == "switch_control":
        return format_addr(_switch_address(value, source=source))
    if key == "switch":
        low = value.lower()
        if low in ("embedded", "gloo"):
            return low
        if is_tree_file(value):
            load_tree_file(value)  # a ConfigError naming the file and what is wrong, at creation
            return value
        return format_addr(_switch_address(value, source=source))
    if key == "fallback":
        low = value.lower()
        if low not in FALLBACK_POLICIES:
            raise ConfigError(f"{source}: fallback {value!r} is not one of {', '.join(FALLBACK_POLICIES)}")
        return low
    if key == "scheme":
        low = value.lower()
        if low not in SCHEMES:
            raise ConfigError(f"{source}: scheme {value!r} is not one of {', '.join(SCHEMES)}")
        return low
    return value
