"""Wide words (``CodecConfig.precision``): two int32 words per float value, ``P2 = 47 - ceil(log2 W)``.

Oracles: the float64 sum of the inputs (``homagg.testing.exact_sum``) with the wide bound
``W * 2**(1 + s - P2) * M`` (quantisation, ``s`` the guess window's slack on a steady call, 0 on a
first call) plus the output dtype's final rounding; bit identity between schemes, between the
native kernels and the torch code (the path a CUDA tensor takes), and between a steady call with
the window off and a fresh call; the bytes each call's statistics count.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

import homagg
from homagg.bench._syncs import device_paths
from homagg.codec._fixedpoint import EMPTY_EXPONENT, float_words, guess_slack, precision_bits
from homagg.codec._history import Agreed
from homagg.testing import block_max, exact_sum, local_allreduce, on_threads, run_local, sparse_tensors
from homagg.transport import InProcessSwitch

SCHEMES = homagg.SCHEMES
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def wide_bound(xs: Sequence[torch.Tensor], dtype: torch.dtype, slack: int = 0) -> torch.Tensor:
    """Per element, the wide bound on ``|result - exact|``: every worker's quantisation error below
    one grid unit ``2**(G - P2) <= 2M * 2**(s - P2)``, then one rounding to ``dtype`` (none for
    float64: the int64 sum and its power-of-two scaling are exact)."""
    world = len(xs)
    m = block_max(xs)
    quant = world * 2.0 ** (1 + slack - precision_bits(world, 2)) * m
    if dtype == torch.float64:
        return quant
    info = torch.finfo(dtype)
    exact = exact_sum(xs).reshape(-1).abs()
    return quant + info.eps / 2 * (exact + quant) + info.smallest_normal * info.eps


def errors(result: torch.Tensor, xs: Sequence[torch.Tensor]) -> torch.Tensor:
    return (result.reshape(-1).double() - exact_sum(xs).reshape(-1)).abs()


def inputs(world: int, numel: int = 3000, dtype: torch.dtype = torch.float32, seed: int = 1) -> list[torch.Tensor]:
    """Values over about 12 binary orders (``spread``): small elements share blocks with large ones."""
    return sparse_tensors(world, numel, 0.5, seed=seed, spread=2.0, dtype=dtype)


# -- the option and its rule ---------------------------------------------------------------------------
def test_words_per_value_by_option_and_world() -> None:
    assert [float_words("auto", w) for w in (1, 2, 64, 128, 129, 256, 1024)] == [1, 1, 1, 1, 2, 2, 2]
    assert float_words("single", 1024) == 1 and float_words("wide", 2) == 2
    assert homagg.CodecConfig().precision == "auto"
    with pytest.raises(homagg.ConfigError, match="precision must be one of"):
        homagg.CodecConfig(precision="double")
    # auto goes wide exactly where one word keeps fewer than float32's 24 bits
    assert all((float_words("auto", w) == 2) == (precision_bits(w) < 24) for w in range(1, 1025))


def test_wide_precision_and_window_keep_their_bounds() -> None:
    """P2 = 47 - h; limb sums fit int32; the steady window's quantisation error stays within one
    float32 rounding at the block's scale (``W * 2**(1 + s - P2) <= 2**-24``) at every W <= 1024,
    and the window is never narrower than single words'."""
    for world in range(1, 1025):
        h = (world - 1).bit_length()
        p2, s = precision_bits(world, 2), guess_slack(world, 2)
        assert p2 == 47 - h
        assert world * 2 ** (p2 - 16) <= 2**31  # |q >> 16| <= 2**(P2-16): the high limbs' sum fits int32
        assert world * 0xFFFF < 2**31  # the low limbs' sum
        assert world * 2.0 ** (1 + s - p2) <= 2.0**-24
        assert s >= guess_slack(world)
    assert [guess_slack(w, 2) for w in (4, 64, 256, 512, 1024)] == [5, 5, 5, 4, 2]


# -- first calls: within the tighter bound, every scheme bit-identical -----------------------------------
@pytest.mark.parametrize("world", [4, 64, 1024])
def test_wide_first_call_within_the_tight_bound(world: int) -> None:
    xs = inputs(world, 2048 if world == 1024 else 3000)
    wide = local_allreduce(xs, "dense", precision="wide")
    assert all(torch.equal(r, wide[0]) for r in wide)
    assert bool((errors(wide[0], xs) <= wide_bound(xs, torch.float32)).all())
    if world == 1024:  # the bound is tighter than single words reach: single words exceed it there
        single = local_allreduce(xs, "dense", precision="single")[0]
        assert not bool((errors(single, xs) <= wide_bound(xs, torch.float32)).all())
        assert torch.equal(local_allreduce(xs, "dense")[0], wide[0])  # auto: wide at W > 128


@pytest.mark.parametrize("dtype", FLOATS)
def test_every_scheme_bit_identical_in_wide_words(dtype: torch.dtype) -> None:
    xs = inputs(8, 5000, dtype, seed=4)
    ref = local_allreduce(xs, "dense", precision="wide")[0]
    assert ref.dtype == dtype
    for scheme in SCHEMES:
        res = local_allreduce(xs, scheme, precision="wide")
        assert all(torch.equal(r, ref) for r in res), scheme
    assert bool((errors(ref, xs) <= wide_bound(xs, dtype)).all())


def test_sparse_coo_input_in_wide_words() -> None:
    dense = inputs(4, 4000, seed=6)
    ref = local_allreduce(dense, "dense", precision="wide")[0]
    for scheme in SCHEMES:
        res = local_allreduce([x.to_sparse() for x in dense], scheme, precision="wide")[0]
        assert torch.equal(res.to_dense(), ref), scheme


@pytest.mark.parametrize("scheme", SCHEMES)
def test_native_kernels_and_torch_path_agree_bit_for_bit(scheme: str) -> None:
    """The native kernels write one int32 word; wide words skip them: with them built (the CPU
    path) or not (the torch code a CUDA tensor takes), the same bits."""
    xs = inputs(6, 9000, seed=8)
    native = local_allreduce(xs, scheme, precision="wide")[0]
    with device_paths():
        torch_path = local_allreduce(xs, scheme, precision="wide")[0]
    assert torch.equal(native, torch_path)
    assert torch.equal(native, local_allreduce(xs, "dense", precision="wide")[0])


@pytest.mark.gpu
def test_cuda_tensors_in_wide_words() -> None:
    xs = inputs(4, 9000, seed=9)
    ref = local_allreduce(xs, "dense", precision="wide")[0]
    for scheme in SCHEMES:
        res = local_allreduce([x.cuda() for x in xs], scheme, precision="wide")
        assert res[0].is_cuda and torch.equal(res[0].cpu(), ref), scheme


def test_integers_unaffected() -> None:
    xs = [(x * 1000).round().to(torch.int64) for x in inputs(5, 3000, seed=2)]
    for scheme in SCHEMES:
        assert torch.equal(local_allreduce(xs, scheme, precision="wide")[0], torch.stack(xs).sum(0))


# -- bytes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme,stream", [("dense", "values"), ("compact", "values"), ("sketch", "sketch")])
def test_value_bytes_double(scheme: str, stream: str) -> None:
    xs = inputs(4, 20_000, seed=3)
    single = run_local(xs, scheme, precision="single").stats[0].bytes_per_stream
    wide = run_local(xs, scheme, precision="wide").stats[0].bytes_per_stream
    assert wide[stream] == 2 * single[stream] > 0
    if scheme == "dense":
        assert (single[stream], wide[stream]) == (4 * 20_000, 8 * 20_000)
    others = {k for k in single if k != stream}  # exponents, bitmaps, descriptor: unchanged
    assert {k: wide[k] for k in others} == {k: single[k] for k in others}


# -- steady calls ----------------------------------------------------------------------------------------
def allreduce_with(histories: list[homagg.History], xs: Sequence[torch.Tensor], scheme: str,
                   **options: object) -> tuple[list[torch.Tensor], list[homagg.WorkerStats]]:
    switch = InProcessSwitch(len(xs), timeout=120)
    stats = [homagg.WorkerStats() for _ in xs]
    outs = on_threads(lambda r: homagg.allreduce(xs[r], switch.port(r), scheme=scheme, stats=stats[r],
                                                 history=histories[r], **options), len(xs), timeout=300)
    return outs, stats


def agreed_exponents(xs: Sequence[torch.Tensor], block: int = 1024) -> torch.Tensor:
    m = block_max(xs, block)[::block]
    e = torch.frexp(m).exponent.to(torch.int32)
    return torch.where(m == 0, torch.full_like(e, EMPTY_EXPONENT), e)


@pytest.mark.parametrize("world", [4, 1024])
def test_steady_call_at_the_top_of_the_window_keeps_the_wide_bound(world: int) -> None:
    """Every worker's history makes it guess ``E + slack`` (the coarsest grid a steady call keeps):
    one round, no redo, the result within the wide bound with that slack."""
    xs = inputs(world, 2048, seed=5)
    slack = guess_slack(world, 2)
    prior = agreed_exponents(xs) + (slack - slack // 2)
    key = (None, xs[0].numel(), xs[0].dtype, world, 1024)
    histories = [homagg.History() for _ in xs]
    for h in histories:
        h.put(key, Agreed(prior, xs[0].numel()))
    outs, stats = allreduce_with(histories, xs, "dense", precision="wide")
    assert (stats[0].rounds, stats[0].redos) == (1, 0)
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert bool((errors(outs[0], xs) <= wide_bound(xs, torch.float32, slack)).all())
    # one binary order above the window is redone under the agreed exponents: a fresh call's bits
    for h in histories:
        h.put(key, Agreed(prior + 1, xs[0].numel()))
    outs, stats = allreduce_with(histories, xs, "dense", precision="wide")
    assert stats[0].redos == 1
    assert torch.equal(outs[0], local_allreduce(xs, "dense", precision="wide")[0])


@pytest.mark.parametrize("scheme", ["dense", "sketch", "auto"])
def test_repeated_calls_with_drift_stay_within_the_window(scheme: str) -> None:
    """Training-like drift (every value x2, then x0.25): the wide window holds it in one round;
    with the window off every call is bit-identical to a fresh one."""
    world = 8
    xs = inputs(world, 6000, seed=7)
    calls = [xs, [x * 2 for x in xs], [x * 0.25 for x in xs]]
    histories = [homagg.History() for _ in range(world)]
    fixed = [homagg.History() for _ in range(world)]
    for i, ys in enumerate(calls):
        outs, stats = allreduce_with(histories, ys, scheme, precision="wide", rtt_us=10_000.0)
        assert all(torch.equal(o, outs[0]) for o in outs)
        assert bool((errors(outs[0], ys) <= wide_bound(ys, torch.float32, guess_slack(world, 2))).all())
        if i:
            assert stats[0].redos == 0 and stats[0].rounds == 1, scheme
        same, _ = allreduce_with(fixed, ys, scheme, precision="wide", rtt_us=10_000.0, guess_window=False)
        assert torch.equal(same[0], local_allreduce(ys, scheme, precision="wide", rtt_us=10_000.0)[0])


# -- ranks that disagree ------------------------------------------------------------------------------
def test_ranks_disagreeing_about_precision_fail_at_the_first_round() -> None:
    """compact's first round is the same length in both precisions: the call descriptor names the
    difference instead of a wait for words the other rank never sends."""
    xs = inputs(2, 3000)
    switch = InProcessSwitch(2, timeout=20)
    precisions = ["single", "wide"]

    def call(r: int) -> BaseException | None:
        try:
            homagg.allreduce(xs[r], switch.port(r), scheme="compact", precision=precisions[r])
        except homagg.HomAggError as exc:
            return exc
        return None

    raised = on_threads(call, 2, timeout=60)
    for exc in raised:
        assert isinstance(exc, homagg.RankMismatchError), exc
        assert "torch.float32 .. torch.float32 in two words" in str(exc)


def test_process_group_passes_the_option_through() -> None:
    from homagg.torch import BackendConfig

    cfg = BackendConfig.resolve({"codec": {"precision": "wide"}}, env={})
    assert homagg.CodecConfig.from_options(dict(cfg.codec)).precision == "wide"
    with pytest.raises(homagg.ConfigError, match="precision"):
        homagg.CodecConfig.from_options(dict(BackendConfig.resolve({"codec": {"precision": 2}}, env={}).codec))


# -- the native wide kernels against the torch code ------------------------------------------------------
def _exps_for(x: torch.Tensor, block: int, lower: int = 0) -> torch.Tensor:
    return homagg.codec._blocks.exponents(x, block) - lower  # lower: a guess below the data (clamps)


@pytest.mark.skipif(not homagg.codec._native.WIDE, reason="the native kernels were not built with wide words")
@pytest.mark.parametrize("world", [2, 300, 1024])
@pytest.mark.parametrize("case", ["gradient", "tiny", "huge", "clamped", "partial"])
def test_wide_kernels_equal_the_torch_code(world: int, case: str) -> None:
    from homagg.codec import _blocks

    g = torch.Generator().manual_seed(world)
    n, block = (5000, 256) if case == "partial" else (8192, 1024)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-12, 1, (n,), generator=g).float())
    x[::7] = 0.0
    if case == "tiny":  # exponents near float32's bottom: the grid's factor needs two powers of two
        x = x * 2.0**-120
    if case == "huge":
        x = x * 2.0**100
    exps = _exps_for(x, block, 3 if case == "clamped" else 0)
    with device_paths():
        ref = _blocks.quantize(x, exps, world, block, words=2)
    got = _blocks.quantize(x, exps, world, block, words=2)
    assert torch.equal(got, ref)
    limbs = got.view(-1, 2)
    assert bool(((limbs[:, 0] >= 0) & (limbs[:, 0] < 2**16)).all())
    # sums of up to W such words, with cancelling limbs (total 0, words nonzero) among them
    sums = (limbs.to(torch.int64) * torch.randint(-world, world + 1, (n, 1), generator=g)).to(torch.int32)
    sums[1] = torch.tensor([65536, -1], dtype=torch.int32)
    out = torch.empty(n)
    with device_paths():
        want = torch.empty(n)
        assert _blocks.dequantize_into(want, sums.reshape(-1), exps, world, block, words=2) is None
    counted = _blocks.dequantize_into(out, sums.reshape(-1), exps, world, block, words=2)
    assert torch.equal(out, want)
    assert counted == int(torch.count_nonzero(sums.any(dim=1)))


def test_bench_precision_steady_worst_case_stands_at_the_top_of_the_window() -> None:
    """``homagg bench precision``'s steady column: every block quantised under ``E + slack``, one
    round, no redo, within the steady bound; the values stream 8 bytes per value."""
    from homagg.bench._precision import _homagg_sum, _top_of_window, wide_bound_factor

    world, n = 8, 3000
    grads = torch.stack(inputs(world, n, seed=11))
    bmax = torch.nn.functional.pad(grads.abs().amax(0), (0, (-n) % 1024)).reshape(-1, 1024).amax(1)
    steady, stats = _homagg_sum(grads, "wide", _top_of_window(bmax, world))
    first, first_stats = _homagg_sum(grads, "wide")
    assert (stats.rounds, stats.redos, first_stats.rounds) == (1, 0, 2)
    assert first_stats.bytes_per_stream["values"] == 8 * n
    assert not torch.equal(steady, first)  # a coarser grid than the first call's
    m = block_max(list(grads))
    for result, steady_call in ((steady, True), (first, False)):
        assert bool((errors(result, list(grads)) <= wide_bound_factor(world, steady_call) * m).all())
