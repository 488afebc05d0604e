"""Mininet access for any interpreter, and cleanup.

Debian installs Mininet for the system Python only (``/usr/lib/python3/dist-packages``).  The
project's interpreter (e.g. pyenv) gets it by *appending* that folder to ``sys.path`` — appended,
so the project's own packages always win over the distribution's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

__all__ = ["DIST_PACKAGES", "import_mininet", "mininet_missing", "cleanup"]

DIST_PACKAGES = (Path("/usr/lib/python3/dist-packages"),)


def import_mininet() -> ModuleType:
    """Import and return the ``mininet`` package (ImportError if not installed anywhere)."""
    try:
        import mininet
    except ImportError:
        for d in DIST_PACKAGES:
            if (d / "mininet" / "__init__.py").is_file() and str(d) not in sys.path:
                sys.path.append(str(d))
        import mininet
    return mininet


def mininet_missing() -> str | None:
    """Why Mininet cannot run here, or None."""
    if os.geteuid() != 0:
        return "Mininet needs root"
    if shutil.which("mn") is None or shutil.which("mnexec") is None:
        return "Mininet (Debian package 'mininet') is not installed"
    try:
        import_mininet()
    except ImportError:
        return "the mininet Python package is not importable"
    return None


def cleanup() -> None:
    """``mn -c`` grade cleanup: stray namespaces, links, switches, controllers of Mininet."""
    try:
        import_mininet()
        from mininet.clean import cleanup as mn_cleanup
        from mininet.log import setLogLevel

        setLogLevel("warning")
        mn_cleanup()
    except Exception:  # noqa: BLE001 - fall back to the command line tool
        if shutil.which("mn"):
            subprocess.run(["mn", "-c"], capture_output=True, check=False, timeout=120)
