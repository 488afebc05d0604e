"""Finding homagg's optional C libraries: a built extension next to the module that uses it.

``pip install`` compiles them (setup.py) where a C compiler is there; each is plain C loaded with
ctypes, so a missing or unloadable library means "use the Python/numpy path", never an error.
``HOMAGG_NATIVE=0`` in the environment turns the codec's kernels and the worker's datapath off
(to compare the paths); the emulator chooses its engine with ``--engine`` instead.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from pathlib import Path

__all__ = ["load_library"]


def load_library(module_file: str, name: str, *, honour_env: bool = True) -> ctypes.CDLL | None:
    """The extension ``name`` built beside ``module_file`` (any of this interpreter's extension
    suffixes), loaded; None where it is absent, fails to load or ``HOMAGG_NATIVE=0`` says so."""
    if honour_env and os.environ.get("HOMAGG_NATIVE", "1") == "0":
        return None
    here = Path(module_file).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"{name}{suffix}"
        if path.exists():
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                return None
    return None
