"""``homagg p4 build --target tofino|tofino2``: compile ``p4/tofino/`` with bf-p4c, report resources.

The compiler's own outputs are the oracle: ``bfrt.json`` (tables, registers and their fields, what
a BF Runtime controller programs), ``pipe/logs/resources.json`` / ``phv.json`` (``-g``): stages
and, per stage, stateful ALUs, SRAM and TCAM blocks; PHV containers; and the words aggregated per
pass (parser and Word stages: :mod:`homagg.p4._compiled`).  :func:`summarize` reads them;
nothing here estimates.

The build never deletes a folder it did not create: bf-p4c writes into a fresh folder inside
``out`` and its outputs are then moved into ``out``, replacing only entries that an earlier homagg
Tofino build placed there (their names are kept in ``out/.homagg-tofino-build``) or, in the
default folder ``p4/build/<target>`` (the build's own), entries of the same name.  An entry of
the same name that the build did not place (``--out .`` with a ``source.json`` of the user's, say)
makes it refuse with :class:`BuildError`, before anything is moved; every other file is left alone.

Invariants: a successful :func:`build` returns paths written by this run; ``warnings`` lists
every compiler warning, ``padding_warnings`` those of the compiler's own minimum-parse-depth
padding ("Parser state min_parse_depth_accept_loop ..."), which ``werror`` tolerates (the
program cannot avoid them: docs/p4-tofino.md); any other warning fails a ``werror`` build.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from ..wire import P4_WORDS
from ._compiled import compiled_words
from ._tool import BuildError, find_tool, run_tool
from .source import P4_DIR

__all__ = ["TARGETS", "TofinoBuild", "Resources", "build", "summarize", "bf_p4c", "PADDING", "PLACED",
           "place_outputs", "placed_names"]

BF_P4C = "bf-p4c"
#: target -> (bf-p4c --target, --arch, stages of the device)
TARGETS: dict[str, tuple[str, str]] = {"tofino": ("tofino", "tna"), "tofino2": ("tofino2", "t2na")}
#: the compiler's minimum-parse-depth padding warning, the one warning a build may print
PADDING = re.compile(r"Parser state min_parse_depth_accept_loop will be unrolled")
#: in a build folder: the names of the entries homagg's Tofino build placed there, one a line
PLACED = ".homagg-tofino-build"


@dataclass(frozen=True)
class Resources:
    """What the compiler placed (from its logs); ``stages_used`` of ``stages`` on the device."""

    stages: int
    stages_used: int
    stateful_alus: int
    stateful_alus_total: int
    srams: int
    map_rams: int
    tcams: int
    phv_containers: int
    phv_bits: int
    words_per_pass: int
    parser_words: int
    word_registers: int

    def lines(self) -> list[str]:
        return [f"stages: {self.stages_used} of {self.stages}",
                f"stateful ALUs: {self.stateful_alus} of {self.stateful_alus_total}",
                f"SRAM blocks: {self.srams}, map RAMs: {self.map_rams}, TCAM blocks: {self.tcams}",
                f"PHV: {self.phv_containers} containers, {self.phv_bits} bits",
                f"payload words per pass: {self.words_per_pass} (the parser takes {self.parser_words}, "
                f"{self.word_registers} word registers)"]


@dataclass(frozen=True)
class TofinoBuild:
    target: str
    out: Path
    bfrt: Path
    binary: Path
    log: Path
    warnings: tuple[str, ...]
    padding_warnings: tuple[str, ...]
    seconds: float
    resources: Resources


def bf_p4c() -> str:
    """Path of bf-p4c; :class:`BuildError` when it is not on PATH."""
    return find_tool(BF_P4C, "docs/p4-tofino.md (. /opt/bfp4c/env.sh)")


def summarize(out: Path) -> Resources:
    """:class:`Resources` from a ``-g`` build folder (``bfrt.json``, ``pipe/logs``)."""
    logs = out / "pipe" / "logs"
    try:
        res = json.loads((logs / "resources.json").read_text())["resources"]
        phv = json.loads((logs / "phv.json").read_text())
        words = compiled_words(out)
    except (OSError, KeyError, ValueError, ConfigError) as exc:
        raise BuildError(f"{out}: compiler outputs missing or unreadable ({exc})") from exc
    stages = res["mau"]["mau_stages"]
    used = [s for s in stages if any(s.get(k) for k in ("logical_tables",))
            or s["meter_alus"].get("meters") or s["rams"].get("srams") or s["tcams"].get("tcams")]
    alus = sum(1 for s in stages for m in s["meter_alus"].get("meters", [])
               if any(u.get("used_for") == "stateful_ram" for u in m.get("usages", [])))
    alus_total = sum(int(s["meter_alus"].get("nAlus", 4)) for s in stages) // max(len(stages), 1) * res["mau"]["nStages"]
    srams = sum(1 for s in stages for r in s["rams"].get("srams", []) if r.get("usages"))
    map_rams = sum(1 for s in stages for r in s.get("map_rams", {}).get("maprams", []) if r.get("usages"))
    tcams = sum(1 for s in stages for r in s["tcams"].get("tcams", []) if r.get("usages"))
    containers = phv.get("containers", [])
    return Resources(stages=int(res["mau"]["nStages"]), stages_used=len(used), stateful_alus=alus,
                     stateful_alus_total=alus_total, srams=srams, map_rams=map_rams, tcams=tcams,
                     phv_containers=len(containers), phv_bits=sum(int(c["bit_width"]) for c in containers),
                     words_per_pass=words.per_pass, parser_words=words.parser, word_registers=words.registers)


def build(target: str, out_dir: Path | None = None, *, werror: bool = False, words: int | None = None,
          source: Path | None = None) -> TofinoBuild:
    """Compile ``p4/tofino/homagg_tofino.p4`` for ``target`` with ``-g`` into ``out_dir``.

    ``words`` overrides ``TOFINO_WORDS`` (-D), 1 .. ``P4_WORDS``; raises :class:`BuildError` on a
    failed compile, a program beyond the device (the assembler refuses it), or with ``werror`` a
    warning other than the parse-depth padding; :class:`~homagg.ConfigError` for an unknown
    target or words out of range.
    """
    if target not in TARGETS:
        raise ConfigError(f"unknown Tofino target {target!r}: one of {', '.join(TARGETS)}")
    if words is not None and (isinstance(words, bool) or not isinstance(words, int) or not 1 <= words <= P4_WORDS):
        raise ConfigError(f"words per pass {words!r}: an integer in [1, {P4_WORDS}] (the wire's P4_WORDS)")
    src = source or P4_DIR / "tofino" / "homagg_tofino.p4"
    if not src.is_file():
        raise ConfigError(f"{src} not found")
    exe = bf_p4c()
    out = (out_dir or P4_DIR / "build" / target).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tgt, arch = TARGETS[target]
    name = "tofino.bin" if target == "tofino" else "tofino2.bin"
    staging = Path(tempfile.mkdtemp(prefix=".homagg-tofino-", dir=out))  # bf-p4c writes here only
    try:
        cmd = [exe, "--target", tgt, "--arch", arch, "-g", "-o", str(staging)]
        if words is not None:
            cmd.append(f"-DTOFINO_WORDS={words}")
        cmd.append(str(src))
        ran = run_tool(cmd, staging / "bf-p4c.log")
        ok = ran.returncode == 0 and (staging / "pipe" / name).is_file()
        if not ok:  # keep the log only: the outputs of an earlier build would not be this source's
            for entry in staging.iterdir():
                if entry.name != "bf-p4c.log":
                    _remove(entry)
        place_outputs(staging, out, own_folder=out_dir is None)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # the folder made above: empty unless a move failed
    if not ok:
        raise ran.failure(f"bf-p4c --target {tgt}")
    if werror:
        ran.refuse_warnings(allowed=PADDING)
    warnings = ran.warnings
    padding = tuple(w for w in warnings if PADDING.search(w))
    return TofinoBuild(target, out, out / "bfrt.json", out / "pipe" / name, out / "bf-p4c.log", warnings, padding,
                       ran.seconds, summarize(out))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def placed_names(out: Path) -> set[str]:
    """Names of the entries an earlier build placed in ``out``: those ``PLACED`` lists (plain names
    only); without it, the outputs of a build made before ``PLACED`` existed, which compiled
    straight into ``out`` (:data:`_EARLIER_OUTPUTS`, when ``out/manifest.json`` is bf-p4c's for
    ``homagg_tofino.p4`` with ``-o out``); else none."""
    try:
        lines = (out / PLACED).read_text().splitlines()
    except OSError:
        return _earlier_build(out)
    return {n for n in lines if n and n not in (".", "..", PLACED) and "/" not in n and "\\" not in n}


#: what bf-p4c -g writes for p4/tofino/homagg_tofino.p4, plus the build's log
_EARLIER_OUTPUTS = frozenset({"bf-p4c.log", "bfrt.json", "events.json", "frontend-ir.json", "homagg_tofino.p4pp",
                              "manifest.json", "pipe", "source.json", "stage_adv.log"})


def _earlier_build(out: Path) -> set[str]:
    try:
        command = str(json.loads((out / "manifest.json").read_text()).get("compile_command", ""))
    except (OSError, ValueError, AttributeError):
        return set()
    args = command.split()
    ours = "-o" in args and args.index("-o") + 1 < len(args) and Path(args[args.index("-o") + 1]) == out
    return set(_EARLIER_OUTPUTS) if ours and args[-1].endswith("homagg_tofino.p4") else set()


def place_outputs(staging: Path, out: Path, *, own_folder: bool = False) -> list[str]:
    """Move every entry of ``staging`` into ``out``; returns their names.

    An entry of ``out`` is removed only when a new output takes its name or an earlier build
    placed it (``PLACED``); a same-named entry that no build placed (any entry, in ``own_folder``)
    makes it raise :class:`BuildError` before anything changed.  Nothing else in ``out`` is touched."""
    prev = placed_names(out)
    new = sorted(p.name for p in staging.iterdir())
    clash = [n for n in new if n not in prev and ((out / n).exists() or (out / n).is_symlink())]
    if clash and not own_folder:
        raise BuildError(f"{out}: {', '.join(clash)} already there and not written by a homagg Tofino build: "
                         "refusing to replace (choose another --out, or move them away)")
    for n in sorted(prev | set(new)):
        if (out / n).exists() or (out / n).is_symlink():
            _remove(out / n)
    for n in new:
        (staging / n).rename(out / n)
    (out / PLACED).write_text("".join(n + "\n" for n in new))
    return new
