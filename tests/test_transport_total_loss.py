"""Total loss: a switch that answers its control port and holds the job but forwards nothing.

Real parts: an emulator child (``switch_emulator.spawn``) with its fault injection set to drop
every datagram, and worker ports over UDP (both round loops).  Oracle: the round must end in a
:class:`homagg.SwitchTimeoutError` that says what was seen (the job's accepted count did not move,
the switch's counters that did) within seconds, not at the port's 30 s progress timeout; and a
stall the switch *does* see (a late peer: this worker's retransmissions arrive) must not be taken
for total loss: the round completes with the exact sum.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

import switch_emulator
from homagg import SwitchTimeoutError
from homagg.transport import CombineOp, ControlClient, Stream, UdpSwitchPort
from tests.test_transport_rto import LOOPS


@pytest.mark.parametrize("native", LOOPS)
def test_a_switch_that_forwards_nothing_is_found_in_seconds(native: bool) -> None:
    words = torch.arange(100_000, dtype=torch.int32)
    with switch_emulator.spawn(allow_faults=True, engine="python") as sw:
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            job = ctl.admit(1, n_slots=16, words_per_packet=2048)
            with UdpSwitchPort(sw.data_addr, rank=0, job=job, control=sw.control_addr, secret=sw.secret,
                               timeout=30.0, multicast=False, native=native) as port:
                (out,) = port.combine([Stream("x", CombineOp.ADD, words)])
                assert torch.equal(out, words)  # the switch works
                ctl.set_faults(drop=1.0)
                t0 = time.monotonic()
                with pytest.raises(SwitchTimeoutError) as err:
                    port.combine([Stream("x", CombineOp.ADD, words)])
                waited = time.monotonic() - t0
                assert any(j["job_id"] == job.job_id for j in ctl.status()["jobs"])  # it still holds the job
    message = str(err.value)
    assert "holds this job but accepted none of its datagrams" in message, message
    assert "drop_injected +" in message and "rx +" in message, message  # what the switch counted
    assert waited < 10.0, waited  # ~1.5 s (two probes a second apart), not the 30 s progress timeout


@pytest.mark.parametrize("native", LOOPS)
def test_a_late_peer_is_not_total_loss(native: bool) -> None:
    """Rank 0 stalls 3 s waiting for rank 1 in the second round: its retransmissions reach the switch
    (the job's count moves), so the round waits and completes exactly."""
    world, late_s = 2, 3.0
    data = [torch.arange(50_000, dtype=torch.int32) * (r + 1) for r in range(world)]
    with switch_emulator.spawn() as sw:
        with ControlClient(sw.control_addr, secret=sw.secret) as ctl:
            job = ctl.admit(world, n_slots=16, words_per_packet=2048)
        ports = [UdpSwitchPort(sw.data_addr, rank=r, job=job, control=sw.control_addr, secret=sw.secret,
                               timeout=30.0, multicast=False, native=native) for r in range(world)]
        outs: list = [None] * world

        def run(r: int) -> None:
            try:
                outs[r] = ports[r].combine([Stream("x", CombineOp.ADD, data[r])])[0]
            except Exception as exc:  # noqa: BLE001 - reported below
                outs[r] = exc

        try:
            for late in (0.0, late_s):  # a first round together (the ports measure the RTT), then one late
                first = threading.Thread(target=run, args=(0,))
                first.start()
                time.sleep(late)
                run(1)
                first.join(60)
                for r in range(world):
                    assert isinstance(outs[r], torch.Tensor), outs[r]
                    assert torch.equal(outs[r], data[0] + data[1])
            retransmits, probes = ports[0].stats["retransmits"], ports[0].stats.get("loss_probes", 0)
        finally:
            for p in ports:
                p.close()
    assert retransmits >= 3  # rank 0 resent while it waited: the total-loss rule was asked, and said no
    assert 4 <= probes <= 8, probes  # its probes: at the stall's first sighting, then at most every 2 s
