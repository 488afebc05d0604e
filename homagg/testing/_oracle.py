"""Reference computations (part of :mod:`homagg.testing`): exact sums and the documented error bound.

Invariants:

* :func:`exact_sum` never rounds for the inputs homagg accepts: float inputs are summed in
  float64 (exact for float32/float16/bfloat16 and up to 2**29 workers: 24 + 29 < 53 bits), integer
  inputs in int64 (exact while the sum fits in int64).
* :func:`error_bound` is README's bound, per element of the flattened tensor:
  ``|result - exact| <= W * 2**-22 * M`` with ``M`` the max ``|x|`` over the element's block
  (``block_size``) and all workers; below 24 precision bits (``W > 128``) the bound widens to the
  fixed-point grid; float16/bfloat16 outputs add their own rounding; integers must be equal (0).
* :func:`check_within_bound` raises :class:`BoundExceededError` (a :class:`homagg.HomAggError`),
  never ``AssertionError``: it works the same under ``python -O`` and outside pytest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from .._errors import HomAggError
from ..codec._fixedpoint import precision_bits

__all__ = [
    "HarnessError",
    "BoundExceededError",
    "ResultMismatchError",
    "WorkerFailedError",
    "exact_sum",
    "block_max",
    "error_bound",
    "within_bound",
    "check_within_bound",
    "digest",
]


class HarnessError(HomAggError):
    """A check of :mod:`homagg.testing` failed (the result is wrong, or a worker failed)."""


class BoundExceededError(HarnessError):
    """A result lies outside the documented error bound of the exact sum.

    ``count`` elements are outside; ``worst_index`` (flat) exceeds its bound by ``worst_excess``.
    """

    def __init__(self, count: int, worst_index: int, worst_excess: float, numel: int) -> None:
        super().__init__(f"{count} of {numel} elements outside the bound; worst excess {worst_excess:g} "
                         f"at flat index {worst_index}")
        self.count, self.worst_index, self.worst_excess, self.numel = count, worst_index, worst_excess, numel


class ResultMismatchError(HarnessError):
    """Results that must be identical (across workers, schemes, or vs a reference) are not."""


class WorkerFailedError(HarnessError):
    """A worker process of a job raised or died; ``failures`` holds its ``RankFailure`` records."""

    def __init__(self, failures: Sequence[object]) -> None:
        first = failures[0]
        super().__init__(f"{len(failures)} worker(s) failed; first: rank {getattr(first, 'rank', '?')} "
                         f"{getattr(first, 'type', '?')}: {getattr(first, 'message', first)}\n"
                         f"{getattr(first, 'traceback', '')}")
        self.failures = list(failures)


def exact_sum(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Elementwise sum over workers, unrounded: float64 for float inputs, int64 for integer inputs."""
    if not tensors:
        raise HarnessError("exact_sum needs at least one tensor")
    wide = torch.float64 if tensors[0].dtype.is_floating_point else torch.int64
    return torch.stack([t.to(wide) for t in tensors]).sum(0)


def block_max(tensors: Sequence[torch.Tensor], block_size: int = 1024) -> torch.Tensor:
    """Per element of the flattened tensors: max ``|x|`` over its block and all workers (float64)."""
    flat = torch.stack([t.reshape(-1).to(torch.float64).abs() for t in tensors]).amax(0)
    n = flat.numel()
    if n == 0:
        return flat
    blocks = torch.nn.functional.pad(flat, (0, (-n) % block_size)).reshape(-1, block_size).amax(1)
    return blocks.repeat_interleave(block_size)[:n]


def error_bound(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None, block_size: int = 1024,
                divisor: int = 1) -> torch.Tensor:
    """Per-element bound (float64, flat) on ``|result - exact_sum / divisor|`` for a result of ``dtype``.

    ``divisor`` is the world size for an average (``ReduceOp.AVG``: the sum divided in ``dtype``,
    which adds one rounding of the output dtype).  ``dtype`` defaults to the inputs' dtype.
    """
    dtype = dtype or tensors[0].dtype
    n = tensors[0].numel()
    if not dtype.is_floating_point:
        return torch.zeros(n, dtype=torch.float64)
    w, p = len(tensors), precision_bits(len(tensors))
    m = block_max(tensors, block_size)
    bound = w * 2.0**-22 * m if p >= 24 else w * (2.0 ** (1 - p) + 2.0**-24) * m
    exact = exact_sum(tensors).reshape(-1).abs()
    if dtype in (torch.float16, torch.bfloat16):
        bound = w * 2.0 ** (1 - p) * m + exact * torch.finfo(dtype).eps
        bound = torch.clamp(bound, min=torch.finfo(dtype).smallest_normal)
    if divisor != 1:
        bound = bound / divisor + exact / divisor * torch.finfo(dtype).eps
    return bound


def _excess(result: torch.Tensor, tensors: Sequence[torch.Tensor], block_size: int, divisor: int) -> torch.Tensor:
    if tuple(result.shape) != tuple(tensors[0].shape):
        raise ResultMismatchError(f"result shape {tuple(result.shape)} != input shape {tuple(tensors[0].shape)}")
    exact = exact_sum(tensors).reshape(-1)
    flat = result.reshape(-1)
    if not result.dtype.is_floating_point:
        if divisor != 1:
            raise HarnessError("integer results are sums: divisor must be 1")
        return (flat.to(torch.int64) != exact).to(torch.float64)
    err = (flat.to(torch.float64) - exact.to(torch.float64) / divisor).abs()
    return err - error_bound(tensors, result.dtype, block_size, divisor)


def within_bound(result: torch.Tensor, tensors: Sequence[torch.Tensor], block_size: int = 1024,
                 divisor: int = 1) -> bool:
    """True iff every element of ``result`` is within :func:`error_bound` (integers: equal)."""
    return not bool((_excess(result, tensors, block_size, divisor) > 0).any())


def check_within_bound(result: torch.Tensor, tensors: Sequence[torch.Tensor], block_size: int = 1024,
                       divisor: int = 1) -> None:
    """Raise :class:`BoundExceededError` unless :func:`within_bound` holds."""
    excess = _excess(result, tensors, block_size, divisor)
    bad = excess > 0
    if bool(bad.any()):
        worst = int(excess.argmax())
        raise BoundExceededError(int(bad.sum()), worst, float(excess[worst]), excess.numel())


def digest(tensors: Sequence[torch.Tensor]) -> str:
    """SHA-256 over the raw bytes of ``tensors`` (in order): equal digests mean bit-identical results."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
