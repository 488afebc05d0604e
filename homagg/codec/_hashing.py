"""Integer hashing with tensor ops (any device).

All arithmetic stays below 2**63 in int64 (32-bit state, multipliers < 2**31), so results are
identical on CPU and CUDA and never depend on signed-overflow behaviour.
"""

from __future__ import annotations

import torch

__all__ = ["mix32"]

_M32 = 0xFFFFFFFF


def mix32(x: torch.Tensor, seed: int) -> torch.Tensor:
    """A 32-bit avalanche hash of int64 ``x`` (values in [0, 2**32)) under ``seed``."""
    h = ((x ^ (x >> 32)) ^ (seed * 0x9E3779B1 & _M32)) & _M32
    h = ((h ^ (h >> 16)) * 0x045D9F3B) & _M32
    h = ((h ^ (h >> 16)) * 0x045D9F3B) & _M32
    return h ^ (h >> 16)
