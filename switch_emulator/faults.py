"""Fault injection for tests: drop, duplicate and reorder datagrams at the switch; mute workers.

Rates are per datagram.  ``drop`` applies at ingress *and* to each replicated result at egress
(``drop=1``: a switch that answers its control port and holds its jobs but forwards nothing);
``duplicate`` processes an ingress datagram twice; ``reorder`` holds one ingress datagram back and
processes it after the next one (or when the input goes idle), i.e. swaps neighbours.  Reordering
is bounded to one position so that a late copy can never outlive two uses of a slot bank.
``mute`` lists worker ids that receive no result at all (neither the completed slot's copies nor
the answers to their retransmissions, and no multicast copy: while a muted worker is subscribed,
results go by unicast): the switch state advances for everyone while those workers wait, the
situation a switch crash leaves when it strikes between the results reaching some workers and
the others.
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
    mute: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("drop", "duplicate", "reorder"):
            v = getattr(self, name)
            if name == "drop" and not 0.0 <= v <= 1.0:  # 1: a switch that forwards nothing
                raise ConfigError(f"fault rate {name}={v} outside [0, 1]")
            if name != "drop" and not 0.0 <= v < 1.0:
                raise ConfigError(f"fault rate {name}={v} outside [0, 1)")
        try:
            mute = tuple(sorted({int(w) for w in self.mute}))
        except (TypeError, ValueError):
            raise ConfigError(f"mute: expected worker ids, got {self.mute!r}") from None
        if any(not 0 <= w < 64 for w in mute):
            raise ConfigError(f"mute: worker ids must lie in [0, 64), got {self.mute!r}")
        object.__setattr__(self, "mute", mute)

    @property
    def active(self) -> bool:
        return bool(self.drop or self.duplicate or self.reorder or self.mute)

    @property
    def mute_mask(self) -> int:
        """The muted workers as a bitmap (bit ``w`` for worker ``w``)."""
        return sum(1 << w for w in self.mute)

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

    def egress_drop(self, worker_id: int) -> bool:
        """Drop a result copy for ``worker_id`` (0 for a multicast copy)?  Muted workers' copies
        always (``drop_muted``), others at the drop rate (``drop_injected_egress``)."""
        if self.config.mute and worker_id in self.config.mute:
            self.counters["drop_muted"] += 1
            return True
        d = self.config.drop
        if d and self._rand() < d:
            self.counters["drop_injected_egress"] += 1
            return True
        return False
