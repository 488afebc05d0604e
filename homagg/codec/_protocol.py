"""Run a worker protocol against a switch port: the one entry point every front end uses."""

from __future__ import annotations

from collections.abc import Hashable
from functools import cache
from typing import Any

import torch

from . import _hostops, _mid, _small
from ._config import CodecConfig, check_scheme
from ._history import History
from ._pipeline import allreduce_segments, segment_length
from ._schemes import drive
from ._stats import WorkerStats
from ._worker import Worker
from ..transport import SwitchPort

__all__ = ["allreduce"]


def allreduce(
    tensor: torch.Tensor,
    port: SwitchPort,
    *,
    scheme: str = "auto",
    stats: WorkerStats | None = None,
    config: CodecConfig | None = None,
    inplace: bool = False,
    history: History | None = None,
    key: Hashable = None,
    **options: Any,
) -> torch.Tensor:
    """Exact homomorphic SUM of ``tensor`` over the workers behind ``port``.

    Returns a new tensor of the same shape, dtype and device (for a sparse COO input, a coalesced
    COO tensor of the same layout; its nonzeros travel, never a dense copy).  Floats are summed on the agreed
    fixed-point grid (error bound in :mod:`homagg.codec._fixedpoint`); integers exactly.  Every rank
    gets the same bits.  Every scheme gives bit-identical results on a first call and with
    ``guess_window=False``; a steady call under the default guess window may sum on a grid up to
    ``slack`` bits coarser where dense and sketch quantise under the guess and compact does not
    (docs/design.md, "The guess window").  ``options`` are :class:`CodecConfig` fields (or pass ``config``).
    Raises :class:`NonFiniteError` before sending anything if the input holds NaN/Inf.

    ``history`` (one :class:`History` per worker, used by every worker the same way) lets a
    call with the same ``key``, numel and dtype as an earlier one skip the exponent round: dense
    and sketch then take one round (plus a rare redo/repair round), compact two.  The result is
    bit-identical with or without history.

    A dense tensor of at most one block (``block_size`` elements) takes the small-call path
    (:mod:`homagg.codec._small`: the dense protocol in scalar arithmetic, two datagrams per round;
    bit-identical results; ``small_calls=False`` turns it off).  A steady dense call of a float32
    CPU tensor of up to 256K elements, in place, runs the same round without the general path's
    per-call set-up (:mod:`homagg.codec._mid`; the same words, results and history).

    A dense-layout tensor larger than ``segment`` elements (by default: a CPU tensor larger than
    2**23) streams through the switch in segments, encoding and decoding overlapped with the
    transfer (:mod:`homagg.codec._pipeline`).
    """
    cfg = config if config is not None else (CodecConfig.from_options(options) if options else _default_config())
    stats = stats if stats is not None else WorkerStats()
    stats.calls += 1
    if _small.takes(tensor, scheme, cfg, port.world_size):  # one block: scalar arithmetic, one datagram per op
        return _small.allreduce(tensor, port, scheme, cfg, stats, inplace, history, key)
    if cfg.small_calls and _stages_on_host(tensor):
        return _hostops.on_host_copy(tensor, inplace,
                                     lambda host: _allreduce(host, port, scheme, cfg, stats, True, history, key))
    return _allreduce(tensor, port, scheme, cfg, stats, inplace, history, key)


def _stages_on_host(tensor: torch.Tensor) -> bool:
    """Whether a device tensor's call runs on a host copy: dense, of more than one block and at
    most :data:`~homagg.codec._mid.MAX_ELEMENTS` (the small path copies its own).  Its words
    cross to the host for the network anyway; a copy there and back of at most 1 MiB costs less
    than the device path's kernels and synchronisations, and the host path's results are the
    device path's, bit for bit (``tests/test_gpu_codec.py``).  The history then holds host
    exponents for these sizes whatever the tensor's device."""
    return tensor.layout == torch.strided and tensor.device.type != "cpu" and tensor.numel() <= _mid.MAX_ELEMENTS


def _allreduce(tensor: torch.Tensor, port: SwitchPort, scheme: str, cfg: CodecConfig, stats: WorkerStats,
               inplace: bool, history: History | None, key: Hashable) -> torch.Tensor:
    """:func:`allreduce` past the small path and the host copy."""
    if inplace and cfg.small_calls and _mid.allreduce(tensor, port, scheme, cfg, stats, history, key):
        return tensor  # a steady dense call of a float32 CPU tensor, without the general path's set-up
    layout = tensor.layout
    seg = segment_length(tensor.numel(), cfg, _hostops.reads_free(tensor)) if layout == torch.strided else 0
    if seg:  # large dense-layout tensor: pipelined segments, written in place into ``out``
        out = tensor if inplace and tensor.is_contiguous() else tensor.detach().clone(memory_format=torch.contiguous_format)
        allreduce_segments(out.view(-1), port, scheme, cfg, stats, history, key, seg)
        return tensor.copy_(out) if inplace and out is not tensor else out
    check_scheme(scheme)  # :func:`homagg.codec._schemes.protocol`, driven on ``port`` (no generator of its own)
    flat = drive(Worker(tensor, port.world_size, cfg, inplace), port, scheme, stats, history, key)
    if layout == torch.sparse_coo:  # a coalesced COO result of the input's layout
        return tensor.copy_(flat) if inplace else flat
    if inplace:
        if flat is not tensor and flat.data_ptr() != tensor.data_ptr():  # a 1-D input is its own result
            tensor.copy_(flat.reshape(tensor.shape))
        return tensor
    return flat.reshape(tensor.shape)


@cache
def _default_config() -> CodecConfig:
    """``CodecConfig()`` (frozen: one instance serves every call that passes no options)."""
    return CodecConfig()
