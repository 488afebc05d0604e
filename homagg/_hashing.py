"""Integer hashing with tensor ops (any device) and a MAX-mergeable HyperLogLog.

All arithmetic stays below 2**63 in int64 (32-bit state, multipliers < 2**31), so results are
identical on CPU and CUDA and never depend on signed-overflow behaviour.
"""

from __future__ import annotations

import math

import torch

__all__ = ["mix32", "hll_registers", "hll_estimate"]

_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A 32-bit avalanche hash of int64 ``x`` (values in [0, 2**32)) under ``seed``."""
    h = ((x ^ (x >> 32)) ^ (seed * 0x9E3779B1 & _M32)) & _M32
    h = ((h ^ (h >> 16)) * 0x045D9F3B) & _M32
    h = ((h ^ (h >> 16)) * 0x045D9F3B) & _M32
    return h ^ (h >> 16)


def hll_registers(idx: torch.Tensor, registers: int, seed: int) -> torch.Tensor:
    """HyperLogLog registers (int32, combine with MAX) of the set of positions ``idx``."""
    out = torch.zeros(registers, dtype=torch.int32, device=idx.device)
    if idx.numel() == 0:
        return out
    bits = registers.bit_length() - 1
    h = mix32(idx, seed)
    reg = h & (registers - 1)
    rest = h >> bits  # 32 - bits bits
    width = 32 - bits
    lz_plus_one = width - (torch.frexp(rest.to(torch.float64)).exponent.to(torch.int64) - 1)
    rank = torch.where(rest == 0, torch.full_like(rest, width + 1), lz_plus_one)
    out.scatter_reduce_(0, reg, rank.to(torch.int32), reduce="amax")
    return out


def hll_estimate(registers: torch.Tensor) -> float:
    """Cardinality estimate from merged registers (standard bias constants, small-range correction)."""
    m = registers.numel()
    alpha = 0.7213 / (1 + 1.079 / m)
    regs = registers.to(torch.float64)
    raw = alpha * m * m / float(torch.exp2(-regs).sum())
    zeros = int((registers == 0).sum())
    if raw <= 2.5 * m and zeros:
        return m * math.log(m / zeros)
    return raw
