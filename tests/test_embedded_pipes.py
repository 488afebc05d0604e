"""An embedded emulator leaves no open pipe behind: stopped, or found dead and replaced.

Before: ``RunningSwitch.stop`` never closed the child's stdout, and a killed embedded emulator was
dropped without ``stop()`` (the chaos soak logged two ResourceWarnings per dead emulator)."""

from __future__ import annotations

import switch_emulator
from homagg.torch import _udp_link


def test_stop_closes_the_childs_pipes() -> None:
    sw = switch_emulator.spawn(listen=("127.0.0.1", 0), control=("127.0.0.1", 0), timeout=30.0)
    proc = sw.process
    assert proc is not None and proc.poll() is None
    sw.stop()
    assert proc.poll() is not None
    assert proc.stdin is None or proc.stdin.closed
    assert proc.stdout is None or proc.stdout.closed


def test_a_dead_embedded_emulator_is_reaped_when_replaced() -> None:
    first = _udp_link._acquire_emulator("127.0.0.1")
    try:
        assert first.process is not None
        first.process.kill()
        first.process.wait(10)
        second = _udp_link._acquire_emulator("127.0.0.1")
        try:
            assert second is not first and second.process.poll() is None
            assert first.process.stdout is None or first.process.stdout.closed
            assert first.process.stdin is None or first.process.stdin.closed
        finally:
            _udp_link._release_emulator("127.0.0.1", second)
    finally:
        _udp_link._release_emulator("127.0.0.1", first)  # replaced: only reaped
