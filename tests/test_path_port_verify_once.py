"""``SwitchPort.combine_arrays``' verifier contract (``verify`` exactly once per round) through the
process group's :class:`~homagg.torch._fallback.PathPort` when the switch dies *after* the UDP port
verified stream 0 early: the round falls back and is redone on the host path (gloo), which verifies
stream 0 again -- the :class:`~homagg.transport.VerifyOnce` around the caller's ``verify`` runs it
at most once, so the caller still sees one call.

Real parts: the emulator as a child process (killed from inside the first early verify), UDP ports
(the native datapath where it was built), gloo groups on threads.  Oracle: MAX of the ranks' stream
0 and the exact ADD of stream 1.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from homagg import PathWarning
from homagg.testing import on_threads
from homagg.transport import CombineOp, VerifyOnce
from tests.test_transport_small_rounds import _close, killable_path_ports


def test_verify_once_runs_its_verify_at_most_once() -> None:
    """The first call runs ``verify`` (one that raises counts as called); later calls and
    :meth:`VerifyOnce.ensure` do not run it again."""
    seen: list[int] = []
    once = VerifyOnce(lambda w: seen.append(int(w[0])))
    assert not once.called
    once(np.array([7], dtype=np.int32))
    once(np.array([8], dtype=np.int32))
    assert once.ensure([np.array([9], dtype=np.int32)])[0][0] == 9
    assert once.called and seen == [7]

    def refuse(words: np.ndarray) -> None:
        seen.append(-1)
        raise ValueError("out of step")

    once = VerifyOnce(refuse)
    with pytest.raises(ValueError, match="out of step"):
        once(np.zeros(1, dtype=np.int32))
    once(np.zeros(1, dtype=np.int32))
    assert once.called and seen == [7, -1]


def test_path_port_verifies_once_when_the_switch_dies_after_the_early_verify() -> None:
    """Two ranks: stream 0 (one chunk) comes back and is verified early on the switch; that verify
    kills the emulator, so stream 1 (many chunks) never completes; every rank falls back and redoes
    the round on gloo (which verifies its head again).  Results exact; each rank's ``verify`` ran
    exactly once, on stream 0's combined words."""
    world = 2
    emulator, ports = killable_path_ports(world, n_slots=4)
    head = [np.arange(8, dtype=np.int32) * (r + 1) for r in range(world)]
    vals = [np.full(4000, 10 * (r + 1), dtype=np.int32) for r in range(world)]
    seen: list[list[np.ndarray]] = [[] for _ in range(world)]
    kill = threading.Lock()

    def verify(r: int, words: np.ndarray) -> None:
        seen[r].append(words.copy())
        if kill.acquire(blocking=False):  # the first early verify: the switch dies mid-round
            emulator.process.kill()
            emulator.process.wait(10)

    try:
        with pytest.warns(PathWarning, match="host path"):
            out = on_threads(lambda r: ports[r].combine_arrays([CombineOp.MAX, CombineOp.ADD], [head[r], vals[r]],
                                                               lambda w, r=r: verify(r, w)), world, timeout=60)
        assert kill.locked(), "no early verify on the switch: the round did not test the fallback after it"
        for o in out:
            assert np.array_equal(o[0], head[1]) and np.array_equal(o[1], np.full(4000, 30))
        assert [p.path for p in ports] == ["host"] * world
        for r, s in enumerate(seen):
            assert len(s) == 1, f"rank {r}: verify called {len(s)} times in one round"
            assert np.array_equal(s[0], head[1])
    finally:
        _close(ports)
        emulator.stop()
