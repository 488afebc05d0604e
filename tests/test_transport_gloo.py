"""GlooSwitchPort: the switch contract over a private gloo group (threads, HashStore; no network element).

Oracle: :func:`homagg.transport.combine_words` of the same words; a peer that never calls makes
the gloo wait run out, which maps to :class:`~homagg.SwitchTimeoutError` (by waited time, not text).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from homagg import SwitchTimeoutError
from homagg.testing import check_combine, on_threads
from homagg.transport import CombineOp, GlooSwitchPort, Stream


def _groups(world: int, timeout_s: float) -> list[dist.ProcessGroup]:
    store = dist.HashStore()
    return on_threads(lambda r: dist.ProcessGroupGloo(store, r, world, timedelta(seconds=timeout_s)), world, 30.0)


def test_every_op_equals_the_reference() -> None:
    world, rng = 3, np.random.default_rng(5)
    ports = [GlooSwitchPort(pg, r, world, timeout_s=20.0) for r, pg in enumerate(_groups(world, 20.0))]
    ops = [CombineOp.ADD, CombineOp.MAX, CombineOp.OR, CombineOp.ADD]
    data = [[torch.from_numpy(rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)) for n in (50, 7, 13, 1)]
            for _ in range(world)]
    check_combine(ports, data, ops)


def test_missing_peer_is_a_switch_timeout() -> None:
    pgs = _groups(2, 1.0)
    port = GlooSwitchPort(pgs[0], 0, 2, timeout_s=1.0)
    with pytest.raises(SwitchTimeoutError, match=r"gloo switch emulation \(ADD of 4 words\): no answer within 1s"):
        port.combine([Stream("x", CombineOp.ADD, torch.ones(4, dtype=torch.int32))])
