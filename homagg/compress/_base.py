"""The stage contract, per-key state, error feedback and counter-based randomness.

A *stage* maps one worker's flat gradient of one tensor / DDP bucket (``key``) to the flat tensor
it contributes to the sum: ``out = stage(v, key, ctx)``, same shape, dtype and device.  Stages are
stateful per key (DGC's momentum, random stages' step counters) and the state lives on the
gradient's device.  Every stateful object here has ``state_dict()`` / ``load_state_dict()``:
loading what ``state_dict()`` returned restores the exact state, so training resumes bit for bit.

Randomness is *counter based*: the draws of a call are a pure function of ``(seed, key, step,
rank)`` (a fresh :class:`torch.Generator` seeded from them), so a stage's random state is its step
counter and nothing else — checkpointing it needs no generator state, and a worker's draws do not
depend on what other tensors did before.

Invariant of :class:`ErrorFeedback` (per key, elementwise, in the gradient's dtype): after
``v = fb.add(g, key)`` and ``fb.keep(v, sent, key)`` the residual is ``v - sent``; for stages whose
``sent`` is ``v`` masked (sparsifiers) ``sent + residual == v`` holds bit for bit, and over many
steps ``sum(sent) + residual == sum(g)`` holds exactly whenever the additions are exact (e.g.
integer-valued float64 gradients); in float32 the one rounding per step is that of ``g + residual``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._errors import ConfigError

__all__ = ["Context", "Stage", "Compose", "ErrorFeedback", "generator", "key_name"]


@dataclass(frozen=True)
class Context:
    """What a stage may know about the collective: this worker's rank and the world size."""

    rank: int = 0
    world_size: int = 1


def key_name(key: Hashable) -> str:
    """The portable name of a state key (used in state dicts)."""
    return key if isinstance(key, str) else repr(key)


def generator(device: torch.device, *parts: Any) -> torch.Generator:
    """A generator on ``device`` seeded from ``parts`` (stable across processes and runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    return gen


class KeyedState:
    """Per-key dicts of tensors and ints; the state-dict plumbing shared by stages and feedback."""

    def __init__(self) -> None:
        self._state: dict[str, dict[str, Any]] = {}

    def slot(self, key: Hashable) -> dict[str, Any]:
        """The (mutable) state of ``key``, created empty on first use."""
        return self._state.setdefault(key_name(key), {})

    def keys(self) -> Iterator[str]:
        return iter(self._state)

    def state_dict(self) -> dict[str, Any]:
        """A deep copy: tensors cloned (same device), ints as they are."""
        return {k: {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in d.items()}
                for k, d in self._state.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise ConfigError(f"state dict must be a mapping, got {type(state).__name__}")
        self._state = {str(k): {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in dict(d).items()}
                       for k, d in state.items()}


class Stage(KeyedState):
    """Base class of a compression stage.  Subclasses implement :meth:`apply`."""

    #: whether the stage keeps its own accumulation (then no outer error feedback is added)
    accumulates = False

    def __call__(self, v: torch.Tensor, key: Hashable = None, ctx: Context = Context()) -> torch.Tensor:
        if v.dim() != 1:
            raise ConfigError(f"{type(self).__name__}: stages take flat tensors, got shape {tuple(v.shape)}")
        return self.apply(v, key, ctx)

    def apply(self, v: torch.Tensor, key: Hashable, ctx: Context) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def step_of(self, key: Hashable) -> int:
        """This key's call counter, then incremented (the counter of counter-based randomness)."""
        slot = self.slot(key)
        step = int(slot.get("step", 0))
        slot["step"] = step + 1
        return step


class Compose(Stage):
    """Stages applied left to right; its state is the list of the stages' states."""

    def __init__(self, stages: list[Stage]) -> None:
        super().__init__()
        self.stages = list(stages)
        self.accumulates = any(s.accumulates for s in self.stages)

    def apply(self, v: torch.Tensor, key: Hashable, ctx: Context) -> torch.Tensor:
        for stage in self.stages:
            v = stage(v, key, ctx)
        return v

    def state_dict(self) -> dict[str, Any]:
        return {"stages": [s.state_dict() for s in self.stages]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        parts = state.get("stages") if isinstance(state, Mapping) else None
        if not isinstance(parts, list) or len(parts) != len(self.stages):
            raise ConfigError(f"Compose: state dict for {len(self.stages)} stages expected")
        for stage, part in zip(self.stages, parts):
            stage.load_state_dict(part)


class ErrorFeedback(KeyedState):
    """Residual memory per key (on the gradient's device): what was computed but not sent yet."""

    def add(self, g: torch.Tensor, key: Hashable) -> torch.Tensor:
        """``g + residual`` (a new tensor; ``g`` itself when there is no residual yet)."""
        slot = self.slot(key)
        r = slot.get("residual")
        if r is None or r.shape != g.shape or r.dtype != g.dtype:
            return g.clone()
        if r.device != g.device:
            r = slot["residual"] = r.to(g.device)
        return g + r

    def keep(self, v: torch.Tensor, sent: torch.Tensor, key: Hashable) -> None:
        """Store ``v - sent`` as the residual of ``key``."""
        self.slot(key)["residual"] = v - sent

    def residual(self, key: Hashable) -> torch.Tensor | None:
        return self.slot(key).get("residual")
