"""``Compressor``: the stages of a spec, error feedback and the aggregation, per tensor / bucket.

One call, for one worker and one ``key`` (a DDP bucket index, a parameter name, ...)::

    v    = g + residual[key]                 (error feedback, if on)
    y    = stages(v)                         (sparsifiers / DGC; identity if none)
    sum  = exact codec SUM of y              (homagg.allreduce: compact/sketch see y's zeros)
         | quantised SUM of y                (a quantiser: shared scale, codes ADDed, see _homomorphic)
    residual[key] = v - own contribution     (what this worker actually added to the sum)

The result (the SUM over workers; divide by W for the average) replaces the input in place.
Only dense-layout floating-point tensors are compressed; others go through the exact codec.

Invariant: with error feedback, ``own + residual == v`` after every call (bit for bit for
sparsifiers, whose ``own`` is ``v`` masked; within one float rounding of the input dtype for
quantisers, whose ``own`` is computed in float64), so nothing computed is ever dropped.
:meth:`state_dict` / :meth:`load_state_dict` capture every piece of state (residuals, DGC buffers,
step counters of counter-based randomness): a resumed run is bit-identical to an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

import torch

from .._errors import ConfigError
from ..codec._history import History
from ..codec._stats import WorkerStats
from ..transport import SwitchPort
from ._base import Compose, Context, ErrorFeedback, Stage
from ._dgc import DGC
from ._homomorphic import quantized_protocol
from ._quantize import QSGD, QUANTIZER_TYPES, Quantizer
from ._sparsify import RandomK, Threshold, TopK
from ._spec import StageSpec, format_spec, parse

__all__ = ["Compressor", "build_stage", "build_quantizer", "from_spec"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def build_stage(spec: StageSpec) -> Stage:
    """The sparsifying stage of a parsed spec."""
    p = spec.params
    if spec.name == "topk":
        return TopK(p["fraction"])
    if spec.name == "randk":
        return RandomK(p["fraction"], shared=p["shared"], seed=p["seed"])
    if spec.name == "threshold":
        return Threshold(value=p["value"], density=p["density"], sample=p["sample"], seed=p["seed"])
    if spec.name == "dgc":
        return DGC(p["density"], momentum=p["momentum"], clip=p["clip"], warmup=p["warmup"], stages=p["stages"])
    raise ConfigError(f"{spec.name} is not a sparsifying stage")


def build_quantizer(spec: StageSpec) -> Quantizer:
    """The quantiser of a parsed spec."""
    p = spec.params
    common = {"block": p["block"], "steps": p["steps"], "seed": p["seed"]}
    if spec.name == "qsgd":
        return QSGD(levels=p["levels"], norm=p["norm"], **common)
    if spec.name not in QUANTIZER_TYPES:
        raise ConfigError(f"{spec.name} is not a quantiser")
    return QUANTIZER_TYPES[spec.name](**common)


class Compressor:
    """Stateful compression in front of the aggregation, for any number of keys.

    Build from a spec string (``Compressor("topk:0.01")``) or from parts (``stages``, ``quantizer``,
    ``error_feedback``).  One object per worker and process group; every worker must use an equal
    spec and call it for the same keys in the same order (as collectives do).
    """

    def __init__(self, spec: str | None = None, *, stages: list[Stage] | None = None,
                 quantizer: Quantizer | None = None, error_feedback: bool | None = None) -> None:
        parsed = parse(spec) if spec is not None else None
        if spec is not None and parsed is None:
            raise ConfigError(f"compress spec {spec!r} means no compression; use None instead of a Compressor")
        if parsed is not None and (stages is not None or quantizer is not None):
            raise ConfigError("give a spec or stages/quantizer, not both")
        self.spec = format_spec(parsed) if parsed is not None else "custom"
        if parsed is not None:
            stages = [build_stage(s) for s in parsed if not s.is_quantizer]
            quantizer = build_quantizer(parsed[-1]) if parsed[-1].is_quantizer else None
            if error_feedback is None:
                error_feedback = any(s.params.get("ef", False) for s in parsed)
        self.stage: Stage | None = (stages[0] if len(stages) == 1 else Compose(stages)) if stages else None
        self.quantizer = quantizer
        if self.stage is None and self.quantizer is None:
            raise ConfigError("a Compressor needs at least one stage or a quantiser")
        if self.stage is not None and self.stage.accumulates:
            error_feedback = False  # DGC keeps its own accumulation
        self.feedback: ErrorFeedback | None = ErrorFeedback() if error_feedback else None
        self._ordinals: dict[tuple[Any, ...], int] = {}

    def __repr__(self) -> str:
        return f"Compressor({self.spec!r}, error_feedback={self.feedback is not None})"

    @staticmethod
    def takes(tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is compressed (dense-layout floats); others go through the exact codec."""
        return tensor.layout == torch.strided and tensor.dtype in _FLOATS

    def key_for(self, tensor: torch.Tensor) -> tuple[Any, ...]:
        """A portable key for a caller that has none (a process group): ``(numel, dtype, ordinal)``,
        the ordinal counting distinct storages of that size (DDP's bucket buffers are persistent)."""
        base = (tensor.numel(), str(tensor.dtype))
        ptr = (*base, tensor.untyped_storage().data_ptr())
        if ptr not in self._ordinals:
            self._ordinals[ptr] = sum(1 for p in self._ordinals if p[:2] == base)
        return (*base, self._ordinals[ptr])

    # ------------------------------------------------------------------ the two halves
    def compress(self, g: torch.Tensor, key: Hashable = None, ctx: Context = Context()) -> tuple[torch.Tensor, torch.Tensor]:
        """``(v, y)``: the flat input plus residual, and what the stages make of it (no aggregation)."""
        flat = g.reshape(-1)
        v = self.feedback.add(flat, key) if self.feedback is not None else flat
        y = self.stage(v, key, ctx) if self.stage is not None else v
        return v, y

    def allreduce(self, tensor: torch.Tensor, port: SwitchPort, *, key: Hashable = None, scheme: str = "auto",
                  stats: WorkerStats | None = None, history: History | None = None, **codec: Any) -> torch.Tensor:
        """SUM over the workers of ``port`` of this worker's compressed ``tensor``, written in place.

        ``codec`` are :func:`homagg.allreduce` options (``config=CodecConfig(...)`` or its fields).
        """
        from ..codec._protocol import allreduce

        stats = stats if stats is not None else WorkerStats()
        if not self.takes(tensor):
            return allreduce(tensor, port, scheme=scheme, stats=stats, inplace=True, history=history, **codec)
        # The codec's history must be looked up alike on every rank: a caller's key is, a storage
        # ordinal (key_for) need not be (after DDP's bucket rebuild one rank's allocator may hand an
        # old address back, another's not); then the slot is (numel, dtype) alone, in call order.
        history_key = ("homagg.compress", key) if key is not None else ("homagg.compress",)
        if key is None:
            key = self.key_for(tensor)
        v, y = self.compress(tensor, key, Context(port.rank, port.world_size))
        if self.quantizer is None:
            own = y
            total = allreduce(y, port, scheme=scheme, stats=stats, history=history, key=history_key, **codec)
        else:
            stats.calls += 1
            gen = quantized_protocol(y, self.quantizer, port.rank, port.world_size, key, stats, history)
            try:
                streams = next(gen)
                while True:
                    streams = gen.send(port.combine(streams))
            except StopIteration as done:
                total64, own64 = done.value
            total, own = total64.to(tensor.dtype), own64.to(v.dtype)
        if self.feedback is not None:
            self.feedback.keep(v, own, key)
        with torch.no_grad():
            tensor.copy_(total.view(tensor.shape))
        return tensor

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume bit for bit (tensors cloned, on their devices)."""
        return {
            "spec": self.spec,
            "stage": self.stage.state_dict() if self.stage is not None else None,
            "quantizer": self.quantizer.state_dict() if self.quantizer is not None else None,
            "feedback": self.feedback.state_dict() if self.feedback is not None else None,
            "ordinals": [[list(k), v] for k, v in self._ordinals.items()],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or state.get("spec") != self.spec:
            got = state.get("spec") if isinstance(state, Mapping) else type(state).__name__
            raise ConfigError(f"state dict of compressor {got!r} does not fit {self.spec!r}")
        for part, obj in (("stage", self.stage), ("quantizer", self.quantizer), ("feedback", self.feedback)):
            if obj is not None:
                obj.load_state_dict(state[part])
        self._ordinals = {tuple(k): int(v) for k, v in state.get("ordinals", [])}


def from_spec(spec: str | None) -> Compressor | None:
    """A :class:`Compressor` for ``spec``, or ``None`` when it means no compression (the default)."""
    return None if parse(spec) is None else Compressor(spec)
