"""CUDA tensors through the homagg backend: encoded on the device, results land in place."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import launch  # noqa: E402


@pytest.mark.gpu
def test_cuda_allreduce_and_ddp() -> None:
    results, _ = launch("gpu.py", 2, timeout=240)
    for rank, res in enumerate(results):
        for name, value in res.items():
            assert not (isinstance(value, str) and value.startswith("FAILED")), f"rank {rank} {name}: {value}"
