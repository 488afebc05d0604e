"""``homagg p4 build``: compile ``p4/homagg.p4`` with ``p4c-bm2-ss`` into ``p4/build/``
(``--target tofino|tofino2``: ``p4/tofino/`` with bf-p4c, :mod:`homagg.p4._tofino`).

Outputs (the build folder is git-ignored): ``homagg.json`` (the BMv2 configuration) and
``homagg.p4info.txtpb`` (P4Info, protobuf text format), plus ``p4c.log`` with the compiler's
messages.  With ``--werror`` (used by the tests) any compiler warning fails the build.

Invariant: a successful :func:`build` returns paths that exist and were written by this run.
"""

from __future__ import annotations

import argparse
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .._errors import ConfigError
from . import _tofino
from ._tool import BuildError, find_tool, run_tool
from .source import P4_DIR

__all__ = ["BuildError", "BuildResult", "build", "default_build_dir", "configure_parser", "run"]

P4C = "p4c-bm2-ss"
_WHERE = "README.md, section 'Getting p4c and BMv2'"


@dataclass(frozen=True)
class BuildResult:
    json: Path
    p4info: Path
    log: Path
    warnings: tuple[str, ...]
    compiler_version: str


def default_build_dir() -> Path:
    return P4_DIR / "build"


def compiler_version(p4c: str = P4C) -> str:
    exe = find_tool(p4c, _WHERE)
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False)
    return (out.stdout or out.stderr).strip().splitlines()[-1] if (out.stdout or out.stderr) else "unknown"


def build(out_dir: Path | None = None, *, werror: bool = False, p4c: str = P4C,
          source: Path | None = None) -> BuildResult:
    """Compile the program; raise :class:`BuildError` with the compiler's output on failure."""
    src = source or P4_DIR / "homagg.p4"
    if not src.is_file():
        raise ConfigError(f"{src} not found")
    exe = find_tool(p4c, _WHERE)
    out = (out_dir or default_build_dir()).resolve()
    out.mkdir(parents=True, exist_ok=True)
    json_path, p4info, log = out / "homagg.json", out / "homagg.p4info.txtpb", out / "p4c.log"
    for stale in (json_path, p4info):
        stale.unlink(missing_ok=True)
    cmd = [exe, "--std", "p4-16", "--target", "bmv2", "--arch", "v1model",
           "-I", str(src.parent), "-o", str(json_path),
           "--p4runtime-files", str(p4info), str(src)]
    if werror:
        cmd.insert(1, "--Werror")
    ran = run_tool(cmd, log)
    if ran.returncode != 0 or not json_path.is_file() or not p4info.is_file():
        raise ran.failure(p4c, whole=True)
    if werror:
        ran.refuse_warnings()
    return BuildResult(json_path, p4info, log, ran.warnings, compiler_version(p4c))


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="build folder (default: p4/build)")
    parser.add_argument("--werror", action="store_true", help="treat compiler warnings as errors")
    parser.add_argument("--p4c", default=P4C, help="compiler executable (default: %(default)s)")
    parser.add_argument("--target", choices=("bmv2", "tofino", "tofino2"), default="bmv2",
                        help="bmv2: p4/homagg.p4 with p4c-bm2-ss; tofino/tofino2: p4/tofino/ with bf-p4c, "
                             "then the compiler's resource summary (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "target", "bmv2") != "bmv2":
        tb = _tofino.build(args.target, args.out, werror=args.werror)
        for w in tb.warnings:
            print(w)
        print(f"built for {tb.target} in {tb.seconds:.1f} s: {tb.binary}\n  {tb.bfrt}")
        for line in tb.resources.lines():
            print("  " + line)
        return 0
    res = build(args.out, werror=args.werror, p4c=args.p4c)
    for w in res.warnings:
        print(w)
    print(f"built with {res.compiler_version}:\n  {res.json}\n  {res.p4info}")
    return 0
