"""The Tofino program compiled with bf-p4c (marker ``tofino``): the compiler's outputs are the oracle.

Each target is compiled once per session (``homagg p4 build --target ...`` path, ``-g``): it must
fit the device (the assembler wrote the binary, ``resources.json`` lists no more stages than the
device has), print no warning but the parse-depth padding, aggregate the documented words per
pass, and its ``bfrt.json`` must hold every table, key, action and data field the BF Runtime
control plane (:mod:`homagg.p4.bfrt`) writes for a job file, with values fitting their widths.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from homagg import ConfigError
from homagg.jobs import JobSpec, WorkerAddr
from homagg.p4 import HostPort, SwitchConfig
from homagg.p4 import _tofino, bfrt

pytestmark = pytest.mark.tofino

#: words per pass documented in docs/p4-tofino.md and p4/tofino/tofino_config.p4
WORDS = {"tofino": 28, "tofino2": 32}
STAGES = {"tofino": 12, "tofino2": 20}


@pytest.fixture(scope="session", params=sorted(_tofino.TARGETS))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> _tofino.TofinoBuild:
    return _tofino.build(request.param, tmp_path_factory.mktemp(request.param), werror=True)


def _switch() -> SwitchConfig:
    hosts = tuple(HostPort(f"10.0.0.{i + 1}", f"02:48:41:00:00:0{i + 1}", i + 1) for i in range(3))
    return SwitchConfig("s1", "127.0.0.1:50052", 0, "10.0.0.254", "02:48:41:00:00:fe", (1, 2, 3), hosts)


def _job(words: int) -> JobSpec:
    workers = tuple(WorkerAddr(i, f"10.0.0.{i + 1}", 18500 + i) for i in range(3))
    return JobSpec(7, 3, slot_base=64, n_slots=32, words_per_packet=words, workers=workers, token=0xCAFEBABE)


def test_fits_the_device(built: _tofino.TofinoBuild, record_property) -> None:
    r = built.resources
    assert built.binary.is_file() and built.binary.stat().st_size > 0
    assert r.stages == STAGES[built.target]
    assert 0 < r.stages_used <= r.stages
    # one stateful ALU per word, plus the mark (missing set and key) and the offset check
    assert r.stateful_alus == r.words_per_pass + 2
    assert r.words_per_pass == WORDS[built.target]
    record_property("homagg_report", f"{built.target}: " + "; ".join(r.lines()) + f"; {built.seconds:.0f} s")


def test_only_the_padding_warning(built: _tofino.TofinoBuild) -> None:
    assert all(_tofino.PADDING.search(w) for w in built.warnings)


def test_control_plane_matches_bfrt_json(built: _tofino.TofinoBuild) -> None:
    doc = bfrt.load_bfrt(built.bfrt)
    words = _tofino.words_per_pass(doc)
    sw = _switch()
    writes = bfrt.switch_entries(sw) + bfrt.job_entries(sw, _job(words), words=words)
    n = bfrt.check_entries(doc, writes)
    tables = {w.table for w in writes if not w.table.startswith("$pre.")}
    assert n > 32 * 4 and len(tables) == 10
    with pytest.raises(ConfigError, match="words_per_packet"):
        bfrt.job_entries(sw, _job(words + 1), words=words)


def test_check_entries_refuses_what_the_program_lacks(built: _tofino.TofinoBuild) -> None:
    doc = bfrt.load_bfrt(built.bfrt)
    good = bfrt.job_entries(_switch(), _job(8), words=_tofino.words_per_pass(doc))
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


def test_build_refuses_unknown_target(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        _tofino.build("tofino3", tmp_path)
