"""``homagg bench compress``: its helpers, and the CI-quick convergence check.

The quick check trains the teacher-labelled task with 2 ranks for 150 steps with plain gloo and
the three error-feedback methods (top-1% + EF, DGC, homomorphic 1-bit + EF) through homagg, and
asserts the stated tolerance: every error-feedback method's final held-out loss is at most
``gloo * 1.25 + 0.02`` (the bench's ``--check``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from homagg import HomAggError
from homagg.bench._convergence import EF_METHODS, METHODS, _table, check_tolerance, method_spec

REPO = Path(__file__).resolve().parent.parent


def _rec(method: str, loss: float, nbytes: float = 100.0) -> dict:
    return {"method": method, "spec": method, "final_loss": loss, "bytes_per_step": nbytes, "step_ms": 1.0,
            "load_1min": 1.0, "curve": [(0, 2.0), (10, loss)], "world": 2, "params": 10}


def test_method_specs_parse() -> None:
    from homagg.compress import parse

    for m in METHODS:
        spec = method_spec(m, 300)
        if spec.startswith(("hom:", "own:")):
            assert parse(spec[4:]) is not None, m
    assert method_spec("dgc", 600).endswith("warmup=100")
    with pytest.raises(HomAggError):
        method_spec("zip", 10)


def test_tolerance_check() -> None:
    recs = [_rec("gloo", 1.0), _rec("topk-ef", 1.26), _rec("dgc", 1.28), _rec("onebit-ef", 0.5), _rec("terngrad", 9.0)]
    bad = check_tolerance(recs, 0.25)
    assert len(bad) == 1 and bad[0].startswith("dgc")  # limit 1.27; terngrad is not an EF method
    assert check_tolerance([_rec("topk-ef", 5.0)], 0.25) == []  # no reference, nothing to compare
    nan = _rec("onebit-ef", math.nan)
    assert check_tolerance([_rec("gloo", 1.0), nan], 0.25)  # a NaN loss misses the tolerance
    table = _table(recs)
    assert "| topk-ef |" in table and "1.26x" in table


@pytest.mark.slow
def test_quick_convergence_error_feedback_reaches_gloo(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "homagg", "bench", "compress", "--quick", "--no-progress", "--check",
           "--methods", ",".join(("gloo", *EF_METHODS)), "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "records.json").read_text())
    by = {r["method"]: r for r in report["records"]}
    assert set(by) == {"gloo", *EF_METHODS} and report["failures"] == []
    for m in EF_METHODS:
        assert by[m]["final_loss"] <= by["gloo"]["final_loss"] * 1.25 + 0.02, m
        assert by[m]["final_loss"] < by[m]["curve"][0][1] * 0.8, f"{m} did not learn"
    assert by["onebit-ef"]["bytes_per_step"] < 0.1 * by["gloo"]["bytes_per_step"]
    assert by["topk-ef"]["bytes_per_step"] < 0.5 * by["gloo"]["bytes_per_step"]
    assert (out / "table.md").read_text().count("|") > 20
    assert (out / "loss.png").stat().st_size > 1000
    assert str(out) in proc.stdout
