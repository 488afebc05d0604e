"""DDP communication hook: homagg aggregation for users who keep another backend.

::

    import homagg.torch.hooks as hh
    ddp = DistributedDataParallel(model)                  # on a gloo / nccl process group
    ddp.register_comm_hook(hh.State(scheme="auto"), hh.allreduce_hook)

:class:`State` validates its options once and creates (collectively: every rank of the DDP group
must construct it, in the same order) a private ``homagg`` process group over the same ranks; the
hook sends each gradient bucket through it and returns the average.  Only DDP's buckets are
covered (one comm hook per model); other collectives keep using the original backend.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations at run time
# (``bucket`` must be annotated with the class ``dist.GradBucket``, not a string).
from collections.abc import Mapping
from dataclasses import dataclass, field
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
    of :func:`homagg.allreduce`.  After construction ``group`` is a homagg process group.
    """

    scheme: Optional[str] = None
    switch: Optional[str] = None
    timeout: Optional[float] = None
    process_group: Optional[dist.ProcessGroup] = None
    codec: Mapping[str, Any] = field(default_factory=dict)
    group: dist.ProcessGroup = field(init=False, repr=False)
    config: BackendConfig = field(init=False)

    def __post_init__(self) -> None:
        if not dist.is_initialized():
            raise ConfigError("homagg.torch.hooks.State needs torch.distributed to be initialised first")
        options: dict[str, Any] = {"codec": dict(self.codec)}
        for key in ("scheme", "switch", "timeout"):
            if getattr(self, key) is not None:
                options[key] = getattr(self, key)
        self.config = BackendConfig.resolve(options)
        register()
        base = self.process_group if self.process_group is not None else dist.group.WORLD
        if dist.get_backend(base) == BACKEND_NAME:
            self.group = base
        else:
            ranks = dist.get_process_group_ranks(base)
            self.group = dist.new_group(ranks=ranks, backend=BACKEND_NAME, pg_options=self.config)


def allreduce_hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s flat gradient over ``state.group`` through homagg (in place)."""
    buffer = bucket.buffer()
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    work = state.group.allreduce([buffer], opts)
    return work.get_future().then(lambda fut: fut.value()[0])
