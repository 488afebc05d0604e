"""MAX and MIN all_reduce of small dense tensors through the switch's signed int32 MAX.

The switch combines words with ADD, OR and *signed MAX*; a MAX or MIN all_reduce is then one round
(two for some int64 calls), where gloo's ring takes 2(W-1) steps.  Each value becomes an int32 key
(an int64 key in two words) whose signed order is the values' order:

* integers of at most 32 bits, bool: the value itself, widened;
* float32 (float16 and bfloat16 widened to it, exactly): its bits, with the magnitude bits of a
  negative value flipped (``s ^ 0x7FFFFFFF`` for ``s < 0``), so ``-inf < ... < -0.0 < +0.0 < ... < +inf``;
* int64: the high word, its complement and the low word as signed (``lo - 2**31``: unsigned order),
  all MAXed in one round.  Where every rank's high word was the same (the MAX of the high words is
  the complement of the MAX of their complements: counts, steps, sizes under 2**32 of one sign)
  the low words' MAX is the answer; elsewhere a second round takes the low words of the ranks
  whose high word is the top one (the others send the int32 minimum);
* MIN: the keys' bitwise complement (``~k`` reverses signed order), MAX, complement back.

float64 is left to gloo: its values' high words differ almost always, and two rounds through the
emulator cost more than gloo's ring on a small host (measured in ``docs/benchmarks.md``).

The result is one rank's value, bit for bit (the key map is a bijection).  gloo's ``std::max``
and ``std::min`` chain differs only on two kinds of value: a NaN (kept or dropped by the order of
its operands) and zeros of both signs (either one).  So each rank also sends one flag word, 1
where its tensor holds a NaN or a negative zero; when the combined flag is set, every rank leaves
the tensor as it was and answers False, and the caller runs the call on gloo (every rank the same
way: the flag is the same on all).  Integers never set it.

Round: ``[descriptor (MAX, the agreement check), flag + keys (MAX)]`` (int64: flag, high words,
their complements, low words) and, where int64 high words differ, ``[low words (MAX)]``.  The
descriptor names the reduction (``max`` or ``min``) where a SUM call names its scheme: ranks in
different calls disagree on it (:class:`~homagg.RankMismatchError`).

Invariant: where :func:`allreduce` answers True, the tensor holds the elementwise MAX (MIN) over
the ranks, equal bit for bit to gloo's (``tests/test_extremum_calls.py``); where it answers False
nothing was written.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from .._errors import InputError
from ..transport import CombineOp, OwnRound, SwitchPort
from . import _descriptor
from ._fixedpoint import EMPTY_EXPONENT
from ._stats import WorkerStats

__all__ = ["DTYPES", "MAX_ELEMENTS", "REDUCTIONS", "allreduce", "takes"]

#: the reductions this path serves (the descriptor's names)
REDUCTIONS = _descriptor.REDUCTIONS
#: dtypes whose values become 32-bit keys (the rest of :data:`DTYPES`, int64: 64-bit keys, one or two rounds)
_KEY32 = (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float32, torch.float16,
          torch.bfloat16)
DTYPES = frozenset(_KEY32 + (torch.int64,))
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
#: the most elements one call takes here (a round of at most 16K words: the port's small plans)
MAX_ELEMENTS = 4096
_OPS1 = (CombineOp.MAX, CombineOp.MAX)
_OPS2 = (CombineOp.MAX,)
_I32_MIN = np.int32(-(2**31))
#: up to this many float32 or int32 elements the keys are made on Python numbers (:func:`_few`)
_FEW = 16
#: the own round's kept entry: the signature whose descriptor its head array holds
_extremum_key = "homagg.codec._extremum"


def takes(t: torch.Tensor) -> bool:
    """Whether this path takes ``t``: dense, contiguous, of a dtype in :data:`DTYPES`, 1 to
    :data:`MAX_ELEMENTS` elements (any device: a CUDA tensor goes through a host copy)."""
    return (t.layout == torch.strided and t.dtype in DTYPES and 0 < t.numel() <= MAX_ELEMENTS
            and t.is_contiguous())


def _keys32(x: torch.Tensor, out: np.ndarray) -> bool:
    """The int32 keys of a 32-bit-key tensor (CPU, contiguous) into ``out``; whether it holds a NaN or -0.0."""
    if x.dtype not in _FLOATS:
        out[:] = x.numpy() if x.dtype == torch.int32 else x.to(torch.int32).numpy()
        return False
    s = (x if x.dtype == torch.float32 else x.float()).view(torch.int32).numpy()
    _flip(s, out)  # -mag - 1 for a negative value
    # NaN: a magnitude above infinity's (either sign: max(k, ~k) is the magnitude); -0.0: key -1
    return bool((np.maximum(out, ~out) > 0x7F800000).any() or (out == -1).any())


def _flip(s: np.ndarray, out: np.ndarray) -> None:
    """float32 bits <-> keys (an involution): ``s ^ 0x7FFFFFFF`` where ``s < 0``, else ``s``."""
    np.bitwise_xor(s, (s >> 31) & 0x7FFFFFFF, out=out)


def _first_round(port: SwitchPort, own: OwnRound | None, head: np.ndarray, body: np.ndarray) -> np.ndarray:
    """The call's round of [descriptor, flag + keys] (the port's own arrays where it keeps them):
    the combined flag + keys."""
    if own is not None:
        return own.run(_descriptor.AGREEMENT)[1]
    return port.combine_arrays(_OPS1, [head, body], _descriptor.AGREEMENT)[1]


@lru_cache(maxsize=1024)
def _head(n: int, dtype: torch.dtype, reduction: str, world: int, words: int) -> np.ndarray:
    """The descriptor stream of a call signature (never handed out: copied into the round)."""
    head = _descriptor.words(n, dtype, reduction, world, words)
    return np.array(head + (EMPTY_EXPONENT,) * _descriptor.SPARE, dtype=np.int32)


def allreduce(t: torch.Tensor, port: SwitchPort, reduction: str, stats: WorkerStats | None = None) -> bool:
    """The elementwise ``reduction`` (``"max"`` or ``"min"``) of ``t`` (:func:`takes` it) over the
    workers behind ``port``, written into ``t``: True; or False where some rank's tensor holds a
    NaN or a negative zero (nothing written: the caller reduces it elsewhere, see the module
    docstring)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not takes(t):
        raise InputError(f"homagg MAX/MIN on the switch takes a dense contiguous tensor of 1 to {MAX_ELEMENTS} "
                         f"elements of {sorted(str(d) for d in DTYPES)}, got {t.dtype} {tuple(t.shape)} "
                         f"({t.layout}, contiguous={t.is_contiguous()})")
    x = t.detach()
    host = (x if x.device.type == "cpu" else x.to("cpu")).reshape(-1)
    n, wide = host.numel(), x.dtype not in _KEY32
    lengths = (_descriptor.LENGTH, 1 + (3 * n if wide else n))
    own = port.own_round(_OPS1, lengths)  # the port's own arrays, where it keeps them
    head, body = own.ins if own is not None else (np.empty(lengths[0], np.int32), np.empty(lengths[1], np.int32))
    sig = (n, x.dtype, reduction, port.world_size, lengths[1])
    if own is None or own.kept.get(_extremum_key) != sig:  # the descriptor, written once per signature
        np.copyto(head, _head(*sig))
        if own is not None:
            own.kept[_extremum_key] = sig
    if n <= _FEW and not wide and x.device.type == "cpu" and x.dtype in (torch.float32, torch.int32):
        return _few(x, host, port, own, head, body, reduction, stats)
    if wide:  # int64
        keys64, special = host.numpy(), False
        if reduction == "min":
            keys64 = ~keys64
        hi = (keys64 >> 32).astype(np.int32)
        lo = ((keys64 & 0xFFFFFFFF) - 0x80000000).astype(np.int32)  # unsigned order as signed
        body[1:n + 1], body[n + 1:2 * n + 1], body[2 * n + 1:] = hi, ~hi, lo
    else:
        special = _keys32(host, body[1:])
        if reduction == "min":
            np.invert(body[1:], out=body[1:])
    body[0] = special
    top = _first_round(port, own, head, body)
    rounds = 1
    if top[0]:  # a NaN or a -0.0 somewhere: gloo's order decides (every rank sees the same flag)
        _count(stats, rounds)
        return False
    if wide:
        high = top[1:n + 1].astype(np.int64)  # (copies: a next round may reuse the port's arrays)
        low = top[2 * n + 1:].copy()
        if not np.array_equal(top[1:n + 1], ~top[n + 1:2 * n + 1]):  # the ranks' high words differ somewhere
            low = _low_round(port, n, np.where(hi == high, lo, _I32_MIN))
            rounds += 1
        k64 = (high << 32) | (low.astype(np.int64) + 0x80000000)
        result = torch.from_numpy(~k64 if reduction == "min" else k64)
    else:
        k = ~top[1:] if reduction == "min" else top[1:].copy()
        if x.dtype in _FLOATS:
            _flip(k, k)
            result = torch.from_numpy(k).view(torch.float32)
        else:
            result = torch.from_numpy(k)
    x.copy_(result.view(x.shape))  # one rank's value: exact in x's dtype
    _count(stats, rounds)
    return True


def _low_round(port: SwitchPort, n: int, mine: np.ndarray) -> np.ndarray:
    """The second round of 64-bit keys: the MAX of the low words the ranks holding the top high
    word sent (the others sent the int32 minimum)."""
    own = port.own_round(_OPS2, (n,))
    if own is None:
        return port.combine_arrays(_OPS2, [mine.astype(np.int32)])[0]
    np.copyto(own.ins[0], mine, casting="unsafe")
    return own.run()[0].copy()


def _few(x: torch.Tensor, host: torch.Tensor, port: SwitchPort, own: OwnRound | None, head: np.ndarray,
         body: np.ndarray, reduction: str, stats: WorkerStats | None) -> bool:
    """:func:`allreduce` of a few float32 or int32 elements on the CPU: the keys on Python
    numbers (a dozen numpy calls on a few elements cost more than the round's own work)."""
    float32 = x.dtype == torch.float32
    bits = (host.view(torch.int32) if float32 else host).tolist()
    keys = [s ^ 0x7FFFFFFF if s < 0 else s for s in bits] if float32 else bits
    special = float32 and any(k == -1 or not -0x7F800001 <= k <= 0x7F800000 for k in keys)
    if reduction == "min":
        keys = [~k for k in keys]
    body[0] = special
    body[1:] = keys
    top = _first_round(port, own, head, body).tolist()
    _count(stats, 1)
    if top[0]:
        return False
    keys = [~k for k in top[1:]] if reduction == "min" else top[1:]
    if float32:
        keys = [k ^ 0x7FFFFFFF if k < 0 else k for k in keys]
    x.view(torch.int32).numpy().reshape(-1)[:] = keys  # one rank's value, bit for bit
    return True



def _count(stats: WorkerStats | None, rounds: int) -> None:
    if stats is not None:
        stats.rounds += rounds
