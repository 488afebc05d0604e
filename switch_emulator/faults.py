"""Fault injection for tests: drop, duplicate and reorder datagrams at the switch.

Rates are per datagram.  ``drop`` applies at ingress *and* to each replicated result at egress;
``duplicate`` processes an ingress datagram twice; ``reorder`` holds one ingress datagram back and
processes it after the next one (or when the input goes idle), i.e. swaps neighbours.  Reordering
is bounded to one position so that a late copy can never outlive two uses of a slot bank.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

from homagg._errors import ConfigError

from .counters import Counters

__all__ = ["FaultConfig", "FaultInjector"]

ProcessFn = Callable[[bytes | bytearray | memoryview, int, tuple[str, int]], None]


@dataclass
class FaultConfig:
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"fault rate {name}={v} outside [0, 1)")

    @property
    def active(self) -> bool:
        return bool(self.drop or self.duplicate or self.reorder)

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


class FaultInjector:
    """Wraps the pipeline's ``process``; use :meth:`ingress` in its place and call :meth:`flush` when idle."""

    def __init__(self, config: FaultConfig, process: ProcessFn, counters: Counters) -> None:
        self.process = process
        self.counters = counters
        self.configure(config)
        self._held: tuple[bytes, int, tuple[str, int]] | None = None

    def configure(self, config: FaultConfig) -> None:
        self.config = config
        self._rand = random.Random(config.seed).random

    def ingress(self, buf: bytes | bytearray | memoryview, n: int, src: tuple[str, int]) -> None:
        cfg = self.config
        r = self._rand
        if cfg.drop and r() < cfg.drop:
            self.counters["rx"] += 1
            self.counters.drop("injected")
            return
        if cfg.reorder and self._held is None and r() < cfg.reorder:
            self._held = (bytes(buf[:n]), n, src)
            self.counters["injected_reorder"] += 1
            return
        self.process(buf, n, src)
        if cfg.duplicate and r() < cfg.duplicate:
            self.counters["injected_duplicate"] += 1
            self.process(buf, n, src)
        self.flush()

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self.process(*held)

    def egress_drop(self) -> bool:
        d = self.config.drop
        if d and self._rand() < d:
            self.counters["drop_injected_egress"] += 1
            return True
        return False
