"""What the two P4 builds share: the compiler found on PATH, run once, its output logged, its
warnings picked out, and :class:`BuildError`, which both raise.

:mod:`homagg.p4._build` (``p4c-bm2-ss``, BMv2) and :mod:`homagg.p4._tofino` (``bf-p4c``) both
import this module and not each other's internals.

Invariants: :func:`run_tool` writes the log (the command line, then everything the tool printed)
before it returns, whatever the exit status; a line is a warning when it holds the word
"warning" (any case), an error line when it holds "error".
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .._errors import HomAggError

__all__ = ["BuildError", "ToolRun", "find_tool", "run_tool"]

_WARNING = re.compile(r"\bwarning\b", re.I)


class BuildError(HomAggError):
    """A P4 compiler is missing, failed, or (with ``werror``) warned."""


def find_tool(name: str, where: str) -> str:
    """The path of ``name`` on PATH; :class:`BuildError` saying ``where`` to get it otherwise."""
    exe = shutil.which(name)
    if exe is None:
        raise BuildError(f"{name} not on PATH; see {where}")
    return exe


@dataclass(frozen=True)
class ToolRun:
    """One run of a compiler: its command line, exit status, output (stdout then stderr) and
    duration."""

    cmd: tuple[str, ...]
    returncode: int
    text: str
    seconds: float

    @property
    def warnings(self) -> tuple[str, ...]:
        return tuple(line for line in self.text.splitlines() if _WARNING.search(line))

    def failure(self, what: str, *, whole: bool = False) -> BuildError:
        """The error for a failed run: ``what`` and the exit status, then the tool's error lines
        (all of its output with ``whole``, or when no line says "error")."""
        errors = [] if whole else [line for line in self.text.splitlines() if "error" in line.lower()]
        return BuildError(f"{what} failed (exit {self.returncode}):\n" + "\n".join(errors or [self.text.strip()]))

    def refuse_warnings(self, allowed: re.Pattern[str] | None = None) -> None:
        """:class:`BuildError` listing the warnings ``allowed`` does not match (``werror``)."""
        other = [w for w in self.warnings if allowed is None or not allowed.search(w)]
        if other:
            raise BuildError("compiler warnings:\n" + "\n".join(other))


def run_tool(cmd: list[str], log: Path) -> ToolRun:
    """Run ``cmd`` to the end (output captured, no input) and write ``log``."""
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    run = ToolRun(tuple(cmd), proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)
    log.write_text(" ".join(cmd) + "\n" + run.text)
    return run
