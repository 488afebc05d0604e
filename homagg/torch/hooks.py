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
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at run time
# (``bucket`` must be annotated with the class ``dist.GradBucket``, not a string).
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
        return _compressed(state, buffer, bucket.index())
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    work = state.group.allreduce([buffer], opts)
    return work.get_future().then(lambda fut: fut.value()[0])


def _compressed(state: State, buffer: torch.Tensor, index: int) -> torch.futures.Future[torch.Tensor]:
    """The bucket's compressed SUM / W, run on the homagg group's FIFO worker (same order on every rank)."""
    group = state.group
    size = group.size()

    def task() -> list[torch.Tensor]:
        state.compressor.allreduce(buffer, group.switch.port, key=("bucket", index), scheme=group.config.scheme,
                                   stats=group.stats, history=group.history, config=group._codec)
        buffer.div_(size)
        return [buffer]

    work = group._submit("allreduce", task)
    return work.get_future().then(lambda fut: fut.value()[0])
