"""``homagg bench faults --quick``: the CI form of the reliability figures.  Oracle: every
all_reduce's exact integer sum (checked by the workers), the switch's own counters, the process
table (resident memory sampled for the switch and every worker), and the record's schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from homagg.cli import main


@pytest.mark.slow
def test_bench_faults_quick_records_well_formed_and_exact(tmp_path: Path) -> None:
    pytest.importorskip("scapy")
    out = tmp_path / "faults.json"
    assert main(["bench", "faults", "--quick", "--json", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["bench"] == "faults" and rec["quick"] is True and "cpus=" in rec["machine"]
    assert isinstance(rec["load_1min_start"], float) and isinstance(rec["load_1min_end"], float)

    soak = rec["soak"]
    assert soak["workers"] == 4 and soak["loss"] == {"drop": 0.01, "duplicate": 0.01, "reorder": 0.01}
    assert soak["exact"] is True and soak["inexact"] == [] and soak["all_reduces"] >= 4
    assert set(soak["schemes"]) <= {"dense", "sketch", "compact", "auto"} and len(soak["schemes"]) >= 2
    assert set(soak["rss"]) == {"switch", "worker0", "worker1", "worker2", "worker3"}
    for v in soak["rss"].values():
        assert 5 < v["warm_mib"] <= v["max_mib"] and v["end_mib"] <= v["max_mib"]
        assert v["growth_mib"] == pytest.approx(v["end_mib"] - v["warm_mib"], abs=0.11)
    assert soak["rss_within_bound"] is True and soak["rss_samples"] >= 3
    sw = soak["switch"]
    assert sw["completed"] > 0 and sw["drop_injected"] + sw["drop_injected_egress"] > 0  # faults really on

    fz = rec["fuzz"]
    assert fz["datagrams"] == 3000 and fz["exact"] is True and fz["switch_alive"] is True
    assert min(fz["legit_runs"]) >= 1 and fz["problems"] == []
    assert fz["switch"]["dropped"] >= 0.9 * fz["datagrams"]  # a few may be lost in full socket buffers
    cg = fz["coverage_guided"]
    assert (cg["ran"] and cg["crashed"] is False and cg["coverage_edges"] > 0) or (not cg["ran"] and cg["why"])

    rates = [r["loss"] for r in rec["loss"]]
    assert rates == [0.001, 0.01, 0.05, 0.2]
    for r in rec["loss"]:
        assert r["exact"] is True and r["all_reduces"] == 3 and r["workers"] == 4
        assert 0 < r["median_s"] <= r["p90_s"] and r["retransmits_per_all_reduce"] >= 0
    cr = rec["crash"]  # a DDP run whose emulator is SIGKILLed before step 8 and comes back
    assert cr["transitions"] == [["switch", "host"], ["host", "switch"]]
    assert cr["steps_per_path"]["host"] >= 1 and cr["steps_per_path"]["switch"] >= 8
    assert sum(cr["steps_per_path"].values()) == cr["steps"] == 24
    assert 0 < cr["detect_s"] < 10 and cr["agree_s"] >= 0 and cr["readmit_s"] > 0 and cr["host_s"] > 0
    assert cr["params_match_across_ranks"] and cr["params_match_undisturbed"] and cr["losses_match_undisturbed"]
    heavy = rec["loss"][-1]
    assert heavy["switch_injected_drops"] > 0 and heavy["retransmits_per_all_reduce"] > 0


@pytest.mark.slow
def test_bench_faults_chaos_two_minutes_nothing_lost_nothing_hung(tmp_path: Path) -> None:
    """The CI form of the chaos soak (``--chaos --quick``: 120 s of DDP, 4 ranks, the embedded
    default, seeded faults of every kind), then the same steps undisturbed.  Oracle: the
    undisturbed run's parameters and losses (bit for bit, the documented bound), the emulators'
    own fault counters, and every rank's path statistics."""
    out = tmp_path / "chaos.json"
    rc = main(["bench", "faults", "--chaos", "--quick", "--json", str(out)])
    ch = json.loads(out.read_text())["chaos"]
    assert ch["errors"] == [] and ch["hang"] is None, ch["errors"] or ch["hang"]
    assert rc == 0 and ch["ok"] is True and ch["failures"] == []
    assert ch["duration_s"] == 120 and ch["world"] == 4 and ch["switch"].startswith("embedded")
    assert ch["every_kind_injected"] and set(ch["faults_injected"]) == {"kill", "loss", "stall", "reorder", "duplicate"}
    assert sum(ch["faults_injected"].values()) + sum(ch["faults_skipped"].values()) == sum(ch["planned"].values())
    c = ch["emulator_counters"]  # the emulators really injected what was asked
    assert c["drop_injected"] + c["drop_injected_egress"] > 0 and c["injected_duplicate"] > 0 and c["injected_reorder"] > 0
    assert ch["transitions"]["switch->host"] >= ch["faults_injected"]["kill"] >= 1
    assert ch["transitions"].get("host->switch", 0) >= 1 and ch["transitions_identical_across_ranks"]
    assert ch["steps_per_path"]["host"] >= 1 and ch["steps_per_path"]["switch"] >= 1
    assert sum(ch["steps_per_path"].values()) == ch["steps"] >= 100
    assert all(r == ch["calls_per_path"] for r in ch["calls_per_path_by_rank"])
    assert sum(ch["calls_per_path"].values()) == 2 * ch["steps"]  # a gradient bucket and the stop flag per step
    assert ch["undisturbed_calls_per_path"].get("switch") == 2 * ch["steps"] and ch["undisturbed_transitions"] == 0
    assert ch["params_identical_across_ranks"] and ch["params_equal_undisturbed"] and ch["losses_equal_undisturbed"]
    assert ch["params_max_abs_diff_undisturbed"] == 0.0 and ch["warnings"].get("PathWarning", 0) >= 4
