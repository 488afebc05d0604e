"""Sparsifying stages and error feedback: exact invariants, selection counts, DGC, bit-exact resume."""

from __future__ import annotations

import math

import pytest
import torch

import homagg
from homagg.compress import (DGC, Compressor, Context, ErrorFeedback, RandomK, Threshold, TopK, keep_count,
                             warmup_density)
from homagg.testing import on_threads
from homagg.transport import InProcessSwitch


def int_grads(steps: int, n: int, seed: int, dtype=torch.float64) -> list[torch.Tensor]:
    """Integer-valued gradients: every addition below is exact, so invariants hold with ==."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-1000, 1001, (n,), generator=gen).to(dtype) for _ in range(steps)]


@pytest.mark.parametrize("spec", ["topk:0.01", "randk:0.02", "threshold:value=900", "threshold:density=0.05",
                                  "threshold:value=500|topk:0.05", "randk:0.05,shared=0"])
def test_error_feedback_invariant_exact_over_many_steps(spec: str) -> None:
    """sum(sent) + residual == sum(gradients), exactly, after every one of 200 steps."""
    comp = Compressor(spec)
    assert comp.feedback is not None
    seen = torch.zeros(3000, dtype=torch.float64)
    sent = torch.zeros_like(seen)
    for t, g in enumerate(int_grads(200, 3000, seed=1)):
        v, y = comp.compress(g, key="w", ctx=Context(0, 2))
        comp.feedback.keep(v, y, "w")
        seen += g
        sent += y
        assert torch.equal(sent + comp.feedback.residual("w"), seen), f"step {t}"


def test_error_feedback_float32_one_step_partition_is_bitwise() -> None:
    """In float32 the exact invariant is per step: sent + residual_new == g + residual_old, bit for bit."""
    comp = Compressor("topk:0.03")
    gen = torch.Generator().manual_seed(2)
    for t in range(50):
        g = torch.randn(4096, generator=gen)
        old = comp.feedback.residual("k")
        v, y = comp.compress(g, key="k")
        assert torch.equal(v, g if old is None else g + old)
        comp.feedback.keep(v, y, "k")
        assert torch.equal(y + comp.feedback.residual("k"), v), t
        assert torch.equal(torch.where(y != 0, y, comp.feedback.residual("k")), v)


def test_error_feedback_through_the_codec_world_two() -> None:
    """Through the exact codec (in-process switch): sum of results + all residuals == sum of all gradients."""
    world, n, steps = 2, 2048, 40
    comps = [Compressor("topk:0.02") for _ in range(world)]
    grads = [int_grads(steps, n, seed=10 + r) for r in range(world)]
    got = torch.zeros(n, dtype=torch.float64)
    sw = InProcessSwitch(world)
    hist = [homagg.History() for _ in range(world)]
    for t in range(steps):
        res = on_threads(lambda r: comps[r].allreduce(grads[r][t].clone(), sw.port(r), key=0, history=hist[r]), world)
        assert torch.equal(res[0], res[1])
        got += res[0]
    want = sum(sum(g) for g in grads)
    assert torch.equal(got + comps[0].feedback.residual(0) + comps[1].feedback.residual(0), want)


@pytest.mark.parametrize("n, fraction", [(1, 0.01), (100, 0.01), (1000, 0.013), (5000, 1.0), (777, 0.5)])
def test_topk_keeps_exactly_k_largest(n: int, fraction: float) -> None:
    v = torch.randn(n, generator=torch.Generator().manual_seed(n))
    out = TopK(fraction)(v)
    k = keep_count(n, fraction)
    assert k == min(n, max(1, math.ceil(fraction * n - 1e-9)))
    kept = out != 0
    assert int(kept.sum()) == k
    assert torch.equal(out[kept], v[kept])
    if k < n:
        assert float(v[kept].abs().min()) >= float(v[~kept].abs().max())


def test_randomk_exact_count_shared_and_fresh_each_step() -> None:
    v = torch.arange(1, 10001, dtype=torch.float32)
    a, b = RandomK(0.01), RandomK(0.01)
    s1 = a(v, "x", Context(0, 2)) != 0
    s2 = b(v, "x", Context(1, 2)) != 0
    assert int(s1.sum()) == 100 and torch.equal(s1, s2)  # shared across workers
    assert not torch.equal(a(v, "x", Context(0, 2)) != 0, s1)  # new positions next step
    own = RandomK(0.01, shared=False)
    other = RandomK(0.01, shared=False)
    assert not torch.equal(own(v, "x", Context(0, 2)) != 0, other(v, "x", Context(1, 2)) != 0)


def test_threshold_absolute_and_density() -> None:
    v = torch.randn(200_000, generator=torch.Generator().manual_seed(3))
    out = Threshold(value=2.0)(v)
    assert torch.equal(out != 0, v.abs() >= 2.0) and torch.equal(out[out != 0], v[v.abs() >= 2.0])
    for density in (0.01, 0.1):
        kept = int((Threshold(density=density)(v, "k") != 0).sum())
        # a 10k-element sample's quantile: kept count within 15% of density * n (fixed seed)
        assert abs(kept - density * v.numel()) <= 0.15 * density * v.numel(), (density, kept)
    small = torch.randn(500, generator=torch.Generator().manual_seed(4))  # <= sample: exact quantile
    assert int((Threshold(density=0.1)(small, "s") != 0).sum()) == 50


def test_dgc_momentum_correction_masking_and_exact_accumulation() -> None:
    """momentum=0, no clipping: DGC is top-k with error feedback; sum(sent) + v == sum(g) exactly."""
    dgc = DGC(0.02, momentum=0.0)
    tk = Compressor("topk:0.02")
    seen = torch.zeros(1000, dtype=torch.float64)
    sent = torch.zeros_like(seen)
    for g in int_grads(60, 1000, seed=5):
        y = dgc(g.clone(), "b")
        v, z = tk.compress(g, key="b")
        tk.feedback.keep(v, z, "b")
        assert torch.equal(y, z)
        seen += g
        sent += y
        assert torch.equal(sent + dgc.slot("b")["v"], seen)
    # with momentum: u accumulates, v accumulates u; both are zero where values were sent
    dgc = DGC(0.05, momentum=0.9)
    u_sum = torch.zeros(1000, dtype=torch.float64)
    sent = torch.zeros_like(u_sum)
    u_prev = torch.zeros_like(u_sum)
    for g in int_grads(30, 1000, seed=6):
        u_before = 0.9 * u_prev + g  # the momentum the stage computes this step
        y = dgc(g.clone(), "m")
        st = dgc.slot("m")
        assert bool((st["u"][y != 0] == 0).all()) and bool((st["v"][y != 0] == 0).all())
        u_prev = st["u"].clone()
        u_sum += u_before
        sent += y
    # sum of sent + remaining accumulation == sum of the (unmasked) momenta of each step
    assert torch.allclose(sent + dgc.slot("m")["v"], u_sum, rtol=0, atol=1e-6)


def test_dgc_local_clipping_and_warmup() -> None:
    g = torch.full((400,), 1.0, dtype=torch.float64)  # norm 20
    dgc = DGC(1.0, momentum=0.0, clip=4.0)
    out = dgc(g.clone(), "c", Context(0, 4))  # limit 4 / sqrt(4) = 2
    assert math.isclose(float(torch.linalg.vector_norm(out)), 2.0, rel_tol=1e-12)
    dens = [warmup_density(s, 0.001, warmup=400, stages=4) for s in range(0, 500, 100)]
    assert dens[0] == 0.25 and dens[-1] == 0.001
    assert all(a > b for a, b in zip(dens, dens[1:]))
    assert math.isclose(dens[2] / dens[1], dens[1] / dens[0])  # exponential decay
    dgc = DGC(0.001, momentum=0.0, warmup=400)
    assert int((dgc(torch.randn(10_000, dtype=torch.float64), "w") != 0).sum()) == 2500


@pytest.mark.parametrize("spec", ["topk:0.05", "randk:0.05", "threshold:density=0.05", "dgc:0.05,clip=5,warmup=4",
                                  "onebit", "terngrad", "qsgd:levels=4", "twobit"])
def test_state_dict_resume_is_bit_exact(spec: str) -> None:
    """5 + 5 steps with a save/load in between (into fresh objects) == 10 steps straight."""
    world, n = 2, 3000
    gen = torch.Generator().manual_seed(7)
    grads = [[torch.randn(n, generator=gen) for _ in range(world)] for _ in range(10)]

    def train(comps: list[Compressor], steps: range) -> list[torch.Tensor]:
        sw = InProcessSwitch(world)
        outs = []
        for t in steps:
            res = on_threads(lambda r: comps[r].allreduce(grads[t][r].clone(), sw.port(r), key="b"), world)
            outs.append(res[0])
        return outs

    straight = train([Compressor(spec) for _ in range(world)], range(10))
    first = [Compressor(spec) for _ in range(world)]
    part = train(first, range(5))
    saved = [c.state_dict() for c in first]
    resumed = [Compressor(spec) for _ in range(world)]
    for c, s in zip(resumed, saved):
        c.load_state_dict(s)
    part += train(resumed, range(5, 10))
    for t, (a, b) in enumerate(zip(straight, part)):
        assert torch.equal(a, b), f"{spec}: step {t} differs after resume"


def test_state_dict_of_another_spec_is_refused() -> None:
    with pytest.raises(homagg.ConfigError):
        Compressor("topk:0.1").load_state_dict(Compressor("topk:0.2").state_dict())


def test_error_feedback_residual_stays_on_the_gradient_device() -> None:
    fb = ErrorFeedback()
    g = torch.ones(10)
    fb.keep(fb.add(g, 1), torch.zeros(10), 1)
    assert fb.residual(1).device == g.device and torch.equal(fb.add(g, 1), 2 * g)


def test_uncompressible_tensors_take_the_exact_codec() -> None:
    comps = [Compressor("topk:0.01") for _ in range(2)]
    sw = InProcessSwitch(2)
    xs = [torch.arange(100, dtype=torch.int64) * (r + 1) for r in range(2)]
    res = on_threads(lambda r: comps[r].allreduce(xs[r].clone(), sw.port(r)), 2)
    assert torch.equal(res[0], xs[0] + xs[1])
