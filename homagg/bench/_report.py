"""Where every ``homagg bench`` sweep puts its results: one folder with ``records.json`` (the
report, records under ``"records"``), ``table.md`` (a header line stating machine and load, then
the Markdown table; also printed) and PNG plots (matplotlib, the ``bench`` extra: skipped with a
message when it is missing); ``--json FILE`` gets a copy of the report."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["RETX_KEYS", "counts", "out_folder", "load_range", "write_report", "print_table"]

#: the switch port's retransmission counters every bench reports
RETX_KEYS = ("retransmits", "fast_retransmits", "spurious_retransmits")

Plot = tuple[str, Callable[[Path], None]]  #: (file name, function drawing into that path)



def counts(text: str) -> list[int]:
    """``"1M,25000000,20k"`` -> ints (suffixes k and M): every benchmark's size and count lists."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1].lower(), 1)
        out.append(int(float(part[:-1] if scale != 1 else part) * scale))
    return out

def out_folder(out: str | None, command: str) -> Path:
    """``out``, or ``results/bench-<command>-<time>``; created."""
    folder = Path(out or f"results/bench-{command}-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def print_table(console: Any, table: Any) -> None:
    """Print a rich ``table`` whole: never cut or wrapped (a pipe or a log reports 80 columns, and
    rich would shorten the cells to ``work…``); the console is widened to the table's width."""
    from rich.measure import Measurement

    console.width = max(console.width, Measurement.get(console, console.options.update_width(1 << 12), table).maximum)
    console.print(table)


def load_range(records: Sequence[Mapping[str, Any]]) -> str:
    """``"1-min load A-B"`` over the records' ``load_avg`` (what the machine carried meanwhile)."""
    loads = [r["load_avg"][0] for r in records if r.get("load_avg")]
    return f"1-min load {min(loads):.1f}-{max(loads):.1f}" if loads else "1-min load not recorded"


def write_report(folder: Path, report: Mapping[str, Any], header: str, table: str, *, json_copy: str | None = None,
                 plots: Sequence[Plot] = (), no_plot: bool = False, command: str = "bench") -> None:
    """Write ``records.json``, ``table.md`` and the plots into ``folder``; print header, table and
    the folder."""
    text = json.dumps(report, indent=2)
    (folder / "records.json").write_text(text + "\n")
    if json_copy:
        Path(json_copy).write_text(text + "\n")
    (folder / "table.md").write_text(f"{header}\n\n{table}\n")
    if not no_plot:
        try:
            for name, draw in plots:
                draw(folder / name)
        except ImportError:
            print(f"{command}: matplotlib missing (pip install 'homagg[bench]'): no plot", file=sys.stderr)
    print(header)
    print(table)
    print(f"results in {folder}")
