"""Exactness of every scheme, oracle style: float64 sums, exact integer sums, cross-scheme identity."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import homagg
from homagg.testing import check_within_bound as assert_within_bound
from homagg.testing import exact_sum, local_allreduce, run_local

SCHEMES = homagg.SCHEMES


def sparse_inputs(world: int, numel: int, density: float, support: str, seed: int, grid: bool) -> list[torch.Tensor]:
    """``world`` tensors with the given density; supports disjoint, equal or partly overlapping.

    ``grid=True`` gives small integers as float32 (on every fixed-point grid: sums must be exact).
    """
    g = torch.Generator().manual_seed(seed)
    nnz = round(numel * density)
    perm = torch.randperm(numel, generator=g)
    out = []
    for r in range(world):
        if support == "equal":
            pos = perm[:nnz]
        elif support == "disjoint":
            per = numel // world
            pos = perm[r * per : r * per + min(nnz, per)]
        else:  # overlap: half shared, half own
            half = nnz // 2
            own = torch.randperm(numel, generator=g)[: nnz - half]
            pos = torch.cat([perm[:half], own]).unique()
        x = torch.zeros(numel)
        if grid:
            vals = torch.randint(-1000, 1001, (pos.numel(),), generator=g).float()
        else:
            vals = torch.randn(pos.numel(), generator=g) * torch.exp(torch.randn(pos.numel(), generator=g) * 3)
        x[pos] = vals
        out.append(x)
    return out


def all_schemes(tensors: list[torch.Tensor], **options: object) -> dict[str, list[torch.Tensor]]:
    """Every scheme's result, and compact's with each bitmap form (flat, two-level)."""
    results = {s: local_allreduce(tensors, s, **options) for s in SCHEMES}
    for levels in (1, 2):
        results[f"compact-{levels}-level"] = local_allreduce(tensors, "compact", bitmap_levels=levels, **options)
    return results


def assert_identical_everywhere(results: dict[str, list[torch.Tensor]]) -> torch.Tensor:
    ref = results["dense"][0]
    for scheme, per_worker in results.items():
        for r, out in enumerate(per_worker):
            assert out.dtype == ref.dtype and out.shape == ref.shape
            assert torch.equal(out.view(-1).view(torch.uint8) if out.numel() else out, ref.view(-1).view(torch.uint8) if ref.numel() else ref), f"{scheme} worker {r} differs from dense"
    return ref


@pytest.mark.parametrize("density", [0.0, 1e-4, 1e-2, 0.3, 1.0])
@pytest.mark.parametrize("support", ["disjoint", "equal", "overlap"])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_grid_values_bit_exact_in_every_scheme(density: float, support: str, world: int) -> None:
    xs = sparse_inputs(world, 20011, density, support, seed=world * 7 + int(density * 1e4), grid=True)
    ref = assert_identical_everywhere(all_schemes(xs))
    assert torch.equal(ref, exact_sum(xs).float())


@pytest.mark.parametrize("density", [1e-4, 1e-2, 0.3, 1.0])
@pytest.mark.parametrize("support", ["disjoint", "equal", "overlap"])
def test_random_floats_within_bound_and_identical(density: float, support: str) -> None:
    xs = sparse_inputs(3, 30011, density, support, seed=11, grid=False)
    ref = assert_identical_everywhere(all_schemes(xs))
    assert_within_bound(ref, xs)


@pytest.mark.parametrize("numel", [0, 1, 31, 32, 33])
@pytest.mark.parametrize("world", [1, 2, 3, 33])
def test_small_shapes_and_world_sizes(numel: int, world: int) -> None:
    g = torch.Generator().manual_seed(numel * 100 + world)
    xs = [torch.randint(-50, 50, (numel,), generator=g).float() for _ in range(world)]
    ref = assert_identical_everywhere(all_schemes(xs))
    assert torch.equal(ref, exact_sum(xs).float())


def test_large_tensor_one_million_and_three() -> None:
    xs = sparse_inputs(2, 1000003, 1e-2, "overlap", seed=5, grid=True)
    ref = assert_identical_everywhere(all_schemes(xs))
    assert torch.equal(ref, exact_sum(xs).float())


def test_zero_dim_and_shapes_preserved() -> None:
    xs = [torch.tensor(1.5), torch.tensor(-0.25)]
    for scheme in SCHEMES:
        out = local_allreduce(xs, scheme)
        assert out[0].shape == () and out[0].item() == 1.25
    ys = [torch.arange(24.0).reshape(2, 3, 4) * (r + 1) for r in range(3)]
    for scheme in SCHEMES:
        assert torch.equal(local_allreduce(ys, scheme)[1], torch.arange(24.0).reshape(2, 3, 4) * 6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype: torch.dtype) -> None:
    xs = [t.to(dtype) for t in sparse_inputs(3, 5000, 0.3, "overlap", seed=3, grid=False)]
    ref = assert_identical_everywhere(all_schemes(xs))
    assert ref.dtype == dtype
    assert_within_bound(ref, xs)
    grid = [t.to(dtype) for t in sparse_inputs(3, 5000, 0.3, "overlap", seed=3, grid=True)]
    assert torch.equal(local_allreduce(grid, "sketch")[0].double(), exact_sum(grid).to(dtype).double())


def test_magnitudes_subnormal_to_huge_and_mixed_blocks() -> None:
    tiny = torch.tensor([1e-45, -3e-45, 1.2e-38, 0.0] * 8, dtype=torch.float32)  # subnormals
    huge = torch.tensor([1e30, -3e29, 7.0, 1e-30] * 8, dtype=torch.float32)  # mixed in one block
    for base in (tiny, huge):
        xs = [base, base * 2, -base * 0.5]
        ref = assert_identical_everywhere(all_schemes(xs, block_size=16))
        assert_within_bound(ref, xs, block_size=16)
    sub = [torch.tensor([1e-45] * 40), torch.tensor([2e-45] * 40)]  # multiples of the smallest subnormal
    assert torch.equal(local_allreduce(sub, "compact")[0], exact_sum(sub).float())


def test_negative_zero_is_zero() -> None:
    xs = [torch.tensor([-0.0, 1.0, -0.0]), torch.tensor([-0.0, -0.0, 2.0])]
    for scheme in SCHEMES:
        out = local_allreduce(xs, scheme)[0]
        assert out.tolist() == [0.0, 1.0, 2.0]
    assert run_local(xs, "compact").stats[0].bytes_per_stream["values"] == 8  # -0.0 sends no value


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_two_core_repair_is_exact(dtype: torch.dtype) -> None:
    xs = [t.to(dtype) for t in sparse_inputs(4, 5000, 0.05, "overlap", seed=9, grid=True)]
    tiny = run_local(xs, "sketch", sketch_cells=30)
    assert tiny.stats[0].repaired > 0 and tiny.stats[0].rounds == (3 if dtype.is_floating_point else 2)
    assert all(s.repaired == tiny.stats[0].repaired for s in tiny.stats)  # every worker agrees on the core
    assert torch.equal(tiny.results[0], local_allreduce(xs, "dense")[0])
    roomy = run_local(xs, "sketch")
    assert roomy.stats[0].repaired == 0 and torch.equal(roomy.results[0], tiny.results[0])


def test_cells_may_wrap_modulo_two_to_32() -> None:
    """Cells accumulate far beyond int32; only each element's sum must fit."""
    n, world = 3000, 8
    xs = [torch.full((n,), float(2**27 - 1)) * (1 if r % 2 else -1) for r in range(world)]
    xs[0][::3] = 2**27 - 1.0
    run = run_local(xs, "sketch", sketch_cells=3 * 1200)
    assert torch.equal(run.results[0], exact_sum(xs).float())


def test_auto_cost_model_follows_density_and_rtt() -> None:
    sparse = sparse_inputs(2, 100000, 1e-3, "overlap", seed=1, grid=True)
    dense = sparse_inputs(2, 100000, 1.0, "equal", seed=1, grid=True)
    assert run_local(dense, "auto").stats[0].schemes["dense"] == 1
    assert run_local(sparse, "auto", rtt_us=1000.0).stats[0].schemes["sketch"] == 1
    assert run_local(sparse, "auto", rtt_us=0.0).stats[0].schemes["compact"] == 1


def test_auto_counts_peeling_time() -> None:
    """Peeling costs CPU per distinct nonzero: counted, it tips auto from sketch to compact."""
    xs = sparse_inputs(2, 200000, 0.05, "overlap", seed=3, grid=True)
    assert run_local(xs, "auto", rtt_us=100.0).stats[0].schemes["compact"] == 1
    assert run_local(xs, "auto", rtt_us=100.0, peel_ns=0.0).stats[0].schemes["sketch"] == 1


def test_auto_counts_codec_time() -> None:
    """compact's gather/quantise/scatter per union element against dense's native passes: at a
    60% density on 1 Gbit/s, its 20-40% fewer bytes do not pay for its CPU, so auto picks dense;
    with the CPU terms off, the bytes alone pick compact."""
    xs = sparse_inputs(2, 200000, 0.6, "overlap", seed=5, grid=True)
    union = int((torch.stack(xs) != 0).any(0).sum())
    assert union < 0.85 * 200000
    assert run_local(xs, "auto", bandwidth_gbps=1.0).stats[0].schemes["dense"] == 1
    assert run_local(xs, "auto", bandwidth_gbps=1.0, dense_ns=0.0, compact_ns=0.0).stats[0].schemes["compact"] == 1


def test_compact_sends_union_sized_values() -> None:
    xs = sparse_inputs(3, 64000, 0.01, "disjoint", seed=2, grid=True)
    union = int((torch.stack(xs) != 0).any(0).sum())
    stats = run_local(xs, "compact").stats[0]
    assert stats.bytes_per_stream["values"] == 4 * union and stats.bytes_per_stream["bitmap"] == 64000 // 8


@pytest.mark.parametrize("support", ["disjoint", "overlap", "clustered"])
def test_two_level_bitmap_sends_only_the_words_the_union_holds(support: str) -> None:
    numel, world = 200_003, 3
    if support == "clustered":  # embedding-like: a few runs of consecutive rows
        xs = [torch.zeros(numel) for _ in range(world)]
        for r, x in enumerate(xs):
            x[1000 * r: 1000 * r + 700] = torch.randint(-999, 1000, (700,)) / 8  # on the grid: exact
            x[150_000 + 37 * r: 150_000 + 37 * r + 64] = torch.randint(1, 1000, (64,)) / 4
    else:
        xs = sparse_inputs(world, numel, 0.003, support, seed=4, grid=True)
    want = exact_sum(xs)
    flat = local_allreduce(xs, "compact", bitmap_levels=1)
    run = run_local(xs, "compact", bitmap_levels=2)
    union = torch.stack(xs).ne(0).any(0)
    held = int(torch.nn.functional.pad(union, (0, -numel % 32)).view(-1, 32).any(1).sum())  # words with a nonzero
    n_words = -(-numel // 32)
    for r in range(world):
        assert torch.equal(run.results[r], flat[r]) and torch.equal(run.results[r], want.float())
        st_ = run.stats[r]
        assert st_.bytes_per_stream["word_bitmap"] == 4 * -(-n_words // 32)
        assert st_.bytes_per_stream["bitmap"] == 4 * held < 4 * n_words // 3
        assert st_.bytes_per_stream["values"] == 4 * int(union.sum())


def test_bitmap_levels_follow_the_cost_model() -> None:
    """Two levels where the union leaves most bitmap words empty and the saving outweighs a round;
    one level at higher density, for small tensors, and when no union size is known yet."""
    from homagg import CodecConfig
    from homagg.codec._schemes import bitmap_levels

    cfg = CodecConfig()
    assert bitmap_levels(4 << 20, 0.02 * (4 << 20), cfg) == 2
    assert bitmap_levels(4 << 20, 0.10 * (4 << 20), cfg) == 1
    assert bitmap_levels(20_000, 20.0, cfg) == 1  # saves < one round's worth of bytes
    assert bitmap_levels(4 << 20, None, cfg) == 1
    assert bitmap_levels(4 << 20, 0.10 * (4 << 20), CodecConfig(bitmap_levels=2)) == 2
    with pytest.raises(homagg.ConfigError, match="bitmap_levels"):
        CodecConfig(bitmap_levels=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 6),
    numel=st.integers(0, 300),
    density=st.sampled_from([0.0, 0.01, 0.3, 1.0]),
    scale_exp=st.integers(-140, 100),
    block=st.sampled_from([1, 7, 32, 1024]),
    data=st.data(),
)
def test_property_schemes_agree_and_bound_holds(world: int, numel: int, density: float, scale_exp: int, block: int, data: st.DataObject) -> None:
    seed = data.draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    xs = []
    for _ in range(world):
        mask = torch.rand(numel, generator=g) < density
        vals = torch.randn(numel, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(-20, 20, (numel,), generator=g)
        xs.append(torch.where(mask, vals * 2.0**scale_exp, 0.0).float())
    ref = assert_identical_everywhere(all_schemes(xs, block_size=block))
    assert_within_bound(ref, xs, block_size=block)


@settings(max_examples=40, deadline=None)
@given(world=st.integers(1, 5), values=st.lists(st.integers(-(2**40), 2**40), min_size=0, max_size=64))
def test_property_int64_exact(world: int, values: list[int]) -> None:
    xs = [torch.tensor(values, dtype=torch.int64) * (r - 1) for r in range(world)]
    for scheme in SCHEMES:
        assert torch.equal(local_allreduce(xs, scheme)[0], sum(xs, torch.zeros(len(values), dtype=torch.int64)))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_inplace_matches_out_of_place(scheme: str) -> None:
    xs = sparse_inputs(3, 9000, 0.05, "overlap", seed=4, grid=False)
    want = local_allreduce(xs, scheme)[0]
    switch = homagg.InProcessSwitch(3)
    outs: list[torch.Tensor] = [torch.empty(0)] * 3
    strided = torch.empty(2 * 9000)[::2]  # a non-contiguous view holding worker 2's input
    strided.copy_(xs[2])
    targets = [x.clone() for x in xs[:2]] + [strided]
    import threading

    def work(r: int) -> None:
        outs[r] = homagg.allreduce(targets[r], switch.port(r), scheme=scheme, inplace=True)

    ts = [threading.Thread(target=work, args=(r,)) for r in range(3)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    for r in range(3):
        assert outs[r] is targets[r]
        assert torch.equal(outs[r], want)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cuda_tensors_give_the_cpu_result(scheme: str) -> None:
    xs = sparse_inputs(3, 50000, 0.02, "overlap", seed=8, grid=False)
    want = local_allreduce(xs, scheme)[0]
    got = local_allreduce([x.cuda() for x in xs], scheme)
    assert all(g.device.type == "cuda" for g in got)
    assert torch.equal(got[0].cpu(), want)
