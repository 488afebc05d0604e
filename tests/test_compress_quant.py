"""Homomorphic quantisers: packing, scale agreement, the reference sum in-process and through the
emulator, steady state (guess/settle), unbiasedness and variance with a shared vs an own scale."""

from __future__ import annotations

import math

import pytest
import torch

import homagg
import switch_emulator
from homagg.codec._blocks import exponents as codec_exponents
from homagg.codec._fixedpoint import EMPTY_EXPONENT
from homagg.compress import QSGD, Compressor, OneBit, TernGrad, TwoBit, lane_bits, pack, scale_codes, scales, unpack
from homagg.compress._base import generator
from homagg.testing import on_threads
from homagg.transport import ControlClient, InProcessSwitch, UdpSwitchPort, combine_words
from homagg.wire import CombineOp

SPECS = ["onebit", "twobit", "terngrad", "qsgd:levels=16", "qsgd:levels=3,norm=max,steps=1", "terngrad:block=100"]


@pytest.mark.parametrize("world, umax", [(2, 1), (4, 2), (8, 32), (3, 2**20)])
def test_packed_lanes_add_without_carries(world: int, umax: int) -> None:
    bits = lane_bits(world, umax)
    gen = torch.Generator().manual_seed(world)
    codes = [torch.randint(0, umax + 1, (1001,), generator=gen) for _ in range(world)]
    codes[0][:50] = umax  # lanes at their maximum
    codes[1][:50] = umax
    total = combine_words(CombineOp.ADD, [pack(c, bits) for c in codes])
    assert torch.equal(unpack(total, bits, 1001), sum(codes))
    assert pack(codes[0], bits).numel() == math.ceil(1001 / (32 // bits))


def test_scale_codes_bracket_and_match_codec_exponents() -> None:
    sigma = torch.cat([torch.rand(1000, dtype=torch.float64) * 10.0 ** torch.randint(-30, 30, (1000,)),
                       2.0 ** torch.arange(-60, 60, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)])
    for steps in (1, 3, 4, 16):
        k = scale_codes(sigma, steps)
        pos = sigma > 0
        assert bool((k[~pos] == EMPTY_EXPONENT).all()) and bool((scales(k, steps)[~pos] == 0).all())
        assert bool((scales(k[pos], steps) > sigma[pos]).all())
        assert bool((scales(k[pos] - 1, steps) <= sigma[pos]).all())
    x = torch.randn(10 * 1024, dtype=torch.float32) * 10.0 ** torch.randint(-5, 5, (10 * 1024,))
    x[2048:3072] = 0
    sig = x.view(10, 1024).abs().amax(dim=1).to(torch.float64)
    assert torch.equal(scale_codes(sig, 1), codec_exponents(x, 1024))  # R=1, max|x|: the codec's exponents


def reference(spec: str, xs: list[torch.Tensor], key, step: int,
              prev: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The sum (float64) and each worker's value, from the documented formulas, in one process: per
    worker an integer ``q`` (value ``s*q/d``); the sum is ``s * (sum of q) / d``, one rounding.

    ``prev``: the previous call's agreed codes (steady state): a block whose contributors' guesses
    ``max(prev, own)`` all agree uses that guess, else the fresh maximum."""
    comp = Compressor(spec)
    q = comp.quantizer
    n, b = xs[0].numel(), q.block
    nb = -(-n // b)
    pads = [torch.cat([x.to(torch.float64), torch.zeros(nb * b - n, dtype=torch.float64)]).view(nb, b) for x in xs]
    counts = torch.tensor([min(b, n - i * b) for i in range(nb)], dtype=torch.float64)
    if isinstance(q, (OneBit, TwoBit)):
        local = [p.abs().sum(1) / counts for p in pads]
    elif isinstance(q, QSGD) and q.norm == "l2":
        local = [p.pow(2).sum(1).sqrt() for p in pads]
    else:
        local = [p.abs().amax(1) for p in pads]
    own = torch.stack([scale_codes(s, q.steps) for s in local])
    k = own.amax(0)
    if prev is not None and not isinstance(q, OneBit):
        held = own != EMPTY_EXPONENT
        guesses = torch.where(held, torch.maximum(own, prev), own)
        hi = torch.where(held, guesses, torch.full_like(guesses, -(2**31))).amax(0)
        lo = torch.where(held, guesses, torch.full_like(guesses, 2**31 - 1)).amin(0)
        k = torch.where(held.any(0) & (hi == lo), hi, k)
    s = scales(k, q.steps).unsqueeze(1)
    safe = torch.where(s > 0, s, torch.ones_like(s))
    values, qs = [], []
    d = q.levels if isinstance(q, QSGD) else 1
    for r, p in enumerate(pads):
        noise = torch.rand(p.shape, dtype=torch.float64, generator=generator(p.device, q.name, q.seed, str(key), step, r))
        if isinstance(q, OneBit):
            qi = torch.where(p >= 0, 1.0, -1.0).to(torch.float64)
        elif isinstance(q, TwoBit):
            qi = torch.round(p / safe).clamp(-1, 1)
        elif isinstance(q, TernGrad):
            qi = torch.sign(p) * (noise < p.abs() / safe)
        else:
            r_ = p.abs() / safe * q.levels
            qi = torch.sign(p) * (torch.floor(r_) + (noise < r_ - torch.floor(r_)))
        qs.append(qi)
        values.append((s * qi / d).reshape(-1)[:n])
    return (s * sum(qs) / d).reshape(-1)[:n], values


def _grads(world: int, n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, generator=gen) * (1 + r) for r in range(world)]
    xs[0][: min(n, 300)] = 0  # a block one worker leaves empty
    for x in xs:
        x[-min(n, 200):] = 0  # an all-empty tail
    return xs


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("world", [2, 3])
def test_in_process_equals_reference_bitwise(spec: str, world: int) -> None:
    n = 5000
    xs = _grads(world, n, seed=world)
    comps = [Compressor(spec) for _ in range(world)]
    sw = InProcessSwitch(world)
    res = on_threads(lambda r: comps[r].allreduce(xs[r].clone().to(torch.float64), sw.port(r), key="g"), world)
    want, values = reference(spec, xs, "g", 0)
    for r in range(world):
        assert torch.equal(res[r], want), f"worker {r}"
        if comps[r].feedback is not None:  # own contribution + residual == input
            assert torch.equal(values[r] + comps[r].feedback.residual("g"), xs[r].to(torch.float64))


@pytest.mark.parametrize("spec", ["terngrad", "qsgd:levels=16", "twobit:ef=0", "onebit:ef=0"])
def test_steady_state_one_round_and_equal_to_reference(spec: str) -> None:
    """With history: one round per call while no block's scale rises above the last agreed one
    (shrinking gradients keep the previous, larger scale); a jump costs one redo round of the
    blocks that rose.  Every call equals the reference with the documented scale rule."""
    world, n = 3, 8192
    comps = [Compressor(spec) for _ in range(world)]
    hist = [homagg.History() for _ in range(world)]
    stats = [homagg.WorkerStats() for _ in range(world)]
    sw = InProcessSwitch(world)
    base = _grads(world, n, seed=100)
    prev = None
    for t in range(6):
        factor = 0.9**t * (8.0 if t == 3 else 1.0)  # shrinking, with a jump at t = 3
        xs = [x * factor for x in base]
        res = on_threads(lambda r: comps[r].allreduce(xs[r].clone(), sw.port(r), key=5, stats=stats[r],
                                                      history=hist[r]), world)
        want, _ = reference(spec, xs, 5, t, prev)
        assert all(torch.equal(r_, want.to(torch.float32)) for r_ in res), t
        prev = hist[0].get(("homagg.compress", comps[0].quantizer.name, "5", n, world, 1024, 4)).exponents
    if spec.startswith("onebit"):
        assert stats[0].rounds == 6 and stats[0].redos == 0  # scale and sign codes share one round
    else:
        assert stats[0].rounds == 2 + 5 + 1 and stats[0].redos == 1  # first call 2; the jump 1 redo


def test_code_bytes_are_packed() -> None:
    world, n = 4, 1 << 14
    for spec, per_word in (("onebit", 10), ("terngrad", 8), ("qsgd:levels=16", 4)):
        comps = [Compressor(spec) for _ in range(world)]
        stats = [homagg.WorkerStats() for _ in range(world)]
        sw = InProcessSwitch(world)
        on_threads(lambda r: comps[r].allreduce(torch.randn(n), sw.port(r), stats=stats[r]), world)
        assert stats[0].bytes_per_stream["qcodes"] == 4 * math.ceil(n / per_word), spec
        assert stats[0].bytes_per_stream["qscale"] == 4 * (n // 1024)


@pytest.mark.parametrize("spec", ["terngrad", "qsgd:levels=16", "onebit:ef=0"])
def test_through_the_emulator_equals_reference(spec: str) -> None:
    world, n = 3, 20000
    xs = _grads(world, n, seed=42)
    with switch_emulator.start() as sw:
        ctl = ControlClient(sw.control_addr)
        job = ctl.admit(world, n_slots=8, words_per_packet=256)
        ports = [UdpSwitchPort(sw.data_addr, job=job, rank=r, control=sw.control_addr, timeout=30) for r in range(world)]
        try:
            comps = [Compressor(spec) for _ in range(world)]
            hist = [homagg.History() for _ in range(world)]
            for step in range(2):  # first call, then the steady state
                res = on_threads(lambda r: comps[r].allreduce(xs[r].clone(), ports[r], key="e", history=hist[r]), world)
                want, _ = reference(spec, xs, "e", step)
                for r in range(world):
                    assert torch.equal(res[r], want.to(torch.float32)), (step, r)
        finally:
            for p in ports:
                p.close()
            ctl.remove(job.job_id)


DRAWS = 20000


def _draws(q, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """DRAWS decoded values of one block ``x`` under the agreed scale code ``k`` (vectorised)."""
    s = scales(k.view(1), q.steps).view(1, 1)
    noise = torch.rand((DRAWS, x.numel()), dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    u = q.codes(x.expand(DRAWS, -1), s, noise)
    return q.values(u, s)


@pytest.mark.parametrize("q", [TernGrad(block=64), QSGD(levels=4, block=64), QSGD(levels=16, norm="max", block=64)],
                         ids=["terngrad", "qsgd4", "qsgd16max"])
def test_stochastic_quantisers_unbiased_with_shared_scale(q) -> None:
    """E[value] == x with the shared scale: |mean - x| <= 5 standard errors for every element
    (fixed seed; 20000 draws; the documented variance gives the standard error)."""
    gen = torch.Generator().manual_seed(11)
    mine = torch.randn(64, dtype=torch.float64, generator=gen) * 0.1  # a small-gradient worker
    other = torch.randn(64, dtype=torch.float64, generator=gen)  # sets the shared scale
    local = lambda x: q.local_scale(x.view(1, -1), torch.tensor([64.0], dtype=torch.float64))  # noqa: E731
    k = torch.maximum(scale_codes(local(mine), q.steps), scale_codes(local(other), q.steps))
    vals = _draws(q, mine, k)
    s = float(scales(k, q.steps))
    if isinstance(q, TernGrad):
        var = mine.abs() * s - mine**2
    else:
        r = mine.abs() / s * q.levels
        p = r - torch.floor(r)
        var = (s / q.levels) ** 2 * p * (1 - p)
    se = (var / DRAWS).sqrt().clamp_min(1e-12)
    assert float(((vals.mean(0) - mine).abs() / se).max()) <= 5.0
    emp = vals.var(0)
    big = var > 1e-6 * s * s
    # the documented variance formula: in total within 3%, per element within 30% (20000 draws)
    assert abs(float(emp.sum() / var.sum()) - 1.0) < 0.03
    assert torch.allclose(emp[big], var[big], rtol=0.3)


def test_shared_scale_costs_variance_for_the_smaller_worker() -> None:
    """TernGrad: Var = |x|*s - x**2 grows with s, so a worker whose own max is 10x below the shared
    one pays ~10x the variance it would pay with its own scale; the mean stays x either way."""
    q = TernGrad(block=64)
    gen = torch.Generator().manual_seed(12)
    mine = torch.randn(64, dtype=torch.float64, generator=gen) * 0.1
    own_k = scale_codes(mine.abs().amax().view(1), q.steps)
    shared_k = own_k + 10 * q.steps // 3  # 2**(10/3) ~ 10x larger
    own, shared = _draws(q, mine, own_k[0]), _draws(q, mine, shared_k[0])
    ratio = float(shared.var(0).sum() / own.var(0).sum())
    assert 5.0 < ratio < 20.0, ratio
    for vals in (own, shared):
        assert float((vals.mean(0) - mine).abs().max()) < 0.05


def test_deterministic_quantisers_biased_and_error_feedback_recovers() -> None:
    """onebit/twobit are biased per step; with error feedback the sum of what was sent tracks the sum
    of gradients: |sum(sent) - sum(g)| == |residual|, bounded while the sum grows linearly."""
    for spec in ("onebit", "twobit"):
        comps = [Compressor(spec) for _ in range(2)]
        sw = InProcessSwitch(2)
        gen = torch.Generator().manual_seed(13)
        total = torch.zeros(4096, dtype=torch.float64)
        seen = torch.zeros_like(total)
        for _ in range(60):
            gs = [torch.randn(4096, dtype=torch.float64, generator=gen) + 0.5 for _ in range(2)]
            res = on_threads(lambda r: comps[r].allreduce(gs[r].clone(), sw.port(r), key=0), 2)
            total += res[0]
            seen += gs[0] + gs[1]
        resid = comps[0].feedback.residual(0) + comps[1].feedback.residual(0)
        assert torch.allclose(total + resid, seen, atol=1e-9)
        assert float(resid.abs().mean()) < 0.05 * float(seen.abs().mean()), spec


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["topk:0.02", "onebit", "twobit", "dgc:0.05"])
def test_cuda_tensors_match_cpu_and_state_stays_on_device(spec: str) -> None:
    """Deterministic stages give the same bits on CUDA as on CPU; state lives on the gradient's device."""
    world, n = 2, 6000
    xs = _grads(world, n, seed=77)
    out = {}
    for dev in ("cpu", "cuda"):
        comps = [Compressor(spec) for _ in range(world)]
        sw = InProcessSwitch(world)
        for _ in range(3):
            # copies: the allreduce writes in place, and .to("cpu") of a CPU tensor is the tensor itself
            res = on_threads(lambda r: comps[r].allreduce(xs[r].to(dev, copy=True), sw.port(r), key="c"), world)
        out[dev] = res[0].cpu()
        assert res[0].device.type == dev
        if comps[0].feedback is not None:
            assert comps[0].feedback.residual("c").device.type == dev
    assert torch.equal(out["cpu"], out["cuda"])
