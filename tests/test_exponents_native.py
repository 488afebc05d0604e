"""The exponent kernels (homagg/codec/_exponent_kernels.c through homagg.codec._exponent_native):
a steady call's guess and settling in one C call each give, bit for bit, what the numpy path and
the torch path (the oracle) give -- on EMPTY exponents, int32's extremes, every window of the
job's world sizes with ``guess_window`` on and off, blocks that stand and fail, and the
``changed`` figure -- and a call sequence decides alike with the kernels and without them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from homagg.codec import _exponent_native, _worker
from homagg.codec import _exponents as ex
from homagg.codec._exponents import EMPTY_EXPONENT as EMPTY
from tests.test_exponents import CASES, EXTREMES, WINDOWS, _steady_sequence, same, same_sequences

pytestmark = pytest.mark.skipif(not _exponent_native.AVAILABLE,
                                reason="the codec's native library is not built with the exponent kernels")

#: (raise_by, slack) of real jobs (Worker.window: world sizes, one or two words, guess_window on
#: and off) and the hand-picked ones of tests/test_exponents.py
JOB_WINDOWS = sorted({_worker._window(w, words, on) for w in (1, 2, 3, 4, 8, 64, 127, 128, 512, 1024)
                      for words in (1, 2) for on in (True, False)} | set(WINDOWS))


@contextmanager
def native(on: bool, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The exponent kernels on or off; yields the names of the kernels called inside."""
    calls: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(_exponent_native, "AVAILABLE", on)
        for name in ("guess32", "settle32"):
            real: Callable = getattr(_exponent_native, name)
            m.setattr(_exponent_native, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
        yield calls


def test_windows_cover_guess_window_on_and_off() -> None:
    assert (0, 0) in JOB_WINDOWS and any(s > 0 for _, s in JOB_WINDOWS) and len(JOB_WINDOWS) >= 6


@pytest.mark.parametrize(("raise_by", "slack"), JOB_WINDOWS)
def test_the_guess_kernel_matches_numpy_and_torch(raise_by: int, slack: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for prev, local, _ in CASES:
        want = ex._torch_guess_exponents(prev, local, raise_by)
        want_negated = ex._torch_negated_guess(want)
        with native(True, monkeypatch) as calls:
            guess, negated = ex.guess_and_negated(prev, local, raise_by)
            alone = ex.guess_exponents(prev, local, raise_by)
        assert calls == ["guess32", "guess32"]
        with native(False, monkeypatch) as calls:
            np_guess, np_negated = ex.guess_and_negated(prev, local, raise_by)
        assert calls == []
        for got in (guess, alone, np_guess):
            same(got, want)
        same(negated, want_negated)
        same(np_negated, want_negated)


def _settle_inputs(raise_by: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(previous, fresh agreed, max of negated guesses): two workers' real round, and arbitrary words."""
    for prev, local, other in CASES:
        agreed = torch.maximum(local, other)
        combined = torch.maximum(*(ex._torch_negated_guess(ex._torch_guess_exponents(prev, x, raise_by))
                                   for x in (local, other)))
        yield prev, agreed, combined
        yield prev, local, other
        yield prev, other, prev


@pytest.mark.parametrize(("raise_by", "slack"), JOB_WINDOWS)
def test_the_settle_kernel_matches_numpy_and_torch(raise_by: int, slack: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks to redo, decode exponents and ``changed`` (with ``previous``, without it, and with a
    ``previous`` of another shape); over the cases some blocks stand and some fail."""
    stood = failed = 0
    for prev, fresh, max_negated in _settle_inputs(raise_by):
        bad = ex._torch_mismatched_blocks(fresh, max_negated, slack)
        decoded = ex._torch_decode_exponents(fresh, max_negated, bad)
        held, moved = (int(c) for c in ex.changed_counts(prev, fresh, raise_by, slack))
        changed = moved / held if held else 0.0
        other_shape = torch.cat([prev, torch.zeros(1, dtype=torch.int32)])
        for previous, want_changed in ((prev, changed), (None, None), (other_shape, None)):
            for on in (True, False):
                with native(on, monkeypatch) as calls:
                    settled = ex.settle_exponents(fresh, max_negated, raise_by, slack, previous=previous)
                assert calls == (["settle32"] if on else [])
                same(settled.bad, bad)
                same(settled.exponents, decoded)
                assert settled.changed == want_changed
        stood += int(((fresh != EMPTY) & ~bad).sum())
        failed += int(bad.sum())
    assert stood > 0 and failed > 0


def test_the_fallbacks_keep_the_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Non-contiguous exponents, shapes that differ and windows past the kernels' range take the
    numpy path, with the torch path's values; the wrappers refuse such a window."""
    prev, local, other = CASES[-1]
    wide = 2**62
    with native(True, monkeypatch) as calls:
        strided = torch.stack([local, other], 1)[:, 0]
        assert not strided.is_contiguous()
        same(ex.guess_and_negated(prev, strided, 3)[0], ex._torch_guess_exponents(prev, local, 3))
        same(ex.guess_exponents(prev, local, wide), ex._torch_guess_exponents(prev, local, wide))
        settled = ex.settle_exponents(local, other, 0, wide, previous=prev)
        same(settled.bad, ex._torch_mismatched_blocks(local, other, wide))
        settled = ex.settle_exponents(local, other, 2, 5, previous=torch.stack([prev, prev], 1)[:, 0])
        same(settled.exponents, ex._torch_decode_exponents(local, other, ex._torch_mismatched_blocks(local, other, 5)))
        assert settled.changed == ex.changed_fraction(prev, local, 2, 5)
    assert calls == []
    for name, call in (("guess32", lambda: _exponent_native.guess32(0, 0, 0, wide, 0, 0)),
                       ("settle32", lambda: _exponent_native.settle32(0, 0, 0, -wide, 0, 0, None, 0))):
        with pytest.raises(ValueError, match=name):
            call()


def test_extremes_reach_the_kernels() -> None:
    joined = torch.cat([t for c in CASES for t in c])
    for value in (EMPTY, EMPTY + 1, EXTREMES[-1]):
        assert bool((joined == value).any())


@pytest.mark.parametrize("scheme", ["dense", "auto"])
def test_a_call_sequence_decides_alike_with_and_without_the_kernels(scheme: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Steady calls whose exponents drift in and past the window (tests/test_exponents.py's
    sequence): the same result bits, recorded exponents, ``changed`` figures, rounds and redos."""
    with native(True, monkeypatch) as calls:
        kernels = _steady_sequence(scheme)
    assert "guess32" in calls and "settle32" in calls
    with native(False, monkeypatch) as calls:
        numpy_path = _steady_sequence(scheme)
    assert calls == []
    same_sequences(kernels, numpy_path)
