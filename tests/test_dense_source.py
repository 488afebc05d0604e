"""The dense words quantised straight into datagrams (:mod:`homagg.codec._dense_source`).

Oracles: ``QuantizedWords.materialize()`` (the codec's quantise pass, itself checked against the
torch code in test_dense_kernels.py) big-endian, bit for bit, for any chunking; the bytes a port
puts on the wire with the native datapath (which takes the fill function) equal those of the
Python datapath (which takes the materialised words); a whole dense allreduce through the
emulator equals the float64 sum within the bound and equals the in-process switch's result.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import homagg
from homagg.codec import _native
from homagg.codec._blocks import exponents as block_exponents
from homagg.codec._dense_source import QuantizedWords, fills_natively
from homagg.testing import run_on_switch
from homagg.transport import CombineOp, Stream, UdpSwitchPort
from homagg.transport._fastpath import AVAILABLE as DATAPATH
from tests.test_transport_rto import FakeSwitch

pytestmark = pytest.mark.skipif(not _native.AVAILABLE, reason="the native kernels were not built (no C compiler)")

_FILL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def _filled(src: QuantizedWords, cuts: list[int]) -> np.ndarray:
    """The words the fill function writes, chunk by chunk at ``cuts``, read back as host int32."""
    fn, ctx = src.native_fill()  # type: ignore[misc]
    fill = _FILL(fn)
    out = np.zeros(4 * src.length + 4, dtype=np.uint8)
    bounds = [0, *sorted(c for c in cuts if 0 < c < src.length), src.length]
    for lo, hi in zip(bounds, bounds[1:]):
        fill(ctx, out.ctypes.data + 4 * lo, lo, hi - lo)
    assert not out[4 * src.length:].any(), "wrote past its chunk"
    return out[:4 * src.length].view(">i4").astype(np.int32)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5000),
    block=st.sampled_from([1, 7, 64, 100, 1024]),
    world=st.sampled_from([1, 2, 4, 5, 128, 256]),
    spread=st.integers(-125, 100),
    guess=st.integers(-3, 6),
    cuts=st.lists(st.integers(0, 5000), max_size=12),
    seed=st.integers(0, 2**31),
)
def test_fill_equals_the_materialised_words_for_any_chunking(n, block, world, spread, guess, cuts, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 20, (n,), generator=g).float())
         * 2.0**spread).float() * (torch.rand(n, generator=g) < 0.8)
    exps = block_exponents(x, block)
    # a guessed exponent may sit below a block's own (words clamp) or far above it (tiny words)
    exps = torch.where(exps == homagg.codec._fixedpoint.EMPTY_EXPONENT, exps, exps + guess)
    src = QuantizedWords(x, exps, world, block)
    assert fills_natively(x)
    want = src.materialize().numpy()
    assert np.array_equal(_filled(src, cuts), want)


def test_no_native_fill_for_what_the_kernel_does_not_take() -> None:
    assert not fills_natively(torch.ones(10, dtype=torch.float64))
    assert not fills_natively(torch.ones(10, 2)[:, 0])  # not contiguous
    src = QuantizedWords(torch.ones(10, dtype=torch.float64), torch.zeros(1, dtype=torch.int32), 2, 1024)
    assert src.native_fill() is None and src.materialize().dtype == torch.int32


@pytest.mark.skipif(not DATAPATH, reason="the native datapath was not built")
@pytest.mark.parametrize("numel", [1000, 123_457])
def test_a_port_sends_the_same_bytes_from_a_source_as_from_its_words(numel: int) -> None:
    x = torch.randn(numel) * 1e3
    exps = block_exponents(x, 1024)
    got, wires = {}, {}
    for native in (False, True):
        fake = FakeSwitch(lambda i, h: [(0.0, 1)])
        try:
            with UdpSwitchPort(fake.addr, rank=0, job_id=1, world_size=1, n_slots=32, words_per_packet=500,
                               timeout=20.0, native=native) as port:
                src = QuantizedWords(x, exps, 4, 1024)
                (got[native],) = port.combine([Stream("values", CombineOp.ADD, None, source=src)])
        finally:
            fake.close()
        wires[native] = sorted(fake.received)
    want = QuantizedWords(x, exps, 4, 1024).materialize()
    assert torch.equal(got[True], want) and torch.equal(got[False], want)
    assert wires[True] == wires[False]


def test_a_stream_takes_words_or_a_source_not_both() -> None:
    x = torch.ones(4)
    src = QuantizedWords(x, block_exponents(x, 1024), 2, 1024)
    with pytest.raises(homagg.ProtocolError, match="exactly one"):
        Stream("v", CombineOp.ADD, torch.zeros(4, dtype=torch.int32), source=src)
    with pytest.raises(homagg.ProtocolError, match="exactly one"):
        Stream("v", CombineOp.ADD, None)
    s = Stream("v", CombineOp.ADD, None, source=src)
    assert s.length == 4 and s.device == x.device and torch.equal(s.materialize(), src.materialize())


def test_dense_allreduce_over_the_emulator_equals_the_in_process_switch() -> None:
    """Worker processes through the UDP emulator (the native datapath quantises the words into the
    datagrams) give the in-process switch's result (materialised words), bit for bit, every worker."""
    import switch_emulator

    with switch_emulator.start() as sw:
        reports = run_on_switch(sw, 4, numel=200_000, density=1.0, k=512, slots=32, schemes=["dense"])
    assert len(reports) == 4 and all(r["dense"]["schemes"].get("dense") for r in reports)  # dense ran everywhere
