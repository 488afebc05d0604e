"""Reference computations the codec tests compare against (float64 sums, per-block bounds)."""

from __future__ import annotations

import torch

from homagg._fixedpoint import precision_bits


def exact_sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """float64 sum (exact for float32 inputs up to 2**29 workers: 24+29 < 53 bits... per element)."""
    return torch.stack([t.to(torch.float64) for t in tensors]).sum(0)


def block_max(tensors: list[torch.Tensor], block_size: int = 1024) -> torch.Tensor:
    """Per element: max |x| over its block and all workers (float64, flat)."""
    flat = torch.stack([t.reshape(-1).abs().to(torch.float64) for t in tensors]).amax(0)
    n = flat.numel()
    if n == 0:
        return flat
    pad = (-n) % block_size
    blocks = torch.nn.functional.pad(flat, (0, pad)).reshape(-1, block_size).amax(1)
    return blocks.repeat_interleave(block_size)[:n]


def assert_within_bound(result: torch.Tensor, tensors: list[torch.Tensor], block_size: int = 1024) -> None:
    """The documented bound: |result - exact| <= W * 2**-22 * M (+ the output dtype's rounding)."""
    w = len(tensors)
    exact = exact_sum(tensors).reshape(-1)
    err = (result.reshape(-1).to(torch.float64) - exact).abs()
    m = block_max(tensors, block_size)
    bound = w * 2.0**-22 * m if precision_bits(w) >= 24 else w * (2.0 ** (1 - precision_bits(w)) + 2.0**-24) * m
    if result.dtype in (torch.float16, torch.bfloat16):
        bound = w * 2.0 ** (1 - precision_bits(w)) * m + exact.abs() * torch.finfo(result.dtype).eps
        bound = torch.maximum(bound, torch.full_like(bound, torch.finfo(result.dtype).smallest_normal))
    bad = err > bound
    assert not bool(bad.any()), f"{int(bad.sum())} elements outside the bound; worst excess {float((err - bound).max())}"
