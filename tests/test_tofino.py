"""The Tofino program compiled with bf-p4c (marker ``tofino``): the compiler's outputs are the oracle.

The build's handling of its output folder (it never removes what it did not write) is tested
without the compiler too: with a stand-in ``bf-p4c`` that fails after writing outputs, and on
:func:`homagg.p4._tofino.place_outputs` directly.

Each target is compiled once per session (``homagg p4 build --target ...`` path, ``-g``): it must
fit the device (the assembler wrote the binary, ``resources.json`` lists no more stages than the
device has), print no warning but the parse-depth padding, aggregate the documented words per
pass, and its ``bfrt.json`` must hold every table, key, action and data field the BF Runtime
control plane (:mod:`homagg.p4.bfrt`) writes for a job file, with values fitting their widths.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from homagg import ConfigError
from homagg.jobs import JobSpec, WorkerAddr
from homagg.p4 import HostPort, SwitchConfig
from homagg.p4 import _tofino, bfrt
from homagg.p4.source import p4_constants

#: words per pass documented in docs/p4-tofino.md and p4/tofino/tofino_config.p4
WORDS = {"tofino": 28, "tofino2": 32}
STAGES = {"tofino": 12, "tofino2": 20}


#: a user's file in the build folder, which the build must leave alone
USER_FILE = ("notes.txt", "the user's own notes\n")


@pytest.fixture(scope="session", params=sorted(_tofino.TARGETS))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> _tofino.TofinoBuild:
    out = tmp_path_factory.mktemp(request.param)
    (out / USER_FILE[0]).write_text(USER_FILE[1])
    return _tofino.build(request.param, out, werror=True)


def _switch() -> SwitchConfig:
    hosts = tuple(HostPort(f"10.0.0.{i + 1}", f"02:48:41:00:00:0{i + 1}", i + 1) for i in range(3))
    return SwitchConfig("s1", "127.0.0.1:50052", 0, "10.0.0.254", "02:48:41:00:00:fe", (1, 2, 3), hosts)


def _job(words: int, *, parent: tuple[str, int] | None = None, child_id: int = 0) -> JobSpec:
    workers = tuple(WorkerAddr(i, f"10.0.0.{i + 1}", 18500 + i) for i in range(2 if parent else 3))
    return JobSpec(7, len(workers), slot_base=64, n_slots=32, words_per_packet=words, workers=workers,
                   token=0xCAFEBABE, parent=parent, child_id=child_id)


#: trees: the parent's data address (host 3 of _switch) and this switch's worker id there
PARENT = ("10.0.0.3", 18497)


@pytest.mark.tofino
def test_fits_the_device(built: _tofino.TofinoBuild, record_property) -> None:
    r = built.resources
    assert built.binary.is_file() and built.binary.stat().st_size > 0
    assert r.stages == STAGES[built.target]
    assert 0 < r.stages_used <= r.stages
    # one stateful ALU per word, plus the mark (missing set and key), the offset check and the
    # trees' down bit
    assert r.stateful_alus == r.words_per_pass + 3
    assert r.words_per_pass == r.parser_words == r.word_registers == WORDS[built.target]
    record_property("homagg_report", f"{built.target}: " + "; ".join(r.lines()) + f"; {built.seconds:.0f} s")


@pytest.mark.tofino
def test_only_the_padding_warning(built: _tofino.TofinoBuild) -> None:
    assert all(_tofino.PADDING.search(w) for w in built.warnings)


@pytest.mark.tofino
def test_control_plane_matches_bfrt_json(built: _tofino.TofinoBuild) -> None:
    doc = bfrt.load_bfrt(built.bfrt)
    words = bfrt.compiled_words(built.out)
    sw = _switch()
    writes = bfrt.switch_entries(sw) + bfrt.job_entries(sw, _job(words), words=words)
    n = bfrt.check_entries(doc, writes)
    tables = {w.table for w in writes if not w.table.startswith("$pre.")}
    assert n > 32 * 4 and len(tables) == 10
    with pytest.raises(ConfigError, match="words_per_packet"):
        bfrt.job_entries(sw, _job(words + 1), words=words)
    # trees: a child's writes (its parent's results admitted, its uses addressed up) fit too
    child = bfrt.job_entries(sw, _job(words, parent=PARENT, child_id=31), words=words)
    assert bfrt.check_entries(doc, child) == len([w for w in child if not w.table.startswith("$pre.")])
    assert {w.table for w in child if not w.table.startswith("$pre.")} - tables == {
        "pipe.HomaggIngress.admission.from_parent", "pipe.HomaggIngress.admission.parent_token",
        "pipe.HomaggEgress.rewrite.parent_rewrite"}


@pytest.mark.tofino
def test_tree_state_in_bfrt_json(built: _tofino.TofinoBuild) -> None:
    """The child role's state as compiled: one 1-bit down register per cell, the tree_events
    counter of configuration.p4's TREE_EVENTS, beside drop_reasons (with DROP_STALE_RESULT)."""
    tables = {t["name"]: t for t in bfrt.load_bfrt(built.bfrt)["tables"]}
    consts = p4_constants()
    down = tables["pipe.HomaggIngress.completion.down"]
    assert down["size"] == 2 * consts["SLOT_POOL_SIZE"].value
    assert [d["singleton"]["type"]["width"] for d in down["data"]] == [1]
    assert tables["pipe.HomaggIngress.replicate.tree_events"]["size"] == consts["TREE_EVENTS"].value
    assert tables["pipe.HomaggIngress.replicate.drop_reasons"]["size"] == consts["DROP_REASONS"].value


@pytest.mark.tofino
def test_check_entries_refuses_what_the_program_lacks(built: _tofino.TofinoBuild) -> None:
    doc = bfrt.load_bfrt(built.bfrt)
    good = bfrt.job_entries(_switch(), _job(8), words=bfrt.compiled_words(built.out))
    adm = next(w for w in good if w.table.endswith("admission.admission"))
    bad = [
        bfrt.BfrtWrite(adm.table, adm.key, adm.action, {**adm.data, "epoch": 1}),            # v1model's field
        bfrt.BfrtWrite(adm.table, adm.key, adm.action, {**adm.data, "worker_port": 512}),   # 9-bit port
        bfrt.BfrtWrite(adm.table, {"hdr.ipv4.src_addr": 1}, adm.action, adm.data),          # key incomplete
        bfrt.BfrtWrite(adm.table + "_v1", adm.key, adm.action, adm.data),
    ]
    for w in bad:
        with pytest.raises(ConfigError):
            bfrt.check_entries(doc, [w])


def test_child_job_entries() -> None:
    """Trees: a child job's BF Runtime writes (no compiler): admission's child bit and the port
    towards the parent, the parent's results admitted by address, job and token, the uses sent up
    from the switch's data address to the parent's as worker child_id; a root's admit says child 0
    and has none of these; a parent without a host entry is refused before anything is written."""
    sw = _switch()
    root = bfrt.job_entries(sw, _job(8), words=28)
    child = bfrt.job_entries(sw, _job(8, parent=PARENT, child_id=31), words=28)
    admits = [w.data for w in root if w.table.endswith("admission.admission")]
    assert admits and all(d["child"] == 0 and d["parent_port"] == 0 for d in admits)
    assert not [w for w in root if "parent" in w.table]
    admits = [w.data for w in child if w.table.endswith("admission.admission")]
    assert len(admits) == 2 and all(d["child"] == 1 and d["parent_port"] == 3 for d in admits)
    by_table = {w.table.rsplit(".", 1)[1]: w for w in child}
    src = {"hdr.ipv4.src_addr": 0x0A000003, "hdr.udp.src_port": 18497, "hdr.homagg.job_id": 7}
    assert by_table["from_parent"].key == src
    assert by_table["from_parent"].data == {"down_grp": by_table["admission"].data["mcast_grp"]}
    assert by_table["parent_token"].key == {**src, "hdr.homagg.token": 0xCAFEBABE}
    up = by_table["parent_rewrite"]
    assert up.key == {"hdr.homagg.job_id": 7} and up.action == "HomaggEgress.rewrite.to_parent"
    assert up.data == {"switch_mac": 0x024841_0000FE, "switch_ip": 0x0A0000FE, "parent_mac": 0x024841_000003,
                       "parent_ip": 0x0A000003, "parent_port": 18497, "child_id": 31}
    with pytest.raises(ConfigError, match="no host entry for 10.0.0.9"):
        bfrt.job_entries(sw, _job(8, parent=("10.0.0.9", 18497), child_id=1), words=28)


def test_build_refuses_unknown_target(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        _tofino.build("tofino3", tmp_path)


# ---------------------------------------------------------------------------------------------
# the output folder: only what the build wrote is ever replaced or removed


def _user_files(out: Path) -> None:
    (out / USER_FILE[0]).write_text(USER_FILE[1])
    (out / "data").mkdir()
    (out / "data" / "x.bin").write_bytes(b"\x01\x02")


def _assert_user_files(out: Path) -> None:
    assert (out / USER_FILE[0]).read_text() == USER_FILE[1]
    assert (out / "data" / "x.bin").read_bytes() == b"\x01\x02"


def test_failed_build_keeps_the_users_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out DIR`` holding the user's files: a build (here with a stand-in bf-p4c that writes
    some outputs and fails) leaves them as they were, and keeps its log."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "bf-p4c"
    fake.write_text(f"#!{sys.executable}\n"
                    "import pathlib, sys\n"
                    "out = pathlib.Path(sys.argv[sys.argv.index('-o') + 1])\n"
                    "(out / 'pipe').mkdir(parents=True, exist_ok=True)\n"
                    "(out / 'bfrt.json').write_text('{}')\n"
                    "print('error: stand-in bf-p4c: no compiler here', file=sys.stderr)\n"
                    "sys.exit(1)\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    out = tmp_path / "out"
    out.mkdir()
    _user_files(out)
    for _ in range(2):
        with pytest.raises(_tofino.BuildError, match="stand-in bf-p4c"):
            _tofino.build("tofino", out)
        _assert_user_files(out)
        assert "stand-in bf-p4c" in (out / "bf-p4c.log").read_text()
        assert not (out / "bfrt.json").exists()  # a failed build's outputs are not kept
    assert sorted(p.name for p in out.iterdir()) == sorted([_tofino.PLACED, "bf-p4c.log", "data", USER_FILE[0]])


def _staged(tmp_path: Path, names: dict[str, str]) -> Path:
    staging = tmp_path / f"staging{len(list(tmp_path.iterdir()))}"
    for name, text in names.items():
        (staging / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / name).write_text(text)
    return staging


def test_place_outputs_replaces_only_its_own(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _user_files(out)
    first = {"bfrt.json": "1", "pipe/tofino.bin": "1", "stage_adv.log": "1"}
    assert _tofino.place_outputs(_staged(tmp_path, first), out) == ["bfrt.json", "pipe", "stage_adv.log"]
    _assert_user_files(out)
    # a second build replaces the first one's outputs and removes those it no longer writes
    second = {"bfrt.json": "2", "pipe/tofino.bin": "2", "source.json": "2"}
    _tofino.place_outputs(_staged(tmp_path, second), out)
    _assert_user_files(out)
    assert (out / "bfrt.json").read_text() == "2" and (out / "pipe" / "tofino.bin").read_text() == "2"
    assert not (out / "stage_adv.log").exists()
    assert _tofino.placed_names(out) == {"bfrt.json", "pipe", "source.json"}


def test_place_outputs_refuses_to_replace_the_users_entries(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    _user_files(out)
    (out / "source.json").write_text("the user's")  # a name bf-p4c also writes
    staging = _staged(tmp_path, {"bfrt.json": "1", "source.json": "1", "data/x.bin": "1"})
    with pytest.raises(_tofino.BuildError, match="data, source.json"):
        _tofino.place_outputs(staging, out)
    _assert_user_files(out)
    assert (out / "source.json").read_text() == "the user's" and not (out / "bfrt.json").exists()
    # the build's own folder (p4/build/<target>): outputs of the same name are its own
    _tofino.place_outputs(staging, out, own_folder=True)
    assert (out / "source.json").read_text() == "1" and (out / USER_FILE[0]).read_text() == USER_FILE[1]


def test_place_outputs_replaces_a_build_made_before_the_list(tmp_path: Path) -> None:
    """A folder an earlier version built into (bf-p4c's outputs straight in it, no list of them):
    recognised by bf-p4c's manifest of homagg_tofino.p4 with -o that folder, replaced; a manifest
    of another program or folder is not."""
    out = tmp_path / "out"
    out.mkdir()
    _user_files(out)
    for name in ("bfrt.json", "source.json", "stage_adv.log"):
        (out / name).write_text("old")
    (out / "pipe").mkdir()
    for other in (f"-o {tmp_path / 'elsewhere'} /x/p4/tofino/homagg_tofino.p4", f"-o {out} /x/other.p4"):
        (out / "manifest.json").write_text(json.dumps({"compile_command": f"/opt/bf-p4c --target tofino -g {other}"}))
        with pytest.raises(_tofino.BuildError, match="not written by a homagg Tofino build"):
            _tofino.place_outputs(_staged(tmp_path, {"bfrt.json": "new", "pipe/tofino.bin": "new"}), out)
    (out / "manifest.json").write_text(json.dumps(
        {"compile_command": f"/opt/bfp4c/bin/bf-p4c --target tofino --arch tna -g -o {out} /x/p4/tofino/homagg_tofino.p4"}))
    _tofino.place_outputs(_staged(tmp_path, {"bfrt.json": "new", "pipe/tofino.bin": "new"}), out)
    _assert_user_files(out)
    assert (out / "bfrt.json").read_text() == "new" and not (out / "source.json").exists()
    assert not (out / "manifest.json").exists() and _tofino.placed_names(out) == {"bfrt.json", "pipe"}


@pytest.mark.tofino
def test_build_keeps_the_users_files(built: _tofino.TofinoBuild, tmp_path: Path) -> None:
    """The real compiler, twice into one folder: the user's files stay, the outputs are this run's."""
    assert (built.out / USER_FILE[0]).read_text() == USER_FILE[1]
    if built.target != "tofino":
        return  # one rebuild is enough
    out = tmp_path / "out"
    out.mkdir()
    _user_files(out)
    for _ in range(2):
        again = _tofino.build("tofino", out, werror=True)
        _assert_user_files(out)
        assert again.resources.words_per_pass == WORDS["tofino"] and again.binary.is_file()
        assert _tofino.placed_names(out) >= {"bfrt.json", "pipe", "bf-p4c.log"}
