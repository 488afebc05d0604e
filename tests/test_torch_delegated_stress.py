"""Stress: every op homagg runs on gloo, thousands of times across 3 and 4 ranks, CPU loaded (issue 13).

Before the fix, ``all_reduce_coalesced``, ``all_to_all_single`` and ``reduce_scatter`` deadlocked
within a few iterations (this script, 3 ranks, 100 iterations, CPU loaded: 3 hangs in 3 runs) (torch's trampoline entered gloo's ``enqueue`` with the GIL held while a
gloo thread held the queue lock and waited for the GIL to free the previous work's tensors).  The
launcher's own timeout fails the test on a hang (and names the ranks still running); every result
is compared in the rank with its closed-form value, and the counts prove every op ran every time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "_dist_scripts"))
from _launch import launch  # noqa: E402

OPS = ["allreduce_coalesced", "allgather_coalesced", "reduce", "gather", "scatter", "all_to_all",
       "all_to_all_single", "reduce_scatter", "reduce_scatter_tensor", "send_recv", "private_max"]
#: iterations of every op per world size: 11 ops x 100 x 3 ranks + 11 x 60 x 4 = 5940 calls in all
ITERS = {3: 100, 4: 60}
TIMEOUT_S = 240.0  # a hang fails here; the loops take ~15-30 s, start-up is the rest (slow on a loaded VM)


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """One busy process per core for the duration of the test."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)


@pytest.mark.parametrize("world", [3, 4])
def test_delegated_ops_never_hang_and_give_exact_values(world: int, cpu_load: None) -> None:
    t0 = time.monotonic()
    results, _ = launch("delegated_stress.py", world, env={"STRESS_ITERS": str(ITERS[world])}, timeout=TIMEOUT_S)
    elapsed = time.monotonic() - t0
    for rank, res in enumerate(results):
        assert res["n_mismatches"] == 0, (rank, res["mismatches"])
        assert res["counts"] == {op: ITERS[world] for op in OPS}, (rank, res["counts"])
    print(f"world {world}: {len(OPS) * ITERS[world]} ops per rank in {elapsed:.1f}s")
