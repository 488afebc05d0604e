"""End to end over UDP on loopback: worker processes -> emulator -> every scheme, exact results."""

from __future__ import annotations


import numpy as np
import pytest
import torch

import switch_emulator
from homagg import CombineOp, Stream
from homagg.testing import check_combine, on_threads, run_on_switch
from homagg._errors import ConfigError
from homagg.transport import ControlClient, UdpSwitchPort

@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


@pytest.mark.parametrize("world", [2, 5, 8])
def test_every_scheme_exact_over_udp(switch, world: int) -> None:
    run_on_switch(switch, world, numel=12000 if world == 8 else 20000)
    st = ControlClient(switch.control_addr).status()
    assert st["jobs"] == []


def test_raw_streams_every_op_many_rounds(switch) -> None:
    """Word streams of every op and odd lengths, many rounds through a small window (slot reuse)."""
    world, ctl = 3, ControlClient(switch.control_addr)
    job = ctl.admit(world, n_slots=3, words_per_packet=7)
    ports = [UdpSwitchPort(switch.data_addr, job=job, rank=r, control=switch.control_addr, timeout=10)
             for r in range(world)]
    rng = np.random.default_rng(1)
    ops = [CombineOp.ADD, CombineOp.OR, CombineOp.MAX, CombineOp.ADD]
    try:
        for rnd in range(12):
            sizes = [int(rng.integers(0, 60)), 1, 0, int(rng.integers(1, 30))]
            data = [[torch.from_numpy(rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)) for n in sizes]
                    for _ in range(world)]
            res = check_combine(ports, data, ops)
            assert all(t.dtype == torch.int32 for per_rank in res for t in per_rank), rnd
    finally:
        for p in ports:
            p.close()
        ctl.remove(job.job_id)


def test_result_arrays_recycled_only_when_unreferenced(switch) -> None:
    """Results the caller still holds (tensor, view, numpy) are never overwritten; dropped ones are reused."""
    world, ctl = 2, ControlClient(switch.control_addr)
    job = ctl.admit(world, n_slots=4, words_per_packet=16)
    ports = [UdpSwitchPort(switch.data_addr, job=job, rank=r, control=switch.control_addr, timeout=10)
             for r in range(world)]
    n = 100

    def round_(v: int) -> list:
        return on_threads(lambda r: ports[r].combine([Stream("x", CombineOp.ADD, torch.full((n,), v + r, dtype=torch.int32))])[0],
                          world)

    try:
        held = round_(1)  # tensors
        view = round_(10)[0][3:7]  # a view of rank 0's result
        arr = round_(100)[0].numpy()
        ptrs = {held[0].data_ptr(), view.data_ptr() - 3 * 4, arr.ctypes.data}
        for v in (1000, 2000, 3000):
            res = round_(v)
            assert torch.equal(res[0], torch.full((n,), 2 * v + 1, dtype=torch.int32))
            assert res[0].data_ptr() not in ptrs
        assert torch.equal(held[0], torch.full((n,), 3, dtype=torch.int32))
        assert torch.equal(view, torch.full((4,), 21, dtype=torch.int32))
        assert (arr == 201).all()
        del res
        a = round_(1)[0]
        b = round_(2)[0]
        a_ptr = a.data_ptr()
        del a
        c = round_(3)[0]  # ``a``'s array is free again: recycled
        assert c.data_ptr() == a_ptr and torch.equal(c, torch.full((n,), 7, dtype=torch.int32))
        assert torch.equal(b, torch.full((n,), 5, dtype=torch.int32))
    finally:
        for p in ports:
            p.close()
        ctl.remove(job.job_id)


def test_port_rejects_bad_config(switch) -> None:
    with pytest.raises(ConfigError):
        UdpSwitchPort(switch.data_addr, rank=0)
    with pytest.raises(ConfigError):
        UdpSwitchPort(switch.data_addr, rank=3, job_id=1, world_size=2)
    with pytest.raises(ConfigError, match="not admitted"):
        UdpSwitchPort(switch.data_addr, rank=0, job_id=999, world_size=2, control=switch.control_addr)
