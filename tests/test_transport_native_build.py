"""The worker's native datapath library: a stale build (made before an entry this version calls)
warns and leaves the Python datapath running, instead of silently losing the native one."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest

from homagg.transport import _fastpath


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build a stand-in library")
def test_a_stale_library_warns_and_is_not_used(tmp_path: Path) -> None:
    src = tmp_path / "old.c"
    # the entries of a build from before the round loop and its small-round entry existed
    src.write_text("long homagg_fp_send(void) { return 0; }\nlong homagg_fp_recv(void) { return 0; }\n")
    lib_path = tmp_path / "_fastpath_kernels.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib_path), str(src)], check=True)
    with pytest.warns(RuntimeWarning, match=r"stale .*homagg_fp_run, homagg_fp_round.*pip install -e \."):
        assert _fastpath._load(ctypes.CDLL(str(lib_path))) is None


def test_the_built_library_loads_without_a_warning() -> None:
    lib = _fastpath._library()
    if lib is None:
        pytest.skip("the native datapath was not built here (no C compiler at install, or HOMAGG_NATIVE=0)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _fastpath._load(lib) is not None
    assert _fastpath.AVAILABLE
