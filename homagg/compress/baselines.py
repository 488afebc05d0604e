"""The classic, non-homomorphic quantisers as DDP comm hooks over gloo: each worker its own scale.

These are the baselines of ``homagg bench compress``: 1-bit with error feedback, TernGrad and QSGD
exactly as published, where every worker quantises with its *own* per-block scale (mean |x|,
max |x|, L2 norm; not rounded to a grid), so codes of different workers cannot be added; every
worker all-gathers everybody's codes (uint8) and scales (float64) and decodes W contributions.
Compare :class:`homagg.compress.Compressor`, where the scale is shared and the switch adds codes.

::

    state = OwnScaleState("terngrad")
    ddp.register_comm_hook(state, own_scale_hook)       # on a gloo process group

``state.bytes_sent`` counts what this worker sent (ring all-gather: W-1 copies of its message).
Invariant: every worker computes the same average (same gathered codes, same decode order).
"""

# No ``from __future__ import annotations``: DDP checks a hook's annotations at run time.
from typing import Any

import torch
import torch.distributed as dist

from .._errors import ConfigError
from ._base import ErrorFeedback, generator
from ._compressor import build_quantizer
from ._homomorphic import _blocks_of
from ._spec import parse

__all__ = ["OwnScaleState", "own_scale_hook"]


class OwnScaleState:
    """Options and per-bucket state of :func:`own_scale_hook` (a quantiser spec, e.g. ``"onebit"``)."""

    def __init__(self, spec: str, process_group: Any = None) -> None:
        stages = parse(spec)
        if not stages or len(stages) != 1 or not stages[0].is_quantizer:
            raise ConfigError(f"own-scale baseline needs one quantiser spec (onebit, twobit, terngrad, qsgd), got {spec!r}")
        self.q = build_quantizer(stages[0])
        self.feedback = ErrorFeedback() if stages[0].params["ef"] else None
        self.group = process_group
        self.bytes_sent = 0

    def reduce(self, buf: torch.Tensor, key: Any) -> torch.Tensor:
        """Average of the workers' own-scale quantised ``buf`` (flat), computed on every worker."""
        q, group = self.q, self.group
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        v = self.feedback.add(buf, key) if self.feedback is not None else buf
        x, counts = _blocks_of(v, q.block)
        s = q.local_scale(x, counts).unsqueeze(1)
        noise = None
        if q.stochastic:
            gen = generator(buf.device, "own", q.name, q.seed, str(key), q.next_step(key), rank)
            noise = torch.rand(x.shape, dtype=torch.float64, device=buf.device, generator=gen)
        u = q.codes(x, s, noise).to(torch.uint8 if q.umax < 256 else torch.int32)
        if self.feedback is not None:
            self.feedback.keep(v, q.values(u.to(torch.int64), s).reshape(-1)[: buf.numel()].to(v.dtype), key)
        codes = torch.empty(world * u.numel(), dtype=u.dtype, device=u.device)
        scales = torch.empty(world * s.numel(), dtype=s.dtype, device=s.device)
        dist.all_gather_into_tensor(codes, u.reshape(-1).contiguous(), group=group)
        dist.all_gather_into_tensor(scales, s.reshape(-1).contiguous(), group=group)
        codes, scales = codes.view(world, *u.shape), scales.view(world, *s.shape)
        self.bytes_sent += (world - 1) * (u.numel() * u.element_size() + s.numel() * s.element_size())
        total = sum(q.values(codes[w].to(torch.int64), scales[w]) for w in range(world))
        return (total.reshape(-1)[: buf.numel()] / world).to(buf.dtype)


def own_scale_hook(state: OwnScaleState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's average through own-scale quantisation and a gloo all-gather."""
    buf = bucket.buffer()
    buf.copy_(state.reduce(buf, ("bucket", bucket.index())))
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buf)
    return fut
