"""Per-block exponent bookkeeping of steady calls: guesses, which blocks stand, what moved.

Every function here works on one-per-block int32 exponent tensors (EMPTY_EXPONENT where a block
holds no value) and computes with integer arithmetic only.  Each has two paths that give the same
values bit for bit (``tests/test_exponents.py`` compares them on random and extreme exponents):

* host tensors (int32/bool on the CPU: :func:`homagg.codec._hostops.reads_free`): where the
  codec's native library holds the exponent kernels (:mod:`homagg.codec._exponent_native`) and the
  tensors are contiguous and alike in shape, a steady call's guess and its settling are one C call
  each on the tensors' addresses (:func:`guess_and_negated`, :func:`settle_exponents`); else numpy
  on ``.numpy()`` views of the tensors, a few vectorised operations per call and the results
  wrapped with ``torch.from_numpy`` (a mid-size call has 64-256 blocks, where a torch operation's
  fixed cost is most of its time; ``tests/test_exponents_native.py`` compares the three paths);
* any other tensor (a device's, or another dtype): the torch operations (``_torch_*``), which
  never read a value on the host.

The numpy path computes in int64 where the torch path does and wraps to int32 in the same places
(``astype(np.int32)`` and ``.to(torch.int32)`` both reduce modulo 2**32).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from . import _exponent_native, _hostops

__all__ = [
    "EMPTY_EXPONENT",
    "guess_exponents",
    "negated_guess",
    "guess_and_negated",
    "mismatched_blocks",
    "decode_exponents",
    "Settled",
    "settle_exponents",
    "outside_window",
    "changed_counts",
    "changed_fraction",
]

EMPTY_EXPONENT = -(2**31)  # exponent of a block with no nonzero (identity of MAX)


def _host(a: torch.Tensor, b: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> bool:
    """Whether the numpy path serves these tensors: int32 exponents ``a`` (and ``b``) and a bool
    ``mask`` whose values the host reads for free (:func:`homagg.codec._hostops.reads_free`: CPU
    tensors, unless a test routes them along a device's path); any other tensor takes the torch
    operations."""
    free = _hostops.reads_free
    return (a.dtype == torch.int32 and free(a) and (b is None or (b.dtype == torch.int32 and free(b)))
            and (mask is None or (mask.dtype == torch.bool and free(mask))))


# ---------------------------------------------------------------------------- guesses
def guess_exponents(previous: torch.Tensor, local: torch.Tensor, raise_by: int = 0) -> torch.Tensor:
    """One worker's guess of the exponent a block is quantised under in this call:
    ``max(previous agreed + raise_by, local)`` where the worker holds a value and the previous call
    agreed one; its own ``local`` exponent where the previous call held nothing there; EMPTY where
    it holds nothing (it contributes zeros under any exponent).

    ``raise_by`` (up to :func:`homagg.codec._fixedpoint.guess_slack`) is headroom above the
    previous maximum: while every contributor's exponent stays at or below ``previous + raise_by``
    they all guess the *same* exponent, whatever each one's own exponent did.
    :func:`mismatched_blocks` finds the blocks where the contributors' guesses differ or leave the
    window.
    """
    if _host(previous, local):
        native = _native_guess(previous, local, raise_by)
        if native is not None:
            return native[0]
        return torch.from_numpy(_np_guess(previous.numpy(), local.numpy(), raise_by))
    return _torch_guess_exponents(previous, local, raise_by)


def negated_guess(guess: torch.Tensor) -> torch.Tensor:
    """``-guess`` where a guess was made, EMPTY elsewhere: combined with MAX it gives ``-min guess``
    over the workers holding a value in each block."""
    if _host(guess):
        return torch.from_numpy(_np_negated(guess.numpy()))
    return _torch_negated_guess(guess)


def guess_and_negated(previous: torch.Tensor, local: torch.Tensor,
                      raise_by: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`guess_exponents`, :func:`negated_guess` of it), in one pass on the host."""
    if _host(previous, local):
        native = _native_guess(previous, local, raise_by)
        if native is not None:
            return native
        guess = _np_guess(previous.numpy(), local.numpy(), raise_by)
        return torch.from_numpy(guess), torch.from_numpy(_np_negated(guess))
    guess_t = _torch_guess_exponents(previous, local, raise_by)
    return guess_t, _torch_negated_guess(guess_t)


def _native(a: torch.Tensor, b: torch.Tensor, *window: int) -> bool:
    """Whether the exponent kernels serve host tensors ``a`` and ``b`` (already checked int32 on the
    CPU): the library holds them, both are contiguous and of one shape, the window fits the kernels."""
    limit = _exponent_native.WINDOW_LIMIT
    return (_exponent_native.AVAILABLE and a.shape == b.shape and a.is_contiguous() and b.is_contiguous()
            and all(-limit < w < limit for w in window))


def _native_guess(previous: torch.Tensor, local: torch.Tensor,
                  raise_by: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(guess, negated guess) from ``homagg_guess32`` in one C call, where :func:`_native` allows;
    else None (the numpy path runs)."""
    if not _native(previous, local, raise_by):
        return None
    guess, negated = torch.empty_like(local), torch.empty_like(local)
    _exponent_native.guess32(previous.data_ptr(), local.data_ptr(), local.numel(), raise_by, guess.data_ptr(),
                             negated.data_ptr())
    return guess, negated


def _np_guess(previous: np.ndarray, local: np.ndarray, raise_by: int) -> np.ndarray:
    """The torch path's guess in four vectorised steps: ``max(previous + raise_by, local)`` in
    int64, wrapped to int32, and ``local`` itself where either is EMPTY (where ``previous`` is
    EMPTY the torch path's ``max(EMPTY, local)`` is ``local``)."""
    raised = np.add(previous, raise_by, dtype=np.int64)
    np.maximum(raised, local, out=raised)
    return np.where((previous == EMPTY_EXPONENT) | (local == EMPTY_EXPONENT), local, raised.astype(np.int32))


def _np_negated(guess: np.ndarray) -> np.ndarray:
    """``-guess`` modulo 2**32 (unsigned negation: defined for every value): EMPTY (-2**31) stays
    EMPTY, as the torch path's ``where`` keeps it."""
    return _wrapping_negative(guess)


def _wrapping_negative(x: np.ndarray) -> np.ndarray:
    """``-x`` of int32 ``x`` modulo 2**32 (what ``(-x.to(int64)).to(int32)`` gives)."""
    return np.negative(x.view(np.uint32)).view(np.int32)


def _torch_guess_exponents(previous: torch.Tensor, local: torch.Tensor, raise_by: int = 0) -> torch.Tensor:
    prev = previous.to(torch.int64)
    raised = torch.where(prev == EMPTY_EXPONENT, prev, prev + raise_by)
    guess = torch.maximum(raised, local.to(torch.int64)).to(torch.int32)
    return torch.where(local == EMPTY_EXPONENT, local, guess)


def _torch_negated_guess(guess: torch.Tensor) -> torch.Tensor:
    return torch.where(guess == EMPTY_EXPONENT, guess, -guess)


# ---------------------------------------------------------------------------- which blocks stand
def mismatched_blocks(agreed: torch.Tensor, max_negated_guess: torch.Tensor, slack: int = 0) -> torch.Tensor:
    """Blocks holding a nonzero somewhere whose words cannot stand: the smallest contributor's guess
    ``Gmin`` is not within ``[E, E + slack]`` of the agreed (largest local) exponent ``E``.

    Every contributor guessed ``max(common, own)``, so ``Gmin >= E`` means every contributor guessed
    the same exponent ``Gmin`` (all took the common value, or all own ``E``): the words summed in
    the other blocks are exactly those of quantising every worker under ``Gmin``, within the error
    bound while ``Gmin - E <= slack`` (:func:`homagg.codec._fixedpoint.guess_slack`).  ``slack =
    0``: only guesses equal to the agreed exponent stand (results bit-identical to agreeing
    exponents first).
    """
    if _host(agreed, max_negated_guess):
        return torch.from_numpy(_np_settle(agreed.numpy(), max_negated_guess.numpy(), slack)[0])
    return _torch_mismatched_blocks(agreed, max_negated_guess, slack)


def decode_exponents(agreed: torch.Tensor, max_negated_guess: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """The exponents a call guessed under ends with: the common guess ``Gmin`` in the blocks that
    stand, the agreed ``agreed`` in the ``bad`` ones (redone) and where no value lies."""
    if _host(agreed, max_negated_guess, mask=bad):
        return torch.from_numpy(_np_decode(agreed.numpy(), max_negated_guess.numpy(), bad.numpy()))
    return _torch_decode_exponents(agreed, max_negated_guess, bad)


class Settled(NamedTuple):
    """What :func:`settle_exponents` finds after a round quantised under guesses."""

    #: bool mask of the blocks to redo (:func:`mismatched_blocks`), unread
    bad: torch.Tensor
    #: the exponents the call's sums decode with (:func:`decode_exponents` under ``bad``)
    exponents: torch.Tensor
    #: :func:`changed_fraction` of ``previous`` and the agreed exponents, where ``previous`` was
    #: given and read on the host in the same pass; None where not computed (a device's tensors:
    #: nothing is read here)
    changed: float | None


def settle_exponents(agreed: torch.Tensor, max_negated_guess: torch.Tensor, raise_by: int, slack: int,
                     previous: torch.Tensor | None = None) -> Settled:
    """:func:`mismatched_blocks` under ``slack``, :func:`decode_exponents` under it and (host
    tensors, ``previous`` of the same shape given) :func:`changed_fraction` of ``previous`` under
    ``(raise_by, slack)``: one pass over the blocks on the host."""
    if _host(agreed, max_negated_guess):
        with_prev = previous is not None and _host(previous) and previous.shape == agreed.shape
        if _native(agreed, max_negated_guess, raise_by, slack) and (not with_prev or previous.is_contiguous()):
            return _native_settle(agreed, max_negated_guess, raise_by, slack, previous if with_prev else None)
        a = agreed.numpy()
        bad, exponents, held = _np_settle(a, max_negated_guess.numpy(), slack)
        changed = None
        if with_prev:
            assert previous is not None
            both, moved = _np_outside(previous.numpy(), a, raise_by, slack, held)
            changed = _fraction(int(np.count_nonzero(both)), int(np.count_nonzero(moved)))
        return Settled(torch.from_numpy(bad), torch.from_numpy(exponents), changed)
    bad_t = _torch_mismatched_blocks(agreed, max_negated_guess, slack)
    return Settled(bad_t, _torch_decode_exponents(agreed, max_negated_guess, bad_t), None)


def _native_settle(agreed: torch.Tensor, max_negated_guess: torch.Tensor, raise_by: int, slack: int,
                   previous: torch.Tensor | None) -> Settled:
    """:func:`settle_exponents`'s host pass in one C call (``homagg_settle32``): the mask, the
    decode exponents and, with ``previous`` (contiguous, of ``agreed``'s shape), the counts behind
    ``changed``."""
    bad, exponents = torch.empty_like(agreed, dtype=torch.bool), torch.empty_like(agreed)
    counts = _exponent_native.settle32(agreed.data_ptr(), max_negated_guess.data_ptr(), agreed.numel(), slack,
                                       bad.data_ptr(), exponents.data_ptr(),
                                       None if previous is None else previous.data_ptr(), raise_by)
    return Settled(bad, exponents, None if counts is None else _fraction(*counts))


def _np_settle(agreed: np.ndarray, max_negated_guess: np.ndarray,
               slack: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mismatched blocks, decoded exponents, agreed held) in numpy: the torch path's
    :func:`_torch_mismatched_blocks` and :func:`_torch_decode_exponents` with their common terms
    computed once.  With ``low = -max_negated_guess`` and ``s = max_negated_guess + agreed``
    (int64, exact): ``low < E`` is ``s > 0`` and ``low > E + slack`` is ``s < -slack``; a kept
    block decodes with ``low``, whose int32 wrap is the wrapping negation."""
    held = agreed != EMPTY_EXPONENT
    total = np.add(max_negated_guess, agreed, dtype=np.int64)
    bad = held & ((total > 0) | (total < -slack))
    return bad, np.where(held ^ bad, _wrapping_negative(max_negated_guess), agreed), held


def _np_decode(agreed: np.ndarray, max_negated_guess: np.ndarray, bad: np.ndarray) -> np.ndarray:
    keep = (agreed != EMPTY_EXPONENT) & ~bad
    return np.where(keep, _wrapping_negative(max_negated_guess), agreed)


def _torch_mismatched_blocks(agreed: torch.Tensor, max_negated_guess: torch.Tensor, slack: int = 0) -> torch.Tensor:
    e = agreed.to(torch.int64)
    low = -max_negated_guess.to(torch.int64)
    return (agreed != EMPTY_EXPONENT) & ((low < e) | (low > e + slack))


def _torch_decode_exponents(agreed: torch.Tensor, max_negated_guess: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    low = -max_negated_guess.to(torch.int64)
    keep = (agreed != EMPTY_EXPONENT) & ~bad
    return torch.where(keep, low, agreed.to(torch.int64)).to(torch.int32)


# ---------------------------------------------------------------------------- what moved
def outside_window(previous: torch.Tensor, agreed: torch.Tensor, raise_by: int, slack: int) -> torch.Tensor:
    """Blocks held in both calls whose new agreed exponent ``E`` a guess from ``previous`` would miss
    (``E > previous + raise_by``, or ``previous + raise_by > E + slack``): the blocks a steady call
    redoes; with ``raise_by = slack = 0``, the blocks whose exponent moved at all."""
    if _host(previous, agreed):
        return torch.from_numpy(_np_outside(previous.numpy(), agreed.numpy(), raise_by, slack)[1])
    return _torch_outside_window(previous, agreed, raise_by, slack)


def changed_counts(previous: torch.Tensor, agreed: torch.Tensor, raise_by: int,
                   slack: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks holding a value in both calls, those among them :func:`outside_window`) as 0-d
    int64 tensors on the exponents' device, unread: ``moved / held`` is the fraction of blocks a
    guess from ``previous`` would have redone (recorded in the history; read with the call's other
    figures).  :func:`changed_fraction` reads it."""
    held = (agreed != EMPTY_EXPONENT) & (previous != EMPTY_EXPONENT)
    return held.sum(), _torch_outside_window(previous, agreed, raise_by, slack).sum()


def changed_fraction(previous: torch.Tensor, agreed: torch.Tensor, raise_by: int, slack: int) -> float:
    """``moved / held`` of :func:`changed_counts` (0.0 where no block is held in both calls), read
    on the host (one synchronisation for a device's tensors)."""
    if _host(previous, agreed):
        held, moved = _np_outside(previous.numpy(), agreed.numpy(), raise_by, slack)
        return _fraction(int(np.count_nonzero(held)), int(np.count_nonzero(moved)))
    held_n, moved_n = torch.stack(changed_counts(previous, agreed, raise_by, slack)).tolist()
    return _fraction(held_n, moved_n)


def _fraction(held: int, moved: int) -> float:
    return moved / held if held else 0.0


def _np_outside(previous: np.ndarray, agreed: np.ndarray, raise_by: int, slack: int,
                agreed_held: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(held in both calls, held and outside the window) as numpy bool arrays; ``agreed_held``:
    ``agreed != EMPTY``, where already computed.  With ``t = agreed - previous`` (int64, exact):
    ``E > previous + raise_by`` is ``t > raise_by`` and ``previous + raise_by > E + slack`` is
    ``t < raise_by - slack``."""
    if agreed_held is None:
        agreed_held = agreed != EMPTY_EXPONENT
    held = agreed_held & (previous != EMPTY_EXPONENT)
    t = np.subtract(agreed, previous, dtype=np.int64)
    return held, held & ((t > raise_by) | (t < raise_by - slack))


def _torch_outside_window(previous: torch.Tensor, agreed: torch.Tensor, raise_by: int, slack: int) -> torch.Tensor:
    prev, e = previous.to(torch.int64), agreed.to(torch.int64)
    held = (agreed != EMPTY_EXPONENT) & (previous != EMPTY_EXPONENT)
    g = prev + raise_by
    return held & ((e > g) | (g > e + slack))
