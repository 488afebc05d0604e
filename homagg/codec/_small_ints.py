"""Small integer calls: one round of exact 16-bit limbs, the steady call in the port's own arrays.

An integer tensor of at most one block (a metric's counts, an early-stopping flag, a sample count:
torchmetrics and Lightning all_reduce int64 tensors every step) takes one round: the MAX stream of
the call descriptor (its two spare words EMPTY) and the ADD stream of its limbs
(:func:`homagg.codec._fixedpoint.to_limbs`: ``limbs - 1`` low 16-bit parts, then the signed top).
There is no exponent and no guess, so every call is steady: :class:`IntSteady` keeps a signature's
descriptor and, on a port that keeps own arrays (:meth:`~homagg.transport.SwitchPort.own_round`),
writes the limbs of a contiguous CPU tensor straight into them and the carried sums straight back
(no ``_Call``, no new arrays, no torch operations per call).  :func:`int_call` is the same round
through ``combine_arrays`` for every other case.

Invariant: both give the words, statistics, union counts and results of the general path's dense
protocol, bit for bit, and the same :class:`~homagg.IntegerOverflowError` where the exact sum does
not fit the dtype (the carry check of every element before the range check of any:
:func:`~homagg.codec._fixedpoint.from_limbs`' order); nothing is written before the checks pass.
``tests/test_small_ints.py`` runs the same calls through ports with and without own arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._errors import IntegerOverflowError
from ..transport import SwitchPort
from ..wire import CombineOp
from . import _descriptor
from ._fixedpoint import from_limbs, to_limbs
from ._small_grid import nonzero_rows
from ._stats import WorkerStats

__all__ = ["IntSteady", "int_call", "limbs_of"]

_OPS = (CombineOp.MAX, CombineOp.ADD)
#: up to this many elements the limbs are split and carried on Python numbers, above on arrays
_SCALAR = 16


def limbs_of(dtype: torch.dtype) -> int:
    """Words per value of an integer dtype: 4 for int64, else 2."""
    return 4 if dtype == torch.int64 else 2


class IntSteady:
    """One integer call signature (``n`` elements of ``dtype``; :func:`int_steady` keeps it): its
    descriptor round's template ``head`` (spare words EMPTY), stream lengths and byte counts
    (``homagg.codec._small._int_steady`` keeps one per signature)."""

    __slots__ = ("n", "dtype", "limbs", "head", "lengths", "value_bytes", "low", "high")

    def __init__(self, n: int, dtype: torch.dtype, head: np.ndarray) -> None:
        self.n, self.dtype, self.limbs = n, dtype, limbs_of(dtype)
        self.head = head  # read only: copied into the own array per call
        self.lengths = (_descriptor.LENGTH, n * self.limbs)
        self.value_bytes = 4 * n * self.limbs
        info = torch.iinfo(dtype)
        self.low, self.high = info.min, info.max

    def run(self, port: SwitchPort, stats: WorkerStats, view: np.ndarray) -> int | None:
        """The call of ``view`` (a contiguous CPU tensor's own memory, ``n`` elements), in place,
        in the port's own arrays; the union count, or None where the port keeps no own arrays
        (then nothing was sent or counted).  Counts as ``int_call``'s round does."""
        own = port.own_round(_OPS, self.lengths)
        if own is None:
            return None
        head, words = own.ins
        np.copyto(head, self.head)
        n, limbs = self.n, self.limbs
        if n <= _SCALAR:
            words[:] = _split(view.tolist(), limbs)
        else:
            np.copyto(words.reshape(n, limbs), to_limbs(torch.from_numpy(view), limbs).numpy())
        stats.rounds += 1
        sent = stats.bytes_per_stream
        sent[_descriptor.NAME] += 4 * _descriptor.LENGTH
        sent["values"] += self.value_bytes
        sums = own.run(_descriptor.AGREEMENT)[1]  # the descriptor's check runs exactly once
        if n <= _SCALAR:
            view[:] = self._carry(sums.tolist())
        else:
            view[:] = from_limbs(torch.from_numpy(sums.reshape(n, limbs)), self.dtype).numpy()
        return nonzero_rows(sums, limbs)

    def _carry(self, sums: list[int]) -> list[int]:
        """``from_limbs`` on Python numbers: the limb sums carried into values, with its checks."""
        limbs, values, tops = self.limbs, [], []
        for i in range(0, len(sums), limbs):
            carry = total = 0
            for k in range(limbs - 1):
                t = sums[i + k] + carry
                total |= (t & 0xFFFF) << (16 * k)
                carry = t >> 16
            top = sums[i + limbs - 1] + carry
            tops.append(top)
            values.append(total + (top << (16 * (limbs - 1))))
        if any(top < -(2**15) or top >= 2**15 for top in tops):
            raise IntegerOverflowError(f"the exact integer sum does not fit {self.dtype}")
        if self.dtype != torch.int64 and any(v < self.low or v > self.high for v in values):
            raise IntegerOverflowError(f"the exact integer sum does not fit {self.dtype} [{self.low}, {self.high}]")
        return values


def _split(values: list[int], limbs: int) -> list[int]:
    """The limbs of each value (low 16-bit parts, then the signed top), in order."""
    top = 16 * (limbs - 1)
    return [w for v in values for w in (*((v >> (16 * k)) & 0xFFFF for k in range(limbs - 1)), v >> top)]


def int_call(call: Any, values: list[int] | np.ndarray, dtype: torch.dtype) -> list[int] | np.ndarray:
    """The round through ``call`` (:class:`homagg.codec._small._Call`, any port): the values' limbs
    as its ADD stream; returns the exact sums (int64), with the general path's own carry and range
    checks (the same errors, word for word)."""
    limbs = call.limbs
    if isinstance(values, list):
        words = np.array(_split(values, limbs), dtype=np.int32)
    else:
        words = to_limbs(torch.from_numpy(values), limbs).numpy().reshape(-1)
    sums = call.round(None, None, words)[1].reshape(-1, limbs)
    return from_limbs(torch.from_numpy(sums), dtype).to(torch.int64).numpy()
