"""The mid-size call's decode while its round is in flight (``homagg_mid_results``, the round's
results hook, and ``homagg_mid_finish``), against the decode after the round (``homagg_mid_decode``,
the reference), bit for bit.

The hook is driven here as the C round loop drives it: a chunk table cut at a word count that is
no multiple of the block size, chunks completing out of order, stream 0 not yet verified.  It may
write an element of the tensor only with its final result: never before stream 0 is verified and
the exponents and guesses are all in, never a block to redo, never past a chunk still missing.
Through UDP ports the whole call is then the general path's (tests/test_mid_calls.py) with the hook
decoding chunks during the rounds (counted here).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import switch_emulator
from homagg.codec import History, _exponent_native, _mid, _mid_native, _native
from homagg.codec._config import CodecConfig
from homagg.codec._protocol import allreduce
from homagg.testing import on_threads
from homagg.transport import ControlClient
from homagg.transport._fastpath import AVAILABLE as DATAPATH
from homagg.transport._roundloop import chunk_table
from tests.test_transport_small_rounds import _close, _ports

pytestmark = pytest.mark.skipif(not (_native.AVAILABLE and _exponent_native.AVAILABLE and _mid_native.OVERLAP),
                                reason="the codec's native kernels (with the mid-size results hook) were not built")

_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
BLOCK = 1024


class _Round:
    """One steady mid-size call of ``world`` ranks on one host: every rank's encode, the switch's
    combination of their words (MAX, MAX, MAX, ADD), and rank 0's kernel with its tensor."""

    def __init__(self, n: int, world: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.sig = sig = _mid._signature(n, "dense", world, BLOCK, "auto", True)
        assert sig is not None and sig.limbs == 1
        xs = [torch.randn(n, generator=gen) * torch.rand(1, generator=gen).item() * 10 for _ in range(world)]
        peak = torch.stack([x.abs() for x in xs]).amax(0)
        peak = torch.nn.functional.pad(peak, (0, sig.blocks * BLOCK - n)).view(sig.blocks, BLOCK).amax(1)
        self.previous = torch.frexp(peak)[1].to(torch.int32)  # last call's agreed exponents: a steady guess
        ins = []
        for r, x in enumerate(xs):
            arrays = [np.zeros(k, dtype=np.int32) for k in sig.lengths]
            kernel = _mid_native.MidKernel(sig, BLOCK, arrays)
            y = x.clone()
            assert kernel.encode(y.data_ptr(), self.previous.data_ptr(), y.data_ptr()) == _mid_native.ENCODED
            ins.append(arrays)
            if r == 0:
                self.kernel, self.x, self.input = kernel, y, x
        self.combined = [np.maximum.reduce([a[j] for a in ins]) for j in range(3)] + [
            np.sum([a[3].astype(np.int64) for a in ins], axis=0).astype(np.int32)]
        self.xs = xs

    def reference(self, combined: list[np.ndarray] | None = None) -> tuple[int, torch.Tensor, tuple[int, int, int]]:
        """The decode after the round on a fresh kernel (no hook): its answer, tensor and figures."""
        arrays = [np.zeros(k, dtype=np.int32) for k in self.sig.lengths]
        kernel = _mid_native.MidKernel(self.sig, BLOCK, arrays)
        y = self.input.clone()
        kernel.encode(y.data_ptr(), self.previous.data_ptr(), y.data_ptr())
        rc = kernel.decode([a.copy() for a in (combined or self.combined)], y.data_ptr())
        return rc, y, kernel.figures()


def _table(sig, words: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = chunk_table(sig.lengths, _mid._OPS, words)
    return tuple(np.ascontiguousarray(t[:, i]) for i in range(3))  # type: ignore[return-value]


class _Driver:
    """Calls the kernel's hook as the C loop does, over ``combined`` and a chunk table of ``words``."""

    def __init__(self, rnd: _Round, combined: list[np.ndarray], words: int) -> None:
        assert rnd.kernel.on_results is not None
        self.hook = _HOOK(rnd.kernel.on_results[0])
        self.ctx = rnd.kernel.on_results[1]
        self.stream, self.off, self.wc = _table(rnd.sig, words)
        self.total = self.stream.size
        self.completed = np.zeros(self.total, dtype=np.uint8)
        self.combined = combined
        self.out = (ctypes.c_void_p * 4)(*[a.ctypes.data for a in combined])
        self.first = int(np.flatnonzero(self.stream == 3)[0])

    def complete(self, ids, verified: bool = True) -> None:
        self.completed[list(ids)] = 1
        self.hook(self.ctx, ctypes.addressof(self.out), self.stream.ctypes.data, self.off.ctypes.data,
                  self.wc.ctypes.data, self.completed.ctypes.data, self.total, int(verified))


@pytest.mark.parametrize(("n", "world", "words"), [(5000, 2, 300), (65543, 3, 1000), (262144, 2, 16000),
                                                    (3000, 4, 7)])
def test_chunks_decode_as_they_come_and_equal_the_decode_after_the_round(n: int, world: int, words: int) -> None:
    rnd = _Round(n, world, seed=n)
    want_rc, want, want_figures = rnd.reference()
    assert want_rc == _mid_native.DECODED
    d = _Driver(rnd, rnd.combined, words)
    before = rnd.x.clone()
    values = list(range(d.first, d.total))
    unchanged = lambda: torch.equal(rnd.x.view(torch.int32), before.view(torch.int32))  # noqa: E731
    d.complete(values[1:2])  # a values chunk before the exponents and guesses: nothing to decode with
    assert unchanged()
    d.complete([*range(d.first), *values[:1]], verified=False)  # stream 0 not verified yet: nothing
    assert unchanged()
    d.complete(values[3:4])  # verified: values[0] and [1] decoded; [3] waits for [2]
    upto = int(d.off[values[2]]) if len(values) > 2 else n
    assert torch.equal(rnd.x[:upto].view(torch.int32), want[:upto].view(torch.int32))
    assert torch.equal(rnd.x[upto:].view(torch.int32), before[upto:].view(torch.int32))
    d.complete(values[2:len(values) // 2 + 1])
    assert rnd.kernel.decode(rnd.combined, rnd.x.data_ptr()) == _mid_native.DECODED  # the rest after the round
    assert rnd.kernel.early == max(len(values) // 2 + 1, 4) or len(values) < 4
    assert torch.equal(rnd.x.view(torch.int32), want.view(torch.int32))
    assert rnd.kernel.figures() == want_figures
    # the oracle: the exact sum within the grid's bound
    exact = torch.stack([x.double() for x in rnd.xs]).sum(0)
    scale = torch.stack([x.abs().double() for x in rnd.xs]).amax(0).max().item()
    assert (rnd.x.double() - exact).abs().max().item() <= scale * 2.0 ** -18


def test_a_fallbacks_results_are_decoded_whole() -> None:
    """Chunks decoded from the switch's arrays, then the round ends on other arrays (a fallback's
    host path: the same words, new arrays): the whole tensor is decoded from those."""
    rnd = _Round(20000, 2, seed=1)
    d = _Driver(rnd, rnd.combined, 512)
    d.complete(range(d.first + 5))
    other = [a.copy() for a in rnd.combined]
    other[3] //= 2  # (other words than the switch's, to tell which arrays were decoded)
    _, want, figures = rnd.reference(other)
    assert rnd.kernel.decode(other, rnd.x.data_ptr()) == _mid_native.DECODED
    assert rnd.kernel.early == 0  # none counted: the decode was the whole one
    assert torch.equal(rnd.x.view(torch.int32), want.view(torch.int32)) and rnd.kernel.figures() == figures


def test_a_block_to_redo_is_never_decoded_during_the_round() -> None:
    """A block whose agreed exponent left its guess's window (another rank's values jumped): the
    hook writes nothing, and the call's decode says REDO with the tensor as it was."""
    rnd = _Round(9000, 2, seed=2)
    rnd.combined[1][3] += 40  # block 3's agreed exponent far above every guess
    want_rc, _, figures = rnd.reference()
    assert want_rc == _mid_native.REDO
    before = rnd.x.clone()
    d = _Driver(rnd, rnd.combined, 256)
    d.complete(range(d.total))
    assert torch.equal(rnd.x.view(torch.int32), before.view(torch.int32))
    assert rnd.kernel.decode(rnd.combined, rnd.x.data_ptr()) == _mid_native.REDO
    assert torch.equal(rnd.x.view(torch.int32), before.view(torch.int32)) and rnd.kernel.figures()[1:] == figures[1:]


def test_a_kernel_without_the_hook_decodes_after_the_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_mid_native, "OVERLAP", False)
    rnd = _Round(5000, 2, seed=3)
    assert rnd.kernel.on_results is None
    _, want, _ = rnd.reference()
    assert rnd.kernel.decode(rnd.combined, rnd.x.data_ptr()) == _mid_native.DECODED
    assert torch.equal(rnd.x.view(torch.int32), want.view(torch.int32))


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


@pytest.mark.skipif(not DATAPATH, reason="the native datapath was not built (no C round loop)")
def test_udp_calls_decode_during_their_rounds(switch, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks' steady mid-size calls through UDP ports (the C loop calling the hook): values
    chunks decoded during the rounds, results equal to the same calls with the hook off."""
    early: list[int] = []
    real = _mid_native.MidKernel.decode

    def counted(self, combined, dst):
        rc = real(self, combined, dst)
        early.append(self.early)
        return rc

    monkeypatch.setattr(_mid_native.MidKernel, "decode", counted)
    n, calls = 70000, 6
    gen = torch.Generator().manual_seed(9)
    inputs = [[torch.randn(n, generator=gen) for _ in range(2)] for _ in range(calls)]

    def run(overlap: bool) -> list[list[torch.Tensor]]:
        monkeypatch.setattr(_mid_native, "OVERLAP", overlap)
        job, ports = _ports(switch, 2, True, k=1000, slots=8)
        histories, cfg = [History(), History()], CodecConfig()
        try:
            def rank(r: int) -> list[torch.Tensor]:
                out = []
                for call in inputs:
                    t = call[r].clone()
                    allreduce(t, ports[r], config=cfg, inplace=True, history=histories[r])
                    out.append(t)
                return out
            return on_threads(rank, 2)
        finally:
            _close(ports)
            ControlClient(switch.control_addr).remove(job.job_id)

    with_hook = run(True)
    hooked, early[:] = list(early), []
    without = run(False)
    assert len(hooked) >= 2 * (calls - 2) and sum(hooked) > 0, hooked  # chunks decoded during rounds
    assert early and not any(early), early
    for r in range(2):
        for i in range(calls):
            assert torch.equal(with_hook[r][i].view(torch.int32), without[r][i].view(torch.int32)), (r, i)
            exact = inputs[i][0].double() + inputs[i][1].double()
            assert (with_hook[r][i].double() - exact).abs().max().item() < 1e-4
