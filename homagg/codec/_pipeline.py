"""A large tensor streams through the switch in segments while earlier segments encode and decode.

The flat tensor is cut into segments of ``cfg.segment`` elements (a multiple of the exponent
block, so every block lies in one segment and has the same exponent as without segments).  Each
segment runs its own protocol (:func:`homagg.codec._schemes.run`).  One transport thread calls
``port.combine`` for the submitted rounds, strictly in submission order; the calling thread
encodes segment ``s + 1`` and decodes segment ``s - 1`` while the transport thread moves segment
``s`` (torch ops and socket calls release the GIL).

Invariants:

* Every worker submits rounds in the same order: the schedule (launch a segment while fewer than
  ``DEPTH`` are in flight, else advance the oldest) depends only on how many rounds each segment
  takes, which every worker agrees on (those decisions come from combined words).
* Nothing is sent before every segment's input passed the checks (NaN/Inf, dtype): all
  segments' :class:`~homagg.codec._worker.Worker` objects are built and prepared
  (:func:`homagg.codec._schemes.prepare`) first.
* Results are bit-identical to the unsegmented call (same block exponents; exact integer sums).
* Every wait is bounded: a round's future completes when ``port.combine`` returns or raises (the
  port's own timeout); on any error the pending rounds are cancelled and the error propagates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ._config import CodecConfig, check_scheme
from ._history import History
from ._schemes import Protocol, prepare, run
from ._stats import WorkerStats
from ._worker import Worker
from ..transport import SwitchPort

__all__ = ["DEPTH", "HOST_SEGMENT", "segment_length", "allreduce_segments"]

DEPTH = 3  #: segments in flight: rounds of two on the wire (or at the switch) while the caller encodes/decodes a third


HOST_SEGMENT = 1 << 23  #: elements per segment of a CPU tensor when ``cfg.segment`` is None


def segment_length(numel: int, cfg: CodecConfig, host: bool = True) -> int:
    """Elements per segment (a multiple of the block size), or 0 when the tensor is one segment;
    ``host``: whether the tensor is a CPU tensor (``cfg.segment`` None segments only those)."""
    segment = cfg.segment if cfg.segment is not None else (HOST_SEGMENT if host else 0)
    seg = segment // cfg.block_size * cfg.block_size
    return seg if 0 < seg < numel else 0


def allreduce_segments(flat: torch.Tensor, port: SwitchPort, scheme: str, cfg: CodecConfig, stats: WorkerStats,
                       history: History | None, key: Hashable, seg: int) -> None:
    """SUM-allreduce contiguous 1-D ``flat`` in place, ``seg`` elements per segment, pipelined."""
    check_scheme(scheme)
    workers = [Worker(flat[i:i + seg], port.world_size, cfg, inplace=True) for i in range(0, flat.numel(), seg)]
    for i, w in enumerate(workers):
        prepare(w, scheme, history, (key, i, len(workers)))
    stats.segments += len(workers)
    inflight: deque[tuple[Protocol, Future[list[torch.Tensor]]]] = deque()
    transport = ThreadPoolExecutor(max_workers=1, thread_name_prefix="homagg-transport")
    try:
        for i, w in enumerate(workers):
            while len(inflight) >= DEPTH:
                _advance(inflight, transport, port)
            gen = run(w, scheme, stats, history, (key, i, len(workers)))
            try:
                inflight.append((gen, transport.submit(port.combine, next(gen))))
            except StopIteration:
                pass  # a protocol that needed no round
        while inflight:
            _advance(inflight, transport, port)
    finally:
        transport.shutdown(wait=False, cancel_futures=True)


def _advance(inflight: deque[tuple[Protocol, Future[list[torch.Tensor]]]], transport: ThreadPoolExecutor,
             port: SwitchPort) -> None:
    """Feed the oldest segment its combined round; queue its next round (at the back) if any."""
    gen, fut = inflight.popleft()
    try:
        streams = gen.send(fut.result())
    except StopIteration:
        return
    inflight.append((gen, transport.submit(port.combine, streams)))
