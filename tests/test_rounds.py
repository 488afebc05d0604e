"""Steady-state calls: fewer rounds with a History, never a wrong result.

Oracles: the float64 sum within the documented bound and every worker's result identical; with
``guess_window=False``, the same inputs through the same in-process switch *without* history
(every call agrees fresh exponents first), bit for bit; values on a coarse grid, their exact sum.
"""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import homagg
from homagg.testing import check_within_bound, local_allreduce

SCHEMES = homagg.SCHEMES


class Workers:
    """W workers in threads, each with its own History and WorkerStats kept across calls."""

    def __init__(self, world: int, **options: object) -> None:
        self.world = world
        self.switch = homagg.InProcessSwitch(world, timeout=60)
        self.histories = [homagg.History() for _ in range(world)]
        self.options = options

    def call(self, xs: list[torch.Tensor], scheme: str, key: object = None) -> tuple[list[torch.Tensor], list[homagg.WorkerStats]]:
        outs: list[torch.Tensor | None] = [None] * self.world
        stats = [homagg.WorkerStats() for _ in range(self.world)]
        errors: list[BaseException] = []

        def work(r: int) -> None:
            try:
                outs[r] = homagg.allreduce(xs[r], self.switch.port(r), scheme=scheme, stats=stats[r],
                                           history=self.histories[r], key=key, **self.options)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                self.switch.fail(exc)

        threads = [threading.Thread(target=work, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors:
            raise errors[0]
        assert all(o is not None for o in outs)
        return outs, stats  # type: ignore[return-value]


def sparse(world: int, n: int, density: float, seed: int, scale: float = 1.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shared = torch.rand(n, generator=g) < density / 2
    return [torch.where(shared | (torch.rand(n, generator=g) < density / 2), torch.randn(n, generator=g), 0.0) * scale
            for _ in range(world)]


def assert_same_as_fresh(outs: list[torch.Tensor], xs: list[torch.Tensor], scheme: str, **options: object) -> None:
    want = local_allreduce(xs, scheme, **options)[0]
    for o in outs:
        assert torch.equal(o, want), "a call with history differs from the same call without"
    check_within_bound(want, xs, block_size=int(options.get("block_size", 1024)))  # type: ignore[arg-type]


def assert_exact(outs: list[torch.Tensor], xs: list[torch.Tensor], scheme: str, **options: object) -> None:
    """Every worker's result identical and within the bound; bit-identical to a call without
    history where the guess window is off."""
    if options.get("guess_window", True) is False:
        assert_same_as_fresh(outs, xs, scheme, **options)
        return
    for o in outs:
        assert torch.equal(o, outs[0]), "workers disagree"
    check_within_bound(outs[0], xs, block_size=int(options.get("block_size", 1024)))  # type: ignore[arg-type]


@pytest.mark.parametrize("window", [True, False])
@pytest.mark.parametrize("scheme,steady_rounds", [("dense", 1), ("sketch", 1), ("compact", 2), ("auto", 1)])
def test_second_call_takes_fewer_rounds_and_stays_exact(scheme: str, steady_rounds: int, window: bool) -> None:
    # auto: with a long round trip its cost model prefers the one-round continuation (sketch)
    options: dict[str, object] = {"rtt_us": 10_000.0} if scheme == "auto" else {}
    options["guess_window"] = window
    ws = Workers(4, **options)
    xs = sparse(4, 40000, 0.02, seed=1)
    first, s1 = ws.call(xs, scheme)
    assert_same_as_fresh(first, xs, scheme, **options)
    ys = [x * 1.01 for x in xs]  # same support, slightly different values: exponents mostly unchanged
    second, s2 = ws.call(ys, scheme)
    assert_exact(second, ys, scheme, **options)
    assert s1[0].rounds >= 2
    assert s2[0].rounds <= steady_rounds + (1 if s2[0].redos or s2[0].repaired else 0)
    if window and scheme != "compact":  # a 1% drift stays inside the window: nothing redone
        assert s2[0].redos == 0
    same = ws.call(ys, scheme)[1]  # identical input: nothing moves, no redo
    assert same[0].rounds == steady_rounds and same[0].redos == 0
    assert all(s.rounds == same[0].rounds for s in same)  # every worker took the same path


@pytest.mark.parametrize("scheme", SCHEMES)
def test_jump_by_two_to_the_twenty_redoes_and_stays_exact(scheme: str) -> None:
    ws = Workers(3)
    xs = sparse(3, 20000, 0.05, seed=2)
    ws.call(xs, scheme)
    ws.call(xs, scheme)  # the exponents held still: the next call guesses
    for i, scale in enumerate((2.0**20, 2.0**-20, 1.0)):
        ys = [x * scale for x in xs]
        outs, stats = ws.call(ys, scheme)
        assert_exact(outs, ys, scheme)
        if scheme in ("dense", "sketch") and i < 2:  # one jump is no trend: guessed, redone
            assert stats[0].redos == 1 and stats[0].redone > 0 and stats[0].rounds == 2
        elif scheme in ("dense", "sketch"):  # two calls in a row moved: exponents agreed first, no redo
            assert stats[0].redos == 0 and stats[0].rounds == 2


def test_guessing_stops_while_exponents_keep_moving_and_resumes_when_they_hold() -> None:
    """A guess pays only if few blocks move: after two calls where most did, the next agrees its
    exponents in a round of their own (2 rounds, nothing redone); once they hold, one round again.
    (The window off: every move counts.)"""
    ws = Workers(2, guess_window=False)
    xs = sparse(2, 40000, 1.0, seed=5)
    ws.call(xs, "dense")
    rounds = []
    for scale in (2.0**3, 2.0**6, 2.0**9, 2.0**9, 2.0**9):
        ys = [x * scale for x in xs]
        outs, stats = ws.call(ys, "dense")
        assert_same_as_fresh(outs, ys, "dense", guess_window=False)
        rounds.append((stats[0].rounds, stats[0].redos))
    # moved (guess, redo) / moved again (one move is no trend: guess, redo) / moved twice before (no
    # guess) / held (no guess: the two calls before moved) / held twice (guess)
    assert rounds == [(2, 1), (2, 1), (2, 0), (2, 0), (1, 0)]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_drifting_exponents_take_one_round_inside_the_window(world: int) -> None:
    """Training moves block exponents by a binary order or so every step: with the window every
    such call takes one round and no redo, each result within the bound and equal on every worker;
    a drift beyond the window (2**(raise + 1) up, 2**(slack - raise + 1) down) is redone."""
    from homagg.codec._fixedpoint import guess_slack

    slack = guess_slack(world)
    up, down = slack // 2, slack - slack // 2
    ws = Workers(world)
    g = torch.Generator().manual_seed(9)
    xs = [torch.randn(30000, generator=g) for _ in range(world)]
    ws.call(xs, "dense")
    scale = 1.0
    for step, factor in enumerate((2.0, 0.5, 2.0**up, 2.0**-down, 1.5, 0.7)):
        scale *= factor
        ys = [x * scale for x in xs]
        outs, stats = ws.call(ys, "dense")
        assert_exact(outs, ys, "dense")
        if abs(torch.log2(torch.tensor(factor))) <= (up if factor > 1 else down) or step >= 4:
            assert (stats[0].rounds, stats[0].redos) == (1, 0), (step, factor, stats[0])
    for factor in (2.0 ** (up + 1), 2.0 ** -(down + 1)):  # beyond the window: redone, still exact
        scale *= factor
        ys = [x * scale for x in xs]
        outs, stats = ws.call(ys, "dense")
        assert_exact(outs, ys, "dense")
        assert stats[0].redos == 1 and stats[0].rounds == 2


@pytest.mark.parametrize("scheme", ["dense", "sketch"])
def test_values_on_a_coarse_grid_sum_exactly_under_the_window(scheme: str) -> None:
    """Multiples of 2**-8 below 2**10 lie on every grid a guess may use (>= 24 bits below the
    block's exponent): the steady result is their exact sum, bit for bit, while exponents drift."""
    world = 4
    ws = Workers(world)
    g = torch.Generator().manual_seed(3)
    for step in range(4):
        xs = [torch.randint(-(2**17), 2**17, (20000,), generator=g).double().mul(2.0**-8 * 2.0**-step)
              * (torch.rand(20000, generator=g) < 0.3) for _ in range(world)]
        xs = [x.float() for x in xs]
        outs, stats = ws.call(xs, scheme)
        exact = sum((x.double() for x in xs), torch.zeros(20000, dtype=torch.float64))
        for o in outs:
            assert torch.equal(o.double(), exact)
        if step:
            assert stats[0].redos == 0


def test_redo_carries_only_the_blocks_that_moved() -> None:
    ws = Workers(2, block_size=100)
    xs = [torch.randn(10000), torch.randn(10000)]
    ws.call(xs, "dense")
    ys = [x.clone() for x in xs]
    ys[1][250] = 1e6  # block 2 only
    outs, stats = ws.call(ys, "dense")
    assert stats[0].redone == 100 and stats[0].bytes_per_stream["redo"] == 400
    assert_exact(outs, ys, "dense", block_size=100)


@pytest.mark.parametrize("window", [True, False])
def test_support_moves_between_calls(window: bool) -> None:
    """Blocks empty in the guess fill up and others empty out: redone where needed, exact."""
    ws = Workers(3, guess_window=window)
    for seed in range(4):
        xs = sparse(3, 30000, 0.002, seed=10 + seed)
        outs, _ = ws.call(xs, "sketch")
        assert_exact(outs, xs, "sketch", guess_window=window)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("scheme,rounds", [("dense", 1), ("sketch", 1), ("compact", 2)])
def test_integers_in_steady_state(dtype: torch.dtype, scheme: str, rounds: int) -> None:
    ws = Workers(3)
    xs = [(x * 1000).to(dtype) for x in sparse(3, 10000, 0.05, seed=3)]
    ws.call(xs, scheme)
    outs, stats = ws.call(xs, scheme)
    assert torch.equal(outs[0], sum(xs, torch.zeros_like(xs[0])))
    assert stats[0].rounds == rounds


def test_keys_separate_tensors_of_equal_size() -> None:
    ws = Workers(2)
    small = sparse(2, 5000, 0.1, seed=4)
    big = [x * 2.0**30 for x in sparse(2, 5000, 0.1, seed=5)]
    for _ in range(2):
        a = ws.call(small, "dense", key="a")[1]
        b = ws.call(big, "dense", key="b")[1]
    assert a[0].redos == 0 and b[0].redos == 0 and a[0].rounds == 1 and b[0].rounds == 1


def test_history_is_bounded() -> None:
    h = homagg.History(max_keys=2)
    ws = Workers(1)
    ws.histories = [h]
    for n in (10, 20, 30):
        ws.call([torch.ones(n)], "dense")
    assert len(h) == 2


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 4),
    scales=st.lists(st.integers(-40, 40), min_size=2, max_size=4),
    density=st.sampled_from([0.0, 0.01, 0.2, 1.0]),
    scheme=st.sampled_from(SCHEMES),
    seed=st.integers(0, 2**20),
    window=st.booleans(),
)
def test_property_history_never_breaks_a_result(world: int, scales: list[int], density: float, scheme: str, seed: int,
                                                window: bool) -> None:
    ws = Workers(world, block_size=64, guess_window=window)
    for k, e in enumerate(scales):
        xs = [x * 2.0**e for x in sparse(world, 700, density, seed=seed + k)]
        outs, _ = ws.call(xs, scheme)
        assert_exact(outs, xs, scheme, block_size=64, guess_window=window)


def test_moving_disjoint_support_needs_no_redo() -> None:
    """Embedding-like gradients: new rows every step, each block held by one worker at a time.

    Each worker's guess for a block it alone holds is its own exponent, which is the agreed one:
    steady calls take one round although the support moves every call.
    """
    ws = Workers(2, block_size=32)  # one block per row
    g = torch.Generator().manual_seed(11)
    order = torch.randperm(4000, generator=g)
    for step in range(4):  # rows not touched by the previous step (else that block may be redone)
        xs = [torch.zeros(4000, 32) for _ in range(2)]
        rows = order[40 * step:40 * (step + 1)]
        xs[0][rows[:20]] = torch.randn(20, 32, generator=g)
        xs[1][rows[20:]] = torch.randn(20, 32, generator=g) * 100
        flat = [x.reshape(-1) for x in xs]
        outs, stats = ws.call(flat, "sketch")
        assert_exact(outs, flat, "sketch", block_size=32)
        if step:
            assert stats[0].redos == 0 and stats[0].rounds == 1, stats[0]


def test_steady_compact_goes_two_level_once_the_union_is_remembered() -> None:
    """The first call knows no union size (flat bitmap); the second remembers it and, at low
    density, sends the word bitmap and only the held words (one more round), same result."""
    xs = sparse(2, 2_000_000, 0.002, seed=5)
    workers = Workers(2, rtt_us=10.0)
    first, fs = workers.call(xs, "compact")
    second, ss = workers.call(xs, "compact")
    assert fs[0].bytes_per_stream["word_bitmap"] == 0 and fs[0].rounds == 2
    assert ss[0].bytes_per_stream["word_bitmap"] > 0 and ss[0].rounds == 3
    assert ss[0].bytes_per_stream["bitmap"] < fs[0].bytes_per_stream["bitmap"] // 4
    for o in first + second:
        assert torch.equal(o, first[0])
    assert_same_as_fresh(second, xs, "compact")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_drift_inside_the_window_for_every_float_dtype(dtype: torch.dtype) -> None:
    """The window's grid is at least 24 bits below the agreed exponent whatever the dtype: steady
    calls of half-precision and float64 inputs take one round while exponents drift, every
    worker's result identical and within the bound."""
    ws = Workers(4)
    g = torch.Generator().manual_seed(21)
    xs = [torch.randn(20000, generator=g).to(dtype) for _ in range(4)]
    ws.call(xs, "dense")
    for factor in (2.0, 0.25, 4.0, 0.5):
        xs = [(x.double() * factor).to(dtype) for x in xs]
        outs, stats = ws.call(xs, "dense")
        assert outs[0].dtype == dtype
        assert_exact(outs, xs, "dense")
        assert (stats[0].rounds, stats[0].redos) == (1, 0)


def test_no_window_where_the_bound_leaves_no_bits() -> None:
    """At W >= 128 single words carry no bit beyond the bound (slack 0): a steady call stands only
    where every guess equals the agreed exponent, as with ``guess_window=False``, bit for bit
    (wide words, the default there, keep a window: tests/test_wide_words.py)."""
    from homagg.codec._fixedpoint import guess_slack

    assert guess_slack(128) == 0 and guess_slack(129) == 0 and guess_slack(64) == 1 and guess_slack(4) == 5
    world = 130
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(2048, generator=g) for _ in range(world)]
    ws = Workers(world, precision="single")
    ws.call(xs, "dense")
    ys = [x * 2.0 for x in xs]
    outs, stats = ws.call(ys, "dense")
    assert stats[0].redos == 1  # every block moved by one order: no window to hold it
    assert_same_as_fresh(outs, ys, "dense", precision="single")
