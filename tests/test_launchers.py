"""The launchers users start homagg with, as a new user runs them (2 CPU ranks, real processes):
``torchrun`` (results against a float64 oracle), Lightning's ``DDPStrategy(process_group_backend=
"homagg")`` and Hugging Face's ``Trainer`` with ``init_process_group("homagg")`` before its
``TrainingArguments`` (the trained parameters against gloo's run of the same script), and that the
Trainer still refuses ``ddp_backend="homagg"`` as the page says.

Lightning, transformers and accelerate are the ``launchers`` extra (in ``test``); each test skips
with the reason where its package is missing.  The scripts are in ``tests/_dist_scripts``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "_dist_scripts"))
from _launch import REPO, SCRIPTS, entry_point_site, free_port  # noqa: E402

#: the switch's fixed-point error: at most W * 2**-22 * max|x| per element (docs/torch-backend.md)
WORLD = 2


def _env(tmp_path: Path) -> dict[str, str]:
    """The environment of an installed homagg: the ``torch.backends`` entry point declared (as a
    wheel declares it; added here when this checkout is not installed)."""
    env = dict(os.environ)
    paths = [str(REPO)]
    if not any(ep.name == "homagg" for ep in importlib.metadata.entry_points(group="torch.backends")):
        site = tmp_path / "site"
        site.mkdir(exist_ok=True)
        paths.append(str(entry_point_site(site)))
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")])
    for key in ("HOMAGG_SWITCH", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    return env


def _torchrun(tmp_path: Path) -> list[str]:
    """``torchrun`` as a user types it (the console script beside this Python), else its module."""
    script = Path(sys.executable).with_name("torchrun")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return [*head, "--nproc-per-node", str(WORLD), "--master-addr", "127.0.0.1", "--master-port", str(free_port())]


def _run(cmd: list[str], tmp_path: Path, timeout: float = 300) -> str:
    proc = subprocess.run(cmd, env=_env(tmp_path), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    return out


def test_torchrun_script_all_reduces_within_the_bound(tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    _run([*_torchrun(tmp_path), str(SCRIPTS / "launch_torchrun.py"), str(out_dir)], tmp_path)
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]
    inputs = []
    for r in range(WORLD):  # the script's inputs, regenerated
        g = torch.Generator().manual_seed(1000 + r)
        inputs.append((torch.randn(3000, generator=g), torch.randn(1, generator=g)))
    for key, i in (("vector", 0), ("metric", 1)):
        xs = [inp[i].double() for inp in inputs]
        exact = sum(xs)
        bound = WORLD * 2.0**-22 * max(float(x.abs().max()) for x in xs)
        for rank in ranks:
            got = torch.tensor(rank[key], dtype=torch.float64)
            assert float((got - exact).abs().max()) <= bound, (key, rank["backend"])
        assert ranks[0][key] == ranks[1][key]  # every rank the same result, bit for bit
    want = (torch.arange(10, dtype=torch.int64) * sum(range(1, WORLD + 1))).tolist()
    assert [r["counts"] for r in ranks] == [want] * WORLD  # integers exactly
    assert [(r["backend"], r["world"]) for r in ranks] == [("homagg", WORLD)] * WORLD


def _same_training(got: dict[str, Any], gloo: dict[str, Any]) -> None:
    """homagg's training followed gloo's: same steps, parameters within 1e-5 (a few fixed-point
    roundings of the gradients per step, W * 2**-22 of their magnitude each)."""
    assert got["steps"] == gloo["steps"] > 0
    for a, b in zip(got["params"], gloo["params"], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-5), (a[:4], b[:4])
    assert abs(got["loss"] - gloo["loss"]) <= 1e-5 * max(1.0, abs(gloo["loss"]))


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                    reason="lightning is not installed (pip install 'homagg[launchers]')")
def test_lightning_ddp_strategy_with_the_homagg_backend(tmp_path: Path) -> None:
    results = {}
    for backend in ("homagg", "gloo"):
        out = tmp_path / f"{backend}.json"
        log = _run([sys.executable, str(SCRIPTS / "launch_lightning.py"), backend, str(out)], tmp_path)
        results[backend] = json.loads(out.read_text())
        assert results[backend]["backend"] == backend, log[-3000:]
    _same_training(results["homagg"], results["gloo"])


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
                    reason="transformers or accelerate is not installed (pip install 'homagg[launchers]')")
def test_hf_trainer_with_a_homagg_group_made_first(tmp_path: Path) -> None:
    results = {}
    for mode in ("homagg", "gloo"):
        out = tmp_path / f"{mode}.json"
        log = _run([*_torchrun(tmp_path), str(SCRIPTS / "launch_hf_trainer.py"), mode, str(out)], tmp_path)
        results[mode] = json.loads(out.read_text())
        assert (results[mode]["backend"], results[mode]["world"]) == (mode, WORLD), log[-3000:]
    _same_training(results["homagg"], results["gloo"])


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
                    reason="transformers or accelerate is not installed (pip install 'homagg[launchers]')")
def test_hf_refuses_the_backend_by_name_as_documented(tmp_path: Path) -> None:
    """docs/torch-backend.md tells users to make the group first because Accelerate refuses
    ``ddp_backend="homagg"``: when a release accepts it, this fails and the page needs updating."""
    env = {**_env(tmp_path), "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    proc = subprocess.run([sys.executable, str(SCRIPTS / "launch_hf_refused.py")], env=env, cwd=str(tmp_path),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("REFUSED", "ACCEPTED"))]
    assert len(lines) == 2, proc.stdout + proc.stderr[-3000:]
    assert lines[0] == "REFUSED Your assigned backend homagg is not available, please use gloo", lines[0]
    assert lines[1] == "REFUSED by the command line" and "invalid choice: 'homagg'" in proc.stderr, proc.stderr[-2000:]
