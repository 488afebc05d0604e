"""Compression through the DDP comm hook (``State(compress=...)``, ``HOMAGG_COMPRESS``): 2 ranks on
gloo with the switch emulated over gloo; ranks agree, bytes shrink, checkpoints resume bit for bit.

This file is also the rank script (``python tests/test_compress_hook.py SPEC``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MARK = "@compress-hook@"


def rank_main(spec: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import homagg.torch.hooks as hh

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def make() -> tuple[nn.Module, DDP, torch.optim.Optimizer, hh.State]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        ddp = DDP(model)
        # compact: on a model this small auto rightly picks dense (latency-bound), hiding the sparsity
        state = hh.State(switch="gloo", scheme="compact", compress=None if spec == "env" else spec)
        ddp.register_comm_hook(state, hh.allreduce_hook)
        return model, ddp, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), state

    def train(ddp: DDP, opt: torch.optim.Optimizer, steps: range) -> None:
        for step in steps:
            gen = torch.Generator().manual_seed(100 * step + rank)
            x, y = torch.randn(32, 16, generator=gen), torch.randn(32, 4, generator=gen)
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()

    model, ddp, opt, state = make()
    train(ddp, opt, range(8))
    straight = [p.detach().clone() for p in model.parameters()]
    sent = state.group.stats.bytes_sent
    model, ddp, opt, state = make()
    train(ddp, opt, range(4))
    saved = (model.state_dict(), opt.state_dict(), state.compressor.state_dict())
    model, ddp, opt, state = make()
    model.load_state_dict(saved[0])
    opt.load_state_dict(saved[1])
    state.compressor.load_state_dict(saved[2])
    train(ddp, opt, range(4, 8))
    resumed = [p.detach().clone() for p in model.parameters()]
    record = {"spec": state.compressor.spec, "bytes": sent, "numel": sum(p.numel() for p in straight),
              "equal_after_resume": all(torch.equal(a, b) for a, b in zip(straight, resumed)),
              "digest": float(sum(p.double().sum() for p in straight))}
    dist.destroy_process_group()
    print(MARK + json.dumps(record), flush=True)


@pytest.fixture(scope="module")
def runs() -> dict[str, list[dict]]:
    from homagg.bench._ranks import launch_ranks

    out: dict[str, list[dict]] = {}
    for spec in ("topk:0.05", "onebit", "env"):
        env = dict(os.environ, PYTHONPATH=str(REPO), HOMAGG_COMPRESS="terngrad")
        lines = launch_ranks([sys.executable, __file__, spec], 2, label=f"compress hook {spec}",
                             stall_timeout=240, env=env)
        out[spec] = [json.loads(ln[len(MARK):]) for per in lines for ln in per if ln.startswith(MARK)]
    return out


@pytest.mark.parametrize("spec", ["topk:0.05", "onebit", "env"])
def test_hook_ranks_agree_and_resume_bit_exact(runs: dict[str, list[dict]], spec: str) -> None:
    recs = runs[spec]
    assert len(recs) == 2
    assert recs[0]["digest"] == recs[1]["digest"], "ranks ended with different parameters"
    assert all(r["equal_after_resume"] for r in recs), "resume from a checkpoint is not bit-exact"


def test_hook_compresses_and_env_selects(runs: dict[str, list[dict]]) -> None:
    dense = 8 * 4 * runs["topk:0.05"][0]["numel"]  # 8 steps of dense float32 words
    assert runs["topk:0.05"][0]["bytes"] < 0.5 * dense
    assert runs["onebit"][0]["bytes"] < 0.1 * dense  # 10 codes per word at W=2 (+ block scales)
    assert runs["env"][0]["spec"].startswith("terngrad:")  # HOMAGG_COMPRESS, State(compress=None)


if __name__ == "__main__":
    rank_main(sys.argv[1])
