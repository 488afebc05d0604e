"""Loss, duplication and reordering injected at the emulator: results stay exact and nothing hangs."""

from __future__ import annotations

import time

import pytest

import switch_emulator
from homagg.transport import ControlClient

from homagg.testing import run_on_switch
from tests.test_transport_rto import LOOPS


@pytest.mark.parametrize("native", LOOPS)
@pytest.mark.parametrize("rate", [0.01, 0.05])
def test_exact_under_drop_duplicate_reorder(rate: float, native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both round loops (the workers inherit HOMAGG_NATIVE), each against the same faults."""
    monkeypatch.setenv("HOMAGG_NATIVE", "1" if native else "0")
    faults = switch_emulator.FaultConfig(drop=rate, duplicate=rate, reorder=rate, seed=7)
    with switch_emulator.start(faults=faults) as sw:
        t0 = time.monotonic()
        results = run_on_switch(sw, 4, numel=20000, k=64, slots=16, timeout=20.0)
        assert time.monotonic() - t0 < 120
        c = ControlClient(sw.control_addr).status()["counters"]
    assert c["drop_injected"] > 0 and c["injected_duplicate"] > 0 and c["injected_reorder"] > 0
    assert c["drop_injected_egress"] > 0
    assert sum(r["port_stats"]["retransmits"] for r in results) > 0
    assert c["retransmit_answered"] > 0 and c["drop_duplicate"] > 0
