"""Small calls: the dense protocol of a tensor of at most one block, in scalar arithmetic.

A metric, a gradient norm or a loss scale all_reduced every step is a few elements; the general
path (:mod:`homagg.codec._schemes`) spends hundreds of microseconds of tensor operations,
generators and per-stream transport set-up on it.  A dense (strided) tensor with ``numel <=
block_size`` (one exponent block) and scheme ``auto`` or ``dense`` takes this path instead
(:func:`takes`, ``CodecConfig.small_calls``; agreed inputs only, so every rank takes the same):

* its values are read to the host once (a list of Python numbers) and quantised, decoded and
  carried in integer arithmetic (``math.frexp``/``math.ldexp``, ``round``: the grid of
  :mod:`homagg.codec._fixedpoint`, whose float32 and float64 steps are exact power-of-two
  scalings followed by one round-half-even, so Python's float64 arithmetic computes the same
  integers; the decoded float64 value is rounded to the dtype by the same torch conversion);
* a round is at most two host streams through :meth:`~homagg.transport.SwitchPort.combine_arrays`:
  one MAX stream of :data:`~homagg.codec._descriptor.LENGTH` words (the call descriptor, then the
  block's fresh exponent and negated guess in its two spare words) and one ADD stream of values.

Rounds (``L`` words per value, ``n`` elements):

============================  ====================================================  ========
call                          rounds                                                datagrams
============================  ====================================================  ========
float, first (or no guess)    1 MAX [descriptor, exponent, -] ; 2 ADD values         2
float, steady                 1 MAX [descriptor, exponent, -guess] + ADD values      2
                              (+ 1 ADD redo if the guess missed the window)
integer                       1 MAX [descriptor, -, -] + ADD limbs                   2
============================  ====================================================  ========

``auto`` on the general path would estimate the union first (a sample bitmap and nonzero counts
in the exponent round) to choose a continuation; for one block the continuations give the same
integer sums (first calls quantise under the agreed exponent on every scheme; steady dense and
sketch both quantise under the common guess and redo the blocks it missed), so this path runs
dense without the estimate.

Invariant: results, :class:`~homagg.History` decisions (guess or agree first, the window, the
redo) and the recorded ``changed`` figures are those of the general path's dense protocol, bit
for bit (``tests/test_small_calls.py`` compares both on random inputs of every dtype); the
recorded ``union`` counts nonzero sums, as dense does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from functools import lru_cache

import numpy as np
import torch

from .._errors import NonFiniteError
from ..transport import SwitchPort
from ..wire import CombineOp
from . import _descriptor
from ._config import CodecConfig
from ._fixedpoint import EMPTY_EXPONENT, float_words, from_limbs, guess_slack, precision_bits
from ._history import Agreed, History
from ._stats import WorkerStats

__all__ = ["takes", "allreduce"]

EMPTY = EMPTY_EXPONENT
_FLOATS = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
_INTS = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
#: dtypes whose result a CPU tensor's numpy view takes directly (float16/bfloat16 go through torch's
#: own conversion from float64, as the general path's)
_NUMPY = frozenset({torch.float32, torch.float64, torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8})
_OPS = (CombineOp.MAX, CombineOp.ADD)
_MAX_ONLY = (CombineOp.MAX,)
_ADD_ONLY = (CombineOp.ADD,)
#: 1-element int32 exponent tensors for the history, one per exponent (never mutated)
_EXPONENTS: dict[int, torch.Tensor] = {}
#: ... and their values, by the tensor's id (the tensors above live as long as the module)
_VALUES: dict[int, int] = {}


def takes(tensor: torch.Tensor, scheme: str, cfg: CodecConfig, world_size: int) -> bool:
    """Whether ``tensor`` takes the small-call path (depends on agreed inputs only): ``auto``
    only where its cost model can never choose compact for this size (compact's steady calls agree
    exponents first: other integer sums than dense's guess), which holds for one block under
    every default."""
    n = tensor.numel()
    if not (cfg.small_calls and tensor.layout == torch.strided and 0 < n <= cfg.block_size):
        return False
    dtype = tensor.dtype
    if dtype in _FLOATS:
        limbs = float_words(cfg.precision, world_size)
    elif dtype in _INTS:
        limbs = 4 if dtype == torch.int64 else 2
    else:
        return False
    return scheme == "dense" or (scheme == "auto" and _never_compact(
        n, limbs, cfg.bandwidth_gbps, cfg.rtt_us, cfg.dense_ns, cfg.bitmap_levels))


@lru_cache(maxsize=4096)
def _never_compact(n: int, limbs: int, bandwidth_gbps: float, rtt_us: float, dense_ns: float,
                   bitmap_levels: int | None) -> bool:
    """Compact's modelled cost (:func:`homagg.codec._schemes.choose`) at an empty union, its
    cheapest, is no lower than dense's (which does not depend on the union; ties go to dense).
    Keyed by the cost model's fields (hashing a whole :class:`CodecConfig` costs more than this)."""
    from ._schemes import _bitmap_cost_of

    dense = 4 * n * limbs / (bandwidth_gbps * 1e9 / 8) + rtt_us * 1e-6 + n * dense_ns * 1e-9
    return _bitmap_cost_of(n, 0.0, bandwidth_gbps, rtt_us, bitmap_levels)[0] >= dense


def _exponent_tensor(e: int) -> torch.Tensor:
    t = _EXPONENTS.get(e)
    if t is None:
        t = _EXPONENTS[e] = torch.tensor([e], dtype=torch.int32)
        _VALUES[id(t)] = e
    return t


def allreduce(tensor: torch.Tensor, port: SwitchPort, scheme: str, cfg: CodecConfig, stats: WorkerStats,
              inplace: bool, history: History | None, key: Hashable) -> torch.Tensor:
    """The exact SUM of ``tensor`` over the workers behind ``port`` (see the module docstring);
    ``inplace``: written into ``tensor``, which is returned."""
    dtype, n, world = tensor.dtype, tensor.numel(), port.world_size
    view: np.ndarray | None = None  # a contiguous CPU tensor's own memory, when numpy can hold its dtype
    if dtype in _NUMPY and tensor.device.type == "cpu" and tensor.is_contiguous():
        view = tensor.detach().numpy().reshape(-1)
        host: torch.Tensor | np.ndarray = view
    else:
        flat = tensor.detach().reshape(-1)
        host = flat if flat.device.type == "cpu" else flat.cpu()
    slot = (key, n, dtype, world, cfg.block_size)
    prior = history.get(slot) if history is not None else None
    stats.schemes["dense"] += 1
    call = _Call(port, stats, n, dtype, scheme, world)
    if dtype in _FLOATS:
        call.limbs = float_words(cfg.precision, world)
        values = host.tolist() if n <= _SCALAR else (
            host.astype(np.float64) if view is not None else host.to(torch.float64).numpy())
        out, exponents, changed = _float_call(call, values, cfg, prior)
    else:
        call.limbs = 4 if dtype == torch.int64 else 2
        values = host.tolist() if n <= _SCALAR else (
            host.astype(np.int64) if view is not None else host.to(torch.int64).numpy())
        out = _int_call(call, values, dtype)
        exponents, changed = None, 0.0
    if history is not None:
        before = prior.changed if prior is not None else 0.0
        if not _same(prior, exponents, call.union, changed, before):
            history.put(slot, Agreed(exponents, call.union, changed, 0, before))
    if inplace and view is not None:
        view[:] = out  # numpy's float64 -> float32 cast rounds as torch's copy_ does (C's cast)
        return tensor
    flat = tensor.detach().reshape(-1)
    if isinstance(out, list):
        result = torch.tensor(out, dtype=torch.float64 if dtype in _FLOATS else torch.int64)
    else:
        result = torch.from_numpy(out)
    if inplace:
        if flat.data_ptr() == tensor.data_ptr() and tensor.is_contiguous():
            flat.copy_(result)
        else:
            tensor.copy_(result.reshape(tensor.shape))
        return tensor
    return result.to(dtype).reshape(tensor.shape).to(tensor.device)


def _same(prior: Agreed | None, exponents: torch.Tensor | None, union: int, changed: float,
          changed_before: float) -> bool:
    """Whether this call's record (``Agreed(exponents, union, changed, 0, changed_before)``) says
    what the stored ``prior`` says (a steady call that changed nothing: the entry stays, and
    :meth:`History.get` already made it the most recent; no record is made)."""
    return (prior is not None and exponents is prior.exponents and union == prior.union
            and changed == prior.changed and changed_before == prior.changed_before and prior.local_nnz == 0)


class _Call:
    """One small call's rounds through the port: the descriptor on the first, statistics."""

    __slots__ = ("port", "stats", "n", "dtype", "scheme", "world", "limbs", "first", "union")

    def __init__(self, port: SwitchPort, stats: WorkerStats, n: int, dtype: torch.dtype, scheme: str,
                 world: int) -> None:
        self.port, self.stats, self.n, self.dtype, self.scheme, self.world = port, stats, n, dtype, scheme, world
        self.limbs = 1
        self.first = True
        self.union = 0  #: elements with a nonzero combined word (the dense scheme's union count)

    def round(self, exponent: int | None, negated_guess: int | None, words: np.ndarray | None,
              name: str = "values") -> tuple[list[int], np.ndarray]:
        """One round: the MAX datagram (first round only: the descriptor, then ``exponent`` and
        ``negated_guess``, EMPTY where None) and/or the ADD ``words``; returns the combined spare
        words (first round, else empty) and the combined ADD words (empty where none)."""
        stats = self.stats
        stats.rounds += 1
        arrays: list[np.ndarray] = []
        verify: Callable[[np.ndarray], None] | None = None
        if self.first:
            self.first = False
            round_words = _descriptor.SPARE + (words.size if words is not None else 0)
            head = _head(self.n, self.dtype, self.scheme, self.world, round_words,
                         self.limbs if self.dtype in _FLOATS else 1).copy()
            head[-2] = EMPTY if exponent is None else exponent
            head[-1] = EMPTY if negated_guess is None else negated_guess
            arrays.append(head)
            stats.bytes_per_stream[_descriptor.NAME] += 4 * _descriptor.LENGTH
            verify = _descriptor.check
        if words is not None:
            arrays.append(words)
            stats.bytes_per_stream[name] += 4 * words.size
        ops: Sequence[CombineOp] = _OPS if len(arrays) == 2 else (_MAX_ONLY if verify is not None else _ADD_ONLY)
        # every port's combine_arrays runs ``verify`` on the descriptor's combined words exactly once
        # (SwitchPort.combine_arrays' contract): a mismatch has raised by now
        combined = self.port.combine_arrays(ops, arrays, verify)
        spare: list[int] = []
        if verify is not None:
            spare = combined[0][-_descriptor.SPARE:].tolist()
        sums = combined[-1] if words is not None else _NONE
        if words is not None:
            self.union = _nonzero_rows(sums, self.limbs)
        return spare, sums


@lru_cache(maxsize=1024)
def _head(n: int, dtype: torch.dtype, scheme: str, world: int, round_words: int, limbs: int) -> np.ndarray:
    """The first round's MAX array of a call signature: the descriptor words, then the two spare
    words (set per call on a copy; this array is never handed out)."""
    return np.array(_descriptor.words(n, dtype, scheme, world, round_words, limbs) + (EMPTY, EMPTY), dtype=np.int32)


#: up to this many elements a call computes on Python numbers, above it on numpy arrays (the same
#: operations: ``ldexp``, round half to even, clamp; the tests run both against the general path)
_SCALAR = 16
_NONE = np.zeros(0, dtype=np.int32)


# ---------------------------------------------------------------------------------------- floats
def _float_call(call: _Call, values: list[float] | np.ndarray, cfg: CodecConfig,
                prior: Agreed | None) -> tuple[list[float] | np.ndarray, torch.Tensor, float]:
    """Mirror of the general dense protocol for one block (``_schemes._first_call``/``_steady``,
    :class:`~homagg.codec._worker.Worker`'s guess, settle and redo); returns the values, the
    agreed exponent (one of :data:`_EXPONENTS`) and the ``changed`` figure to record."""
    local = _local_exponent(values)
    limbs = call.limbs
    p, limit, slack = _grid(call.world, limbs, call.dtype == torch.float64, cfg.guess_window)
    raise_by = slack // 2
    previous: int | None = None
    held = prior.exponents if prior is not None else None
    if held is not None:
        previous = _VALUES.get(id(held))
        if previous is None or _EXPONENTS.get(previous) is not held:  # not one of ours (ours hold one word)
            previous = int(held[0]) if held.numel() == 1 else None
    if previous is not None and prior is not None and min(prior.changed, prior.changed_before) * call.n * limbs <= 1:
        # steady: quantise under the guess (``_schemes._guess_pays`` for one block)
        raised = previous if previous == EMPTY else previous + raise_by
        guess = EMPTY if local == EMPTY else max(raised, local)
        (agreed, negated), sums = call.round(local, EMPTY if guess == EMPTY else -guess,
                                             _quantize(values, guess, p, limit, limbs))
        low = -negated
        bad = agreed != EMPTY and (low < agreed or low > agreed + slack)
        used = low if (agreed != EMPTY and not bad) else agreed
        if bad:
            call.stats.redos += 1
            call.stats.redone += call.n
            sums = call.round(None, None, _quantize(values, agreed, p, limit, limbs), "redo")[1]
    else:
        agreed = call.round(local, None, None)[0][0]
        used = agreed
        sums = call.round(None, None, _quantize(values, agreed, p, limit, limbs))[1]
    changed = 0.0
    if previous is not None and agreed != EMPTY and previous != EMPTY:  # _schemes._changed, one block
        g = previous + raise_by
        changed = 1.0 if (agreed > g or g > agreed + slack) else 0.0
    return _dequantize(sums, used, p, limbs, isinstance(values, list)), _exponent_tensor(agreed), changed


@lru_cache(maxsize=256)
def _grid(world: int, limbs: int, float64: bool, window: bool) -> tuple[int, int, int]:
    """(P, clamp limit, guess slack) of a call (:func:`homagg.codec._blocks.quantize`'s limit: the
    largest float32 below ``2**P`` where the work type is float32 and ``P > 24``)."""
    p = precision_bits(world, limbs)
    limit = (2**p - 1) if float64 or p <= 24 else 2**p - 2 ** (p - 24)
    return p, limit, (guess_slack(world, limbs) if window else 0)


def _local_exponent(values: list[float] | np.ndarray) -> int:
    """frexp exponent of the largest |value| (EMPTY for all zeros); NonFiniteError for NaN/Inf."""
    if isinstance(values, list):
        peak = 0.0
        for x in values:
            a = abs(x)
            if not a <= peak:
                if a != a or a == math.inf:
                    peak = math.nan
                    break
                peak = a
    else:
        peak = float(np.max(np.abs(values)))
    if not math.isfinite(peak):
        bad = sum(1 for v in values if not math.isfinite(v))
        raise NonFiniteError(f"input holds {bad} non-finite value(s); nothing was sent")
    return math.frexp(peak)[1] if peak else EMPTY


def _quantize(values: list[float] | np.ndarray, exponent: int, p: int, limit: int, limbs: int) -> np.ndarray:
    """int32 grid words of ``values`` under ``exponent`` (:func:`homagg.codec._blocks.quantize`):
    each ``clamp(round(x * 2**(P - E)), +-limit)``, one word or the two limbs (low, high)."""
    shift = 0 if exponent == EMPTY else p - exponent
    if isinstance(values, list):
        ldexp = math.ldexp
        qs = [min(max(round(ldexp(x, shift)), -limit), limit) for x in values]
        if limbs == 1:
            return np.array(qs, dtype=np.int32)
        return np.array([w for q in qs for w in (q & 0xFFFF, q >> 16)], dtype=np.int32)
    q = np.clip(np.rint(np.ldexp(values, shift)), -limit, limit).astype(np.int64)
    if limbs == 1:
        return q.astype(np.int32)
    return np.stack([q & 0xFFFF, q >> 16], axis=1).reshape(-1).astype(np.int32)


def _dequantize(sums: np.ndarray, exponent: int, p: int, limbs: int, scalar: bool) -> list[float] | np.ndarray:
    """float64 values ``sum * 2**(E - P)`` (exact: |sum| < 2**47), rounded once to the dtype by
    the caller's conversion, as :func:`homagg.codec._blocks.dequantize_into`."""
    shift = 0 if exponent == EMPTY else exponent - p
    if scalar:
        ldexp, s = math.ldexp, sums.tolist()
        if limbs == 1:
            return [ldexp(v, shift) for v in s]
        return [ldexp(s[i + 1] * 65536 + s[i], shift) for i in range(0, len(s), 2)]
    joined = sums.astype(np.float64) if limbs == 1 else sums[1::2].astype(np.float64) * 65536.0 + sums[0::2]
    return np.ldexp(joined, shift)


def _nonzero_rows(sums: np.ndarray, limbs: int) -> int:
    """Elements with a nonzero combined word (the dense scheme's union count)."""
    if limbs == 1:
        return int(np.count_nonzero(sums))
    return int(np.count_nonzero(sums.reshape(-1, limbs).any(axis=1)))


# -------------------------------------------------------------------------------------- integers
def _int_call(call: _Call, values: list[int] | np.ndarray, dtype: torch.dtype) -> list[int] | np.ndarray:
    """Exact 16-bit limbs (:func:`homagg.codec._fixedpoint.to_limbs` / ``from_limbs``): one round."""
    limbs = call.limbs
    top = 16 * (limbs - 1)
    if isinstance(values, list):
        words = np.array([w for v in values for w in [*((v >> (16 * k)) & 0xFFFF for k in range(limbs - 1)), v >> top]],
                         dtype=np.int32)
    else:
        words = np.stack([(values >> (16 * k)) & 0xFFFF for k in range(limbs - 1)] + [values >> top],
                         axis=1).reshape(-1).astype(np.int32)
    sums = call.round(None, None, words)[1].reshape(-1, limbs)
    # the general path's own carry and range checks (the same errors, word for word)
    return from_limbs(torch.from_numpy(sums), dtype).to(torch.int64).numpy()

