"""``homagg bench allreduce`` at CI size: well-formed records, exact homagg results, fewer bytes.

No timing assertions (the machine is shared); one tiny sweep runs through the command's entry
point, then the launcher's failure paths are checked with small stand-in rank commands.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from homagg import HomAggError
from homagg.bench._allreduce import RECORD_FIELDS, markdown_table
from homagg.bench._cpu import median_call_split
from homagg.bench._allreduce_rank import check_result, make_tensor, oracle, sparse_allgather_bytes
from homagg.bench._ranks import launch_ranks
from homagg.cli import main

_cache: dict[str, Any] = {}


def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if "report" not in _cache:
        out = tmp_path_factory.mktemp("bench-allreduce")
        argv = ["bench", "allreduce", "--numel", "20000", "--density", "0.01,1.0", "--world", "2",
                "--schemes", "compact,dense", "--repeats", "1", "--out", str(out), "--json", str(out / "copy.json")]
        assert main(argv) == 0
        _cache["out"] = out
        _cache["report"] = json.loads((out / "records.json").read_text())
    return _cache


def test_records_well_formed(tmp_path_factory: pytest.TempPathFactory) -> None:
    run = tiny_run(tmp_path_factory)
    records = run["report"]["records"]
    assert json.loads((run["out"] / "copy.json").read_text())["records"] == records
    assert len(records) == 2 * 3 + 1  # 2 densities x (gloo, compact, dense) + gloo-sparse at 0.01
    for rec in records:
        for name, types in RECORD_FIELDS.items():
            assert name in rec, f"{name} missing in {rec}"
            assert isinstance(rec[name], types), (name, rec)
            assert isinstance(rec[name], bool) == (bool in types), (name, rec)  # no bools posing as ints
        assert (rec["numel"], rec["world"], rec["repeats"]) == (20000, 2, 1)
        assert rec["density"] in (0.01, 1.0)
        assert len(rec["times_s"]) == 1 and rec["median_s"] > 0 and len(rec["load_avg"]) == 3
        assert rec["machine"]["cpus"] >= 1 and rec["cpu_load"] == 0
        # the ranks' CPU per call, split: user + system is the total (the same median call's parts)
        total, user, system = rec["cpu_s_per_call"], rec["cpu_user_s_per_call"], rec["cpu_sys_s_per_call"]
        assert total is not None and user is not None and system is not None, rec
        assert user >= 0 and system >= 0 and user + system == pytest.approx(total, abs=1e-9)
        # the switch emulator's CPU: homagg's embedded one (rank 0's child process), none for gloo
        assert (rec["switch_cpu_s_per_call"] is None) == (rec["backend"] != "homagg"), rec
        assert rec["switch_cpu_s_per_call"] is None or rec["switch_cpu_s_per_call"] >= 0
        if rec["backend"] == "gloo":
            assert rec["scheme"] is None and rec["speedup_vs_gloo"] is None
            assert rec["rounds_per_allreduce"] is None and rec["retransmits"] is None
            assert rec["bytes_per_worker"] == 2 * (2 - 1) / 2 * 4 * 20000
        elif rec["backend"] == "gloo-sparse":
            assert rec["scheme"] is None and rec["density"] == 0.01 and rec["exact"]
            assert rec["bytes_per_worker"] == sparse_allgather_bytes(200, 2) and rec["speedup_vs_gloo"] > 0
        else:
            assert rec["backend"] == "homagg" and rec["scheme"] in ("compact", "dense")
            assert rec["speedup_vs_gloo"] > 0 and rec["rounds_per_allreduce"] >= 1
            assert rec["retransmits"] is None or rec["retransmits"] >= 0
    assert {(r["backend"], r["scheme"]) for r in records} == {("gloo", None), ("gloo-sparse", None),
                                                              ("homagg", "compact"), ("homagg", "dense")}
    table = (run["out"] / "table.md").read_text()
    assert "homagg/compact" in table and "| gloo |" in table and "| gloo-sparse |" in table
    assert "| ranks' CPU ms (user+sys) | switch CPU ms |" in table
    assert table.splitlines()[0].count("background load: none") == 1  # the header line
    assert run["report"]["cpu_load"] == 0
    assert (run["out"] / "speedup.png").stat().st_size > 0


def test_homagg_exact_and_fewer_bytes_when_sparse(tmp_path_factory: pytest.TempPathFactory) -> None:
    records = tiny_run(tmp_path_factory)["report"]["records"]
    for rec in records:
        if rec["backend"] == "homagg":
            assert rec["exact"], rec
    gloo_bytes = {r["density"]: r["bytes_per_worker"] for r in records if r["backend"] == "gloo"}
    # the sparse schemes at density < 1 (the dense scheme sends every value, like gloo's ring at W=2)
    sparse = [r for r in records if r["backend"] == "homagg" and r["scheme"] != "dense" and r["density"] < 1.0]
    assert sparse
    for rec in sparse:
        assert rec["bytes_per_worker"] < gloo_bytes[rec["density"]], rec


def test_inputs_deterministic_half_shared() -> None:
    a0, a1 = make_tensor(10_000, 0.02, 0, seed=3), make_tensor(10_000, 0.02, 1, seed=3)
    assert torch.equal(a0, make_tensor(10_000, 0.02, 0, seed=3))
    assert int((a0 != 0).sum()) == int((a1 != 0).sum()) == 200
    overlap = int(((a0 != 0) & (a1 != 0)).sum())
    assert 100 <= overlap <= 110  # the 100 shared positions, + rank-specific ones that collide by chance
    exact, bound = oracle(10_000, 0.02, 2, 3, 1024)
    assert torch.equal(exact, a0.double() + a1.double())
    assert check_result((a0 + a1), exact, bound, 1024)[0]
    assert not check_result((a0 + a1) + 1e-3 * (exact != 0), exact, bound, 1024)[0]


def test_launcher_names_failed_rank() -> None:
    code = "import os,sys; r=int(os.environ['RANK']); print('hi', flush=True); sys.exit(5 if r == 1 else 0)"
    with pytest.raises(HomAggError, match=r"rank 1 \(exit status 5\)"):
        launch_ranks([sys.executable, "-c", code], 2, label="t", stall_timeout=30)


def test_launcher_kills_hung_ranks(tmp_path: Path) -> None:
    code = ("import os,time; from homagg.bench._ranks import die_with_launcher; die_with_launcher(); "
            f"open(os.path.join({str(tmp_path)!r}, os.environ['RANK']), 'w').write(str(os.getpid())); "
            "time.sleep(0 if os.environ['RANK'] == '0' else 600)")
    with pytest.raises(HomAggError, match=r"rank\(s\) \[1\] printed nothing for 3s"):
        launch_ranks([sys.executable, "-c", code], 2, label="t", stall_timeout=3)
    pid = int((tmp_path / "1").read_text())
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_markdown_table_marks_inexact() -> None:
    rec = {"backend": "homagg", "scheme": "sketch", "numel": 10, "density": 0.5, "world": 2, "median_s": 0.001,
           "speedup_vs_gloo": None, "rounds_per_allreduce": 1.0, "bytes_per_worker": 40.0,
           "retransmits": None, "exact": False}
    assert "| NO |" in markdown_table([rec])
    assert "| - | - | NO |" in markdown_table([rec])  # no CPU figures: dashes
    rec.update(cpu_s_per_call=0.233, cpu_user_s_per_call=0.151, cpu_sys_s_per_call=0.082, switch_cpu_s_per_call=0.0125)
    assert "| 233 (151+82) | 12.5 | NO |" in markdown_table([rec])


def test_cpu_split_is_the_median_calls() -> None:
    """user and system come from the same (median) call, so they add up to the total."""
    assert median_call_split([3.0, 1.0, 2.0], [2.5, 0.1, 1.0], [0.5, 0.9, 1.0]) == (2.0, 1.0, 1.0)
    total, user, system = median_call_split([4.0, 1.0, 3.0, 2.0], [1.0, 0.5, 2.0, 0.5], [3.0, 0.5, 1.0, 1.5])
    assert (total, user, system) == (2.5, 1.25, 1.25)  # the calls of totals 2 and 3, averaged
    assert median_call_split([1.0], None, None) == (1.0, None, None)
    assert median_call_split([], [], []) == (None, None, None)


def load_children() -> set[int]:
    """This process's children that run a busy loop of ``--cpu-load`` (``/proc``)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"homagg.bench._load" in cmdline:
            found.add(int(stat.parent.name))
    return found


def test_codec_options_reach_the_ranks(tmp_path: Path) -> None:
    """``--codec`` travels to every homagg rank: 20,000 elements in segments of 8,192 take 3.
    (The run also has one busy background process, ``--cpu-load 1``: recorded and gone after.)"""
    argv = ["bench", "allreduce", "--numel", "20000", "--density", "0.01", "--world", "2", "--schemes", "compact",
            "--repeats", "1", "--baselines", "gloo", "--codec", "segment=8192,bitmap_levels=2", "--out", str(tmp_path),
            "--no-plot", "--cpu-load", "1"]
    assert main(argv) == 0
    assert load_children() == set()  # the busy process was killed and reaped
    report = json.loads((tmp_path / "records.json").read_text())
    assert report["cpu_load"] == 1 and {r["cpu_load"] for r in report["records"]} == {1}
    assert "background load: 1 busy process at nice 19" in (tmp_path / "table.md").read_text().splitlines()[0]
    records = report["records"]
    mine = [r for r in records if r["backend"] == "homagg"]
    assert len(mine) == 1 and mine[0]["exact"]
    assert mine[0]["codec"] == {"segment": 8192, "bitmap_levels": 2} and mine[0]["segments_per_allreduce"] == 3
    assert [r["codec"] for r in records if r["backend"] == "gloo"] == [{}]


@pytest.mark.parametrize("bad", ["segment", "no_such_option=1", "bitmap_levels=3"])
def test_bad_codec_options_are_refused_before_any_rank_starts(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "allreduce", "--codec", bad])
    assert exc.value.code == 2 and "codec" in capsys.readouterr().err


def test_rank_lines_arrive_whole_while_the_launcher_reads() -> None:
    """A rank writes while the launcher polls its output file: every line arrives whole and in
    order (the rank's writes append; the launcher's seek-and-read of the same file must not move
    where they land)."""
    code = ("import sys, time\n"
            "for i in range(4000):\n"
            "    print('line', i, 'x' * (i % 97), flush=True)\n"
            "    if i % 500 == 0: time.sleep(0.12)\n")
    seen: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("homagg.bench._ranks._POLL_S", 0.0005)  # read as often as possible: the race window
        lines = launch_ranks([sys.executable, "-c", code], 1, label="t", stall_timeout=30,
                             on_line=lambda rank, line: seen.append(line))[0]
    want = [f"line {i} {'x' * (i % 97)}".rstrip() for i in range(4000)]
    assert [ln.rstrip() for ln in lines] == want
    assert [ln.rstrip() for ln in seen] == want
