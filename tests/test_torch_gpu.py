"""CUDA tensors through the homagg backend: encoded on the device, results land in place.

The rank script (``tests/_dist_scripts/gpu.py``) returns its results; the oracles are computed
here: the exact sum and README's error bound for the allreduce, the one-process replay of the
training (``_ddp_model.reference``, on the CPU) for DDP.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from homagg.testing import check_within_bound, error_bound

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _ddp_model import reference  # noqa: E402
from _launch import launch, make_input, tensor_from_json  # noqa: E402

WORLD = 2


@pytest.mark.gpu
def test_cuda_allreduce_and_ddp() -> None:
    results, _ = launch("gpu.py", WORLD, timeout=240)
    for rank, res in enumerate(results):
        for name, value in res.items():
            assert isinstance(value, dict), f"rank {rank} {name}: {value}"
    want_params = reference(WORLD, "basic")
    for rank, res in enumerate(results):
        got = res["allreduce_cuda"]
        assert got["device"] == got["expected_device"] and got["in_place"], got
        inputs = [make_input(r, got["input"]) for r in range(WORLD)]
        result, gloo = tensor_from_json(got["result"]), tensor_from_json(got["gloo_result"])
        check_within_bound(result, inputs)
        assert bool(((result - gloo).abs() <= error_bound(inputs)).all()), "homagg vs gloo beyond the bound"
        params = tensor_from_json(res["ddp_cuda"]["params"])
        assert res["ddp_cuda"]["device"] == str(got["expected_device"])
        err = float((params - want_params).abs().max())
        assert err <= 1e-5, f"rank {rank}: max |CUDA DDP - one-process replay| = {err}"
        gloo_err = float((params - tensor_from_json(res["ddp_cuda_gloo"]["params"])).abs().max())
        assert gloo_err <= 1e-5, f"rank {rank}: max |homagg CUDA DDP - gloo CUDA DDP| = {gloo_err}"
