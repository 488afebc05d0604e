"""``homagg bench models``: the model zoo (shapes, densities), the record merge, and a CI smoke.

The smoke runs ``homagg bench models --quick --bw 1000 --json OUT`` on rate-shaped namespaces
(root) and asserts only that records are well formed, every lossless method was exact and every
lossy one (PowerSGD, fp16, homagg-topk) is reported as not exact.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from homagg.bench._models import RECORD_FIELDS, _merge
from homagg.bench._models_out import markdown_table
from homagg.bench._models_rank import COMPRESS, LOSSY, METHODS
from homagg.bench._models_zoo import MODELS, density, spec
from homagg.cli import main

ROOT_AND_TOOLS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


# ------------------------------------------------------------------------------------------ zoo
@pytest.mark.parametrize("name", [*MODELS, "lstm-full"])
def test_quick_models_train_one_step(name: str) -> None:
    s = spec(name, quick=True)
    torch.manual_seed(0)
    model = s.build(False)
    batch = s.batch(torch.Generator().manual_seed(1), 3)
    loss = s.loss(model, batch)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())
    assert s.batch(torch.Generator().manual_seed(1), 3)[0].equal(batch[0])  # batches are seeded


def test_model_outputs_and_full_sizes() -> None:
    ncf = spec("ncf", quick=True).build(False)
    assert ncf(torch.tensor([0, 1, 2]), torch.tensor([3, 4, 5])).shape == (3,)
    vgg = spec("vgg19", quick=True).build(False)
    assert vgg(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert sum(isinstance(m, torch.nn.Conv2d) for m in vgg.modules()) == 16  # 16 conv + 3 fc = 19
    with torch.device("meta"):  # full sizes without allocating them
        bert = spec("bert").build(False)
        ncf_full = spec("ncf").build(False)
    assert bert.word.weight.shape == (30522, 768) and len(bert.encoder.layers) == 12
    assert 105e6 < sum(p.numel() for p in bert.parameters()) < 115e6  # BERT-base, ~110M
    assert ncf_full.gmf_user.num_embeddings == 138_493 and ncf_full.gmf_item.num_embeddings == 26_744


def test_sparse_variant_gives_sparse_embedding_gradients() -> None:
    for name in ("ncf", "lstm"):
        s = spec(name, quick=True)
        assert s.has_embeddings
        model = s.build(True)
        s.loss(model, s.batch(torch.Generator().manual_seed(0), 4)).backward()
        assert any(p.grad.is_sparse for p in model.parameters())
    assert not spec("vgg19", quick=True).has_embeddings and not spec("bert", quick=True).has_embeddings


def test_density_on_known_cases() -> None:
    g = torch.zeros(10, 4)
    g[2] = 1.0
    g[7, :2] = -3.0
    assert density(g) == pytest.approx(6 / 40)
    sparse = torch.sparse_coo_tensor(torch.tensor([[1, 1, 5]]), torch.ones(3, 4), (10, 4),
                                     check_invariants=True)  # row 1 twice (uncoalesced)
    assert density(sparse) == pytest.approx(8 / 40)
    assert density(torch.zeros(0)) == 0.0
    # an embedding looked up at k distinct rows has exactly k * dim nonzero gradient elements
    emb = torch.nn.Embedding(100, 8)
    emb(torch.tensor([3, 3, 50, 99])).sum().backward()
    assert density(emb.weight.grad) == pytest.approx(3 * 8 / 800)


def test_sampled_softmax_touches_only_sampled_rows() -> None:
    s = spec("lstm", quick=True)
    model = s.build(False)
    tokens, targets, sampled = s.batch(torch.Generator().manual_seed(0), 2)
    model(tokens, targets, sampled).backward()
    rows = torch.unique(torch.cat([targets.flatten(), sampled]))
    touched = model.out_embed.weight.grad.abs().sum(dim=1).nonzero().flatten()
    assert set(touched.tolist()) <= set(rows.tolist())
    assert density(model.out_embed.weight.grad) <= rows.numel() / model.vocab


def test_charlstm_is_a_small_dense_model_trained_with_adam() -> None:
    s = spec("charlstm")
    assert "charlstm" in MODELS and not s.has_embeddings  # no sparse variant
    torch.manual_seed(0)
    model = s.build(False)
    params = sum(p.numel() for p in model.parameters())
    print(f"charlstm: {params:,} parameters")
    assert 0.6e6 <= params <= 0.72e6  # ~0.66M
    assert model.embed.num_embeddings == model.decoder.out_features <= 100  # characters
    batch = s.batch(torch.Generator().manual_seed(1), s.batch_size)
    loss = s.loss(model, batch)
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and not p.grad.is_sparse and torch.isfinite(p.grad).all(), name
        assert density(p.grad) == 1.0, name  # every gradient dense, the embedding's too
    assert isinstance(s.optimizer(model.parameters()), torch.optim.Adam)
    assert all(isinstance(spec(n, quick=True).optimizer(model.parameters()), torch.optim.SGD)
               for n in MODELS if n != "charlstm")


def test_unknown_model_is_a_typed_error() -> None:
    from homagg import HomAggError

    with pytest.raises(HomAggError, match="unknown model"):
        spec("resnet50")


# ------------------------------------------------------------------------------------------ merge
def _line(method: str, times: list[float], digest: str = "p", within: bool = True) -> dict:
    return {"model": "ncf", "method": method, "summary": "s", "batch": 4, "params": 10, "times": times,
            "compute_times": [0.1, 0.1, 0.1], "bytes_per_iteration": 100.0, "bucket_numel": [30, 10],
            "bucket_density": [0.1, 0.5], "param_digest": digest, "bucket_digest": "b", "load_avg": [1.0, 1.0, 1.0],
            "within_bound": within, "max_abs_err": 0.0, "max_rel_err": 0.0}


def test_merge_takes_the_slowest_rank_and_checks_agreement() -> None:
    rec = _merge([_line("homagg", [0.3, 0.5, 0.4]), _line("homagg", [0.6, 0.2, 0.2])], 2, 1000.0, 3, {})
    assert rec["iteration_s"] == pytest.approx(0.5)  # median of (0.6, 0.5, 0.4)
    assert rec["comm_s"] == pytest.approx(0.4) and rec["compute_s"] == pytest.approx(0.1)
    assert rec["density"] == pytest.approx((30 * 0.1 + 10 * 0.5) / 40)
    assert rec["exact"] and rec["lossless"]
    for name, types in RECORD_FIELDS.items():
        assert isinstance(rec[name], types), name
    assert rec["cpu_load"] == 0  # no --cpu-load
    assert _merge([_line("gloo", [1.0] * 3)] * 2, 2, 1.0, 3, {}, cpu_load=2)["cpu_load"] == 2
    assert not _merge([_line("homagg", [1.0] * 3), _line("homagg", [1.0] * 3, "q")], 2, 1.0, 3, {})["exact"]
    assert not _merge([_line("homagg", [1.0] * 3, within=False)] * 2, 2, 1.0, 3, {})["exact"]
    lossy = _merge([_line("fp16", [1.0] * 3)] * 2, 2, 1.0, 3, {})
    assert not lossy["lossless"] and not lossy["exact"]
    assert _merge([_line("gloo", [1.0] * 3, within=False)] * 2, 2, 1.0, 3, {})["exact"]  # gloo: ranks agree


def test_compressed_homagg_is_lossy_by_design_and_the_table_says_so() -> None:
    from homagg.compress import from_spec

    assert METHODS["homagg-topk"] == ("homagg", False) and "homagg-topk" in LOSSY
    assert from_spec(COMPRESS["homagg-topk"]) is not None  # a valid spec of homagg.compress
    # ranks agree and the result is within the bound: still not exact (lossy by design)
    topk = _merge([_line("homagg-topk", [1.0] * 3)] * 2, 2, 1000.0, 3, {}, 9000)
    assert not topk["lossless"] and not topk["exact"] and topk["ranks_identical"]
    assert topk["compress"] == "topk:0.01" and topk["mtu"] == 9000 and topk["scheme"] == "auto"
    exact = _merge([_line("homagg", [1.0] * 3)] * 2, 2, 1000.0, 3, {}, 9000)
    differ = _merge([_line("fp16", [1.0] * 3), _line("fp16", [1.0] * 3, "q")], 2, 1000.0, 3, {}, 9000)
    table = markdown_table([exact, topk, differ]).splitlines()[2:]
    rows = {line.split("|")[4].strip(): line for line in table}
    assert "| no: lossy by design | n/a (ranks agree) |" in rows["homagg-topk (topk:0.01)"]
    assert "| yes | yes |" in rows["homagg"]
    assert "| no: lossy by design | n/a (ranks DIFFER) |" in rows["fp16"]


# ------------------------------------------------------------------------------------------ CLI
def test_without_root_it_says_what_it_needs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert main(["bench", "models", "--quick"]) != 0
    err = capsys.readouterr().err
    assert "needs root" in err and "--loopback" in err


@pytest.mark.skipif(not ROOT_AND_TOOLS, reason="needs root and iproute2 (ip, tc) for network namespaces")
def test_quick_smoke_on_shaped_links(tmp_path: Path) -> None:
    before = _namespaces()
    out = tmp_path / "records.json"
    rc = main(["bench", "models", "--quick", "--bw", "1000", "--json", str(out), "--out", str(tmp_path / "o"),
               "--timeout", "150"])
    assert rc == 0
    records = json.loads(out.read_text())["records"]
    pairs = {(r["model"], r["method"]) for r in records}
    assert pairs >= {(m, meth) for m in MODELS for meth in ("gloo", "homagg", "homagg-topk")}
    assert ("ncf", "homagg-sparse") in pairs and ("vgg19", "homagg-sparse") not in pairs
    for r in records:
        for name, types in RECORD_FIELDS.items():
            assert isinstance(r[name], types), (r["model"], r["method"], name, r[name])
        assert r["world"] == 4 and r["bw_mbit"] == 1000.0 and r["iteration_s"] > 0 and 0 <= r["density"] <= 1
        assert r["lossless"] == (r["method"] not in LOSSY)
        if r["lossless"]:
            assert r["exact"], (r["model"], r["method"])
        else:
            assert not r["exact"], (r["model"], r["method"])  # lossy by design: never reported exact
    # compression in front of the exact codec: fewer bytes than the exact homagg run, ranks agree
    by = {(r["model"], r["method"]): r for r in records}
    for m in MODELS:
        topk = by[(m, "homagg-topk")]
        assert topk["compress"] == "topk:0.01" and topk["ranks_identical"], m
        assert topk["bytes_per_worker"] < by[(m, "homagg")]["bytes_per_worker"], m
    assert "| model |" in (tmp_path / "o" / "table.md").read_text()
    assert _namespaces() - before == set()
