"""Per-block exponent bookkeeping (homagg.codec._exponents): the host (numpy) path against the
torch path, bit for bit, on random exponents with EMPTY entries and int32's extremes; and the
steady call's decisions against a first call's, end to end."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

import homagg
from homagg.bench._syncs import device_paths
from homagg.codec import History, WorkerStats
from homagg.codec import _exponents as ex
from homagg.codec import _fixedpoint
from homagg.codec._exponents import EMPTY_EXPONENT as EMPTY
from homagg.testing import on_threads
from homagg.transport import InProcessSwitch

INT32_MAX = 2**31 - 1
#: values that stress the int64 intermediates and the wrap back to int32
EXTREMES = [EMPTY, EMPTY + 1, EMPTY + 2, EMPTY + 7, -(2**30), -1075, -1, 0, 1, 1024, 2**30, INT32_MAX - 7,
            INT32_MAX - 1, INT32_MAX]
WINDOWS = [(0, 0), (2, 5), (5, 5), (0, 7), (3, 1), (7, 10)]


def exponents(rng: np.random.Generator, n: int) -> torch.Tensor:
    """int32 exponents: mostly a real gradient's (-40..8), some EMPTY, some of :data:`EXTREMES`."""
    e = rng.integers(-40, 9, size=n).astype(np.int32)
    kind = rng.random(n)
    e[kind < 0.2] = EMPTY
    pick = kind > 0.85
    e[pick] = rng.choice(np.array(EXTREMES, dtype=np.int32), size=int(pick.sum()))
    return torch.from_numpy(e)


def cases() -> Iterator[tuple[torch.Tensor, ...]]:
    """(previous, local, other worker's local) triples: random, near each other, and every pair of extremes."""
    rng = np.random.default_rng(39)
    for n in (0, 1, 3, 64, 257):
        for _ in range(6):
            yield exponents(rng, n), exponents(rng, n), exponents(rng, n)
    prev = exponents(rng, 256)
    yield prev, prev + torch.from_numpy(rng.integers(-2, 3, 256).astype(np.int32)).where(prev != EMPTY, 0), prev
    grid = torch.tensor(EXTREMES, dtype=torch.int32)
    a, b = grid.repeat_interleave(len(EXTREMES)), grid.repeat(len(EXTREMES))
    yield a, b, b.flip(0)
    yield b, a, a.flip(0)


CASES = list(cases())


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} blocks differ"


def test_cases_hold_empty_and_extremes() -> None:
    """The inputs reach what the paths could disagree on: EMPTY, int32's ends, and sums past them."""
    joined = torch.cat([t for c in CASES for t in c])
    assert bool((joined == EMPTY).any()) and bool((joined == INT32_MAX).any()) and bool((joined == EMPTY + 1).any())


@pytest.mark.parametrize(("raise_by", "slack"), WINDOWS)
def test_guesses_match_the_torch_path(raise_by: int, slack: int) -> None:
    for prev, local, _ in CASES:
        want = ex._torch_guess_exponents(prev, local, raise_by)
        same(ex.guess_exponents(prev, local, raise_by), want)
        same(ex.negated_guess(want), ex._torch_negated_guess(want))
        guess, negated = ex.guess_and_negated(prev, local, raise_by)
        same(guess, want)
        same(negated, ex._torch_negated_guess(want))


@pytest.mark.parametrize(("raise_by", "slack"), WINDOWS)
def test_settling_matches_the_torch_path(raise_by: int, slack: int) -> None:
    """Blocks to redo, the exponents that decode and the fraction that moved: the host pass gives
    what the torch functions give, on a MAX of two workers' negated guesses and on arbitrary words."""
    for prev, local, other in CASES:
        agreed = torch.maximum(local, other)  # the MAX of two workers' local exponents
        guesses = [ex._torch_guess_exponents(prev, x, raise_by) for x in (local, other)]
        combined = torch.maximum(*(ex._torch_negated_guess(g) for g in guesses))
        for fresh, max_negated in ((agreed, combined), (local, other), (other, prev)):
            bad = ex._torch_mismatched_blocks(fresh, max_negated, slack)
            decoded = ex._torch_decode_exponents(fresh, max_negated, bad)
            held, moved = (int(c) for c in ex.changed_counts(prev, fresh, raise_by, slack))
            changed = moved / held if held else 0.0
            same(ex.mismatched_blocks(fresh, max_negated, slack), bad)
            same(ex.decode_exponents(fresh, max_negated, bad), decoded)
            same(ex.decode_exponents(fresh, max_negated, ~bad), ex._torch_decode_exponents(fresh, max_negated, ~bad))
            settled = ex.settle_exponents(fresh, max_negated, raise_by, slack, previous=prev)
            same(settled.bad, bad)
            same(settled.exponents, decoded)
            assert settled.changed == changed
            assert ex.settle_exponents(fresh, max_negated, raise_by, slack).changed is None
            assert ex.changed_fraction(prev, fresh, raise_by, slack) == changed
            same(ex.outside_window(prev, fresh, raise_by, slack), ex._torch_outside_window(prev, fresh, raise_by, slack))


def test_the_host_path_runs_on_cpu_tensors_and_the_torch_path_on_a_device_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU int32 exponents take numpy (the torch functions are not called); along a device's path
    (:func:`~homagg.bench._syncs.device_paths`) and for other dtypes, the torch functions run."""
    prev, local, other = CASES[10]
    calls: list[str] = []
    for name in ("_torch_guess_exponents", "_torch_mismatched_blocks", "_torch_outside_window"):
        real = getattr(ex, name)
        monkeypatch.setattr(ex, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))

    def run(p: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        ex.guess_and_negated(p, x, 2)
        ex.settle_exponents(torch.maximum(x, y), y, 2, 5, previous=p)
        ex.changed_fraction(p, x, 2, 5)

    run(prev, local, other)
    assert calls == []
    with device_paths():
        run(prev, local, other)
    assert calls == ["_torch_guess_exponents", "_torch_mismatched_blocks", "_torch_outside_window"]
    calls.clear()
    run(prev.long(), local.long(), other.long())
    assert len(calls) == 3


@pytest.mark.gpu
def test_cuda_tensors_take_the_torch_path_and_agree_with_the_host() -> None:
    """On CUDA tensors (the torch path, nothing read on the host) every function gives what the
    host path gives on the same exponents, on the tensors' device."""
    for prev, local, other in CASES[:12] + CASES[-2:]:
        p, x, y = (t.cuda() for t in (prev, local, other))
        agreed = torch.maximum(x, y)
        for got, want in ((ex.guess_and_negated(p, x, 2), ex.guess_and_negated(prev, local, 2)),
                          (ex.settle_exponents(agreed, y, 2, 5, previous=p)[:2],
                           ex.settle_exponents(agreed.cpu(), other, 2, 5, previous=prev)[:2])):
            for g, w in zip(got, want, strict=True):
                assert g.device.type == "cuda"
                same(g.cpu(), w)
        assert ex.settle_exponents(agreed, y, 2, 5, previous=p).changed is None
        assert ex.changed_fraction(p, agreed, 2, 5) == ex.changed_fraction(prev, agreed.cpu(), 2, 5)


def test_fixedpoint_keeps_the_old_names() -> None:
    for name in ("EMPTY_EXPONENT", "guess_exponents", "negated_guess", "mismatched_blocks", "decode_exponents",
                 "outside_window", "changed_counts"):
        assert getattr(_fixedpoint, name) is getattr(ex, name)


def _steady_sequence(scheme: str) -> tuple[list[list[torch.Tensor]], list[list[tuple]], list[list[tuple]]]:
    """Each worker's results, recorded history entries and (rounds, redos, redone) over a sequence
    of calls of one tensor whose block exponents drift (inside the window, past it, blocks emptied
    and refilled): the steady calls' guesses, settling and ``changed`` figures."""
    world, n = 3, 40_000  # 40 blocks, the last one partial
    gen = torch.Generator().manual_seed(39)
    base = [torch.randn(n, generator=gen) for _ in range(world)]
    drifts = [0, 1, -1, 3, 9, -12, 2, 0]
    switch = InProcessSwitch(world, timeout=60.0)
    histories = [History() for _ in range(world)]

    def rank(r: int) -> tuple[list[torch.Tensor], list[tuple], list[tuple]]:
        port, out, recorded, counts = switch.port(r), [], [], []
        for i, d in enumerate(drifts):
            x = base[r].clone()
            x[: (i % 4) * 5000] *= 2.0**d  # some blocks move by d binary orders, the others stay
            x[(7 * i + r) % 37 * 1024: ((7 * i + r) % 37 + 2) * 1024] = 0.0  # two blocks empty on this worker
            if i == 5:
                x[20_000:] = 0.0  # blocks empty on every worker, held again in the next call
            stats = WorkerStats()
            out.append(homagg.codec.allreduce(x, port, scheme=scheme, stats=stats, history=histories[r]))
            (entry,) = histories[r]._entries.values()
            recorded.append((entry.exponents.clone(), entry.union, entry.changed, entry.changed_before))
            counts.append((stats.rounds, stats.redos, stats.redone))
        return out, recorded, counts

    results = on_threads(rank, world)
    return [r[0] for r in results], [r[1] for r in results], [r[2] for r in results]


def same_sequences(one: tuple[list, list, list], other: tuple[list, list, list]) -> None:
    """Two runs of :func:`_steady_sequence` gave every worker the same result bits, recorded
    exponents, union and ``changed`` figures, rounds and redos."""
    for (o_out, o_rec, o_cnt), (t_out, t_rec, t_cnt) in zip(zip(*one), zip(*other), strict=True):
        for a, b in zip(o_out, t_out, strict=True):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))
        for a, b in zip(o_rec, t_rec, strict=True):
            assert torch.equal(a[0], b[0]) and a[1:] == b[1:]
        assert o_cnt == t_cnt


@pytest.mark.parametrize("scheme", ["dense", "sketch", "auto", "compact"])
def test_steady_calls_decide_alike_on_the_host_and_a_device_s_path(scheme: str) -> None:
    """A call sequence run on the host path and again along a device's path (the torch
    functions; :func:`~homagg.bench._syncs.device_paths`): the same result bits, the same recorded
    exponents, union and ``changed`` figures, the same rounds and redos."""
    host = _steady_sequence(scheme)
    with device_paths():
        device = _steady_sequence(scheme)
    same_sequences(host, device)
    changed = [rec[2] for rec in host[1][0]]
    if scheme != "compact":  # compact agrees its exponents first: no guess, nothing redone
        assert sum(c[1] for c in host[2][0]) > 0, "no call redid a block: the sequence tests no settling"
    assert any(0.0 < c < 1.0 for c in changed), changed
