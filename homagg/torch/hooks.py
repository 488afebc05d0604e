"""DDP communication hook: homagg aggregation for users who keep another backend.

::

    import homagg.torch.hooks as hh
    ddp = DistributedDataParallel(model)                  # on a gloo / nccl process group
    ddp.register_comm_hook(hh.State(scheme="auto"), hh.allreduce_hook)

:class:`State` validates its options once and creates (collectively: every rank of the DDP group
must construct it, in the same order) a private ``homagg`` process group over the same ranks; the
hook sends each gradient bucket through it and returns the average.  Only DDP's buckets are
covered (one comm hook per model); other collectives keep using the original backend.

Compression (:mod:`homagg.compress`, off by default): ``State(compress="topk:0.01")`` (or the
``HOMAGG_COMPRESS`` environment variable) compresses each bucket before the switch, with state
(error-feedback residuals, DGC momentum, step counters) kept per bucket index in
``state.compressor``; ``state.compressor.state_dict()`` checkpoints it for a bit-exact resume.
The bucket's compressed SUM is computed on the homagg group's worker thread (in call order on every
rank) and divided by the world size.

DDP lays a bucket out in parameter order for its first iteration, then rebuilds it in gradient-ready
order.  Per-element state must not depend on that layout, so the hook compresses the bucket's
gradients in a *canonical* order (parameters numbered on first sight, which is the same in a
resumed process) under a key naming the bucket's parameters.  Checkpoints therefore resume bit for
bit whenever the rebuild keeps each bucket's membership (always with one bucket; with several,
DDP may regroup parameters, and a compressor's choices depend on the group, e.g. top-k).
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at run time
# (``bucket`` must be annotated with the class ``dist.GradBucket``, not a string).
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch
import torch.distributed as dist

from .._errors import ConfigError
from ._backend import BACKEND_NAME, register
from ._config import BackendConfig

__all__ = ["State", "allreduce_hook"]


@dataclass
class State:
    """Options of :func:`allreduce_hook` and the homagg group it aggregates through.

    ``switch``/``scheme``/``timeout`` override ``HOMAGG_*`` environment variables (``None``: use
    them); ``process_group`` selects the ranks (default: the world); ``codec`` holds keyword options
    of :func:`homagg.allreduce`; ``compress`` is a :mod:`homagg.compress` spec (``None``: the
    ``HOMAGG_COMPRESS`` environment variable, else exact).  After construction ``group`` is a homagg
    process group and ``compressor`` a :class:`homagg.compress.Compressor` or ``None``.
    """

    scheme: Optional[str] = None
    switch: Optional[str] = None
    timeout: Optional[float] = None
    process_group: Optional[dist.ProcessGroup] = None
    codec: Mapping[str, Any] = field(default_factory=dict)
    compress: Optional[str] = None
    group: dist.ProcessGroup = field(init=False, repr=False)
    config: BackendConfig = field(init=False)
    compressor: Any = field(init=False, default=None)
    _ordinals: dict = field(init=False, default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not dist.is_initialized():
            raise ConfigError("homagg.torch.hooks.State needs torch.distributed to be initialised first")
        options: dict[str, Any] = {"codec": dict(self.codec)}
        for key in ("scheme", "switch", "timeout", "compress"):
            if getattr(self, key) is not None:
                options[key] = getattr(self, key)
        self.config = BackendConfig.resolve(options)
        if self.config.compress is not None:
            from ..compress import Compressor

            self.compressor = Compressor(self.config.compress)
        register()
        base = self.process_group if self.process_group is not None else dist.group.WORLD
        if dist.get_backend(base) == BACKEND_NAME:
            self.group = base
            if self.compressor is not None and getattr(base, "compressor", None) is not None:
                raise ConfigError("the homagg group already compresses (pg_options 'compress'); "
                                  "do not give State a compress spec as well")
        else:
            ranks = dist.get_process_group_ranks(base)
            # the group itself stays exact: the hook compresses (and keeps the per-bucket state)
            self.group = dist.new_group(ranks=ranks, backend=BACKEND_NAME,
                                        pg_options=replace(self.config, compress=None))


def allreduce_hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s flat gradient over ``state.group`` through homagg (in place)."""
    buffer = bucket.buffer()
    if state.compressor is not None:
        return _compressed(state, bucket)
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    work = state.group.allreduce([buffer], opts)
    return work.get_future().then(lambda fut: fut.value()[0])


def _canonical(state: State, bucket: dist.GradBucket) -> tuple[Any, list[torch.Tensor]]:
    """(key, the bucket's gradient views in canonical order): parameters numbered on first sight."""
    ords = [state._ordinals.setdefault(id(p), len(state._ordinals)) for p in bucket.parameters()]
    order = sorted(range(len(ords)), key=ords.__getitem__)
    grads = bucket.gradients()
    key = ("params", hashlib.blake2b(repr(sorted(ords)).encode(), digest_size=8).hexdigest())
    return key, [grads[i] for i in order]


def _compressed(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket's compressed SUM / W, run on the homagg group's FIFO worker (same order on every rank)."""
    group = state.group
    size = group.size()
    buffer = bucket.buffer()
    key, views = _canonical(state, bucket)

    def task() -> list[torch.Tensor]:
        flat = torch.cat([v.reshape(-1) for v in views]) if len(views) > 1 else buffer
        state.compressor.allreduce(flat, group.switch.port, key=key, scheme=group.config.scheme,
                                   stats=group.stats, history=group.history, config=group._codec)
        if flat is not buffer:
            at = 0
            for v in views:
                v.copy_(flat[at:at + v.numel()].view_as(v))
                at += v.numel()
        buffer.div_(size)
        return [buffer]

    work = group._submit("allreduce", task)
    return work.get_future().then(lambda fut: fut.value()[0])
