"""``homagg bench gpu`` on the CPU: the replayed calls are the job's results bit for bit (the bench
raises otherwise), and the host reads it reports are those of the code path CUDA tensors take."""

from __future__ import annotations

import json
from pathlib import Path

from homagg.bench._gpu import measure
from homagg.cli import main


def test_records_count_the_device_paths_host_reads() -> None:
    tables: list[str] = []
    records = measure(40_000, 0.01, ["dense", "compact"], workers=3, repeats=1, device="cpu", tables=tables)
    by_scheme = {r["scheme"]: r for r in records}
    assert by_scheme["dense"]["rounds_steady"] == 1 and by_scheme["dense"]["syncs"] == 2
    assert by_scheme["compact"]["syncs"] <= 3 and by_scheme["compact"]["resolved"] == "compact"
    for r in records:
        assert r["encode_s"] > 0 and r["decode_s"] > 0 and r["add_s"] > 0 and r["torch_calls"] > 0
        sites = {(site.split(":")[0], site.split()[-1]) for site in r["sync_sites"]}  # module, function
        assert sites <= {("_blocks.py", "exponents"), ("_worker.py", "fetch")}, r["sync_sites"]
    assert len(tables) == 2


def test_command_writes_its_records(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    assert main(["bench", "gpu", "--numel", "20000", "--densities", "0.05", "--schemes", "auto", "--workers", "2",
                 "--repeats", "1", "--device", "cpu", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["info"]["device"] == "cpu" and report["records"][0]["scheme"] == "auto"
