"""Mininet end-to-end: workers on hosts, the switch between them, lossy links, exact results.

Marker ``mininet`` (root + Debian's mininet package; skips with the reason otherwise).  The oracle
is the in-process switch: every worker checks that each scheme's network result is bit-identical
to :func:`homagg.testing.local_allreduce` of the same inputs (see ``topologies/_worker.py``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from topologies._mn import import_mininet

try:  # make Debian's mininet importable before conftest checks for it
    import_mininet()
except ImportError:
    pass

pytestmark = pytest.mark.mininet


def _check(summary: dict, workers: int, schemes: list[str]) -> None:
    assert summary["ok"], json.dumps(summary, indent=1, default=str)[:4000]
    assert len(summary["ranks"]) == workers
    for r in summary["ranks"]:
        assert r["ok"], r
        for s in schemes:
            assert r["schemes"][s]["exact"], (r["rank"], s, r["schemes"][s])
    assert Path(summary["folder"], "results.json").is_file()


def test_star_emulator_four_workers_one_percent_loss(tmp_path: Path) -> None:
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    schemes = ["dense", "compact", "sketch", "auto"]
    s = run_experiment("star", "emulator", 4, LinkOpts(loss=1.0), tmp_path / "run", numel=8000,
                       schemes=",".join(schemes), timeout=240)
    _check(s, 4, schemes)
    counters = s["switch_status"]["counters"]
    assert counters["completed"] > 0 and counters["drop_unknown_source"] == 0
    assert any(Path(tmp_path, "run", "pcaps").glob("*.pcap"))


def test_star_emulator_raw_ports(tmp_path: Path) -> None:
    """The emulator as an L2-addressed switch: raw AF_PACKET ports on the switch host."""
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    schemes = ["dense", "sketch"]
    s = run_experiment("star", "emulator", 4, LinkOpts(loss=1.0), tmp_path / "run", numel=4000,
                       schemes=",".join(schemes), timeout=240, pcap=False, emulator_backend="raw")
    _check(s, 4, schemes)
    assert s["switch_status"]["backend"] == "raw"


def test_two_tier_emulator(tmp_path: Path) -> None:
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    s = run_experiment("two_tier", "emulator", 4, LinkOpts(loss=0.5), tmp_path / "run", racks=2, numel=4000,
                       schemes="dense,sketch", timeout=240, pcap=False)
    _check(s, 4, ["dense", "sketch"])


@pytest.mark.bmv2
@pytest.mark.parametrize("scheme", ["dense", "compact", "sketch", "auto"])
def test_star_bmv2_every_scheme(tmp_path: Path, scheme: str) -> None:
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    if shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc not on PATH")
    s = run_experiment("star", "bmv2", 4, LinkOpts(loss=1.0), tmp_path / "run", numel=4000, schemes=scheme,
                       timeout=300, pcap=False)
    _check(s, 4, [scheme])


@pytest.mark.bmv2
def test_star_bmv2_lossless_forged_tokens_dropped_and_few_retransmits(tmp_path: Path,
                                                                      record_property: Callable) -> None:
    """Every scheme through BMv2 on lossless links, while every worker first sends 5 datagrams
    with a wrong token into the job's first cell: they are dropped and counted (``drop_token``),
    results stay exact, and a lossless run retransmits under 2% of its first sends.  Measured: 0 of
    10,344 in 7 runs (2 with both cores busy) since BMv2's ports run with segmentation offloads off
    (``PORT_OFFLOADS_OFF``: libpcap's ring held ~30 packets with them on, 1.2-8.5% retransmitted)."""
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    schemes = ["dense", "compact", "sketch", "auto"]
    s = run_experiment("star", "bmv2", 4, LinkOpts(), tmp_path / "run", numel=60000, schemes=",".join(schemes),
                       timeout=300, pcap=False, forge=5)
    _check(s, 4, schemes)
    status = s["switch_status"]["hgs"]
    assert status["drop_token"] == 4 * 5, status
    first = sum(r["transport"]["packets"] for r in s["ranks"])
    retx = sum(r["transport"]["retransmits"] for r in s["ranks"])
    line = (f"lossless BMv2 star, 4 workers, {len(schemes)} schemes: {retx} of {first} first sends retransmitted "
            f"({100 * retx / first:.2f}%), drop_token {status['drop_token']}, {s['seconds']} s")
    record_property("homagg_report", line)
    assert retx < 0.02 * first, line


@pytest.mark.bmv2
def test_two_tier_bmv2_every_scheme(tmp_path: Path) -> None:
    """Two racks of BMv2 leaves (plain L2) under a BMv2 spine that aggregates: exact, every scheme."""
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    schemes = ["dense", "compact", "sketch", "auto"]
    s = run_experiment("two_tier", "bmv2", 4, LinkOpts(loss=0.5), tmp_path / "run", racks=2, numel=4000,
                       schemes=",".join(schemes), timeout=300, pcap=False, forge=2)
    _check(s, 4, schemes)
    spine = [v for v in s["switch_status"].values() if v.get("drop_token")]
    assert sum(v["drop_token"] for v in spine) == 4 * 2, s["switch_status"]


@pytest.mark.bmv2
def test_two_tier_bmv2_tree_every_scheme(tmp_path: Path) -> None:
    """Two racks whose BMv2 leaves aggregate (a tree, docs/trees.md) under a BMv2 spine that
    aggregates the leaves: exact and bit-identical to one switch, every scheme; every use went up
    once from each leaf and came down once to it; the forged datagrams are dropped at the leaves
    (the spine sees only the leaves)."""
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    schemes = ["dense", "compact", "sketch", "auto"]
    s = run_experiment("two_tier", "bmv2", 4, LinkOpts(loss=0.5), tmp_path / "run", racks=2, numel=4000,
                       schemes=",".join(schemes), timeout=300, pcap=False, forge=2, tree=True)
    _check(s, 4, schemes)
    status = s["switch_status"]
    spine, leaves = status["hgsp"], [status["hgl0"], status["hgl1"]]
    assert spine["up"] == 0 and spine["drop_token"] == 0 and spine["drop_unknown_source"] == 0, status
    assert leaves[0]["up"] == leaves[1]["up"] > 0 and all(c["result_down"] == c["up"] for c in leaves), status
    assert sum(c["drop_token"] for c in leaves) == 4 * 2, status
    assert {src["job_id"] for src in spine["sources"]} == {1} and len(spine["sources"]) == 2  # the leaves


@pytest.mark.bmv2
def test_two_tier_bmv2_tree_uplinks_carry_one_stream_per_rack(tmp_path: Path,
                                                               record_property: Callable[[str, object], None]) -> None:
    """The same job (2 racks x 2 workers, lossless, same inputs) with the spine aggregating alone
    and with the leaves aggregating too: each leaf's uplink (its interface counters while the
    workers ran) carries about half the bytes up and down with the tree: one stream per rack, not
    one per worker."""
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    runs = {}
    for tree in (False, True):
        s = run_experiment("two_tier", "bmv2", 4, LinkOpts(), tmp_path / f"tree{tree}", racks=2, numel=8000,
                           density=0.2, schemes="dense,auto", timeout=300, pcap=False, tree=tree)
        _check(s, 4, ["dense", "auto"])
        runs[tree] = s["uplink_bytes"]
    ratios = [t[d] / f[d] for f, t in zip(runs[False], runs[True]) for d in ("up", "down")]
    line = (f"two-tier BMv2, 2 racks x 2 workers, dense+auto: uplink bytes (up/down per leaf) spine-only "
            f"{runs[False]}, tree {runs[True]}, tree/spine-only {[round(r, 3) for r in ratios]}")
    record_property("homagg_report", line)
    assert all(0.4 < r < 0.62 for r in ratios), line


def test_two_tier_emulator_tree(tmp_path: Path) -> None:
    """Two racks whose leaves run emulators that aggregate (a tree, docs/trees.md) under an emulator
    spine: exact and bit-identical to one switch, every scheme, 1% loss on the workers' links (100
    Mbit/s), uplinks shaped to 50 Mbit/s; each leaf's uses went up once and came down once; the
    spine's members are the leaves."""
    from topologies._deploy import LinkOpts
    from topologies.runner import run_experiment

    schemes = ["dense", "compact", "sketch", "auto"]
    s = run_experiment("two_tier", "emulator", 4, LinkOpts(bw=100, loss=1.0), tmp_path / "run", racks=2,
                       numel=4000, schemes=",".join(schemes), timeout=300, pcap=False, tree=True,
                       uplink=LinkOpts(bw=50))
    _check(s, 4, schemes)
    assert s["oversubscription"] == 4.0  # 2 workers x 100 Mbit/s per rack over a 50 Mbit/s uplink
    status = s["switch_status"]
    spine, leaves = status["hgsp"]["counters"], [status["hgl0"]["counters"], status["hgl1"]["counters"]]
    assert spine["up"] == 0 and spine["accepted"] == 2 * spine["completed"] > 0, status
    for c in leaves:
        assert c["up"] == c["result_down"] == spine["completed"], status


def test_mininet_command_refuses_bad_uplink_options(capsys: pytest.CaptureFixture[str]) -> None:
    """``homagg mininet`` (the runner's verb): a bad ``--uplink-bw`` is refused before anything starts."""
    from homagg.cli import main

    assert main(["mininet", "--topo", "two_tier", "--uplink-bw", "0"]) == 2
    assert "--uplink-bw 0.0: a bandwidth in Mbit/s > 0" in capsys.readouterr().err
    assert main(["mininet", "--topo", "star", "--uplink-bw", "10"]) == 2
    assert "only two_tier has uplinks" in capsys.readouterr().err
