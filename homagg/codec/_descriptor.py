"""The call descriptor: a few words at the head of every call's first round, so that ranks which
disagree about a call (tensor size, dtype, scheme, world size) fail within that round trip.

Without it, two ranks that call ``all_reduce`` on tensors of different sizes send rounds of
different lengths: the switch combines the words they share and the longer rank waits for words
the shorter one never sends, until its timeout names a worker that "has not been heard from" —
true but misleading.  With it, each field ``f`` travels as ``f`` and ``~f`` in one MAX stream;
the switch returns ``max f`` and ``~min f``, so every rank sees whether all ranks agree and, if
not, the range of each field.  The stream is the first of the round, so it rides in the round's
first datagram: a transport that passes each result as it arrives
(:attr:`~homagg.transport.Stream.verify`) reports a mismatch as soon as that datagram is back,
before waiting for words that will never come.

The stream is :data:`LENGTH` words: the 16 descriptor words, then :data:`SPARE` words that the
general path leaves at MAX's identity and the small-call path (:mod:`homagg.codec._small`) fills
with its block's exponent and negated guess, so every call's first datagram starts with an
18-word MAX chunk at offset 0 whichever path a rank takes: ranks that disagree about the size
(one on the small path, one on the general) still meet in that chunk, and both raise.

Invariant: :func:`check` raises :class:`~homagg.RankMismatchError` on every rank, with the same
message, exactly when some field differs between two ranks; agreeing ranks pay 72 bytes per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np
import torch

from ._config import SCHEMES
from .._errors import ProtocolError, RankMismatchError
from ..transport import AgreementCheck, Stream
from ..wire import CombineOp

__all__ = ["NAME", "FIELDS", "LENGTH", "SPARE", "AGREEMENT", "REDUCTIONS", "BARRIER", "describe", "words", "check"]

NAME = "descriptor"
#: descriptor fields, in stream order (each a non-negative int31; 62-bit values take two fields)
FIELDS = ("version", "numel", "numel_high", "dtype", "scheme", "world_size", "round_words", "round_words_high")
_VERSION = 2  #: 2: the stream carries :data:`SPARE` words after the fields
#: words after the fields' ``f`` and ``~f`` (MAX identity on the general path; the small path's
#: exponent and negated guess)
SPARE = 2
LENGTH = 2 * len(FIELDS) + SPARE
_EMPTY = -(2**31)
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64,
           torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool)
#: the scheme field of a MAX or MIN call (:mod:`._extremum`): codes after the SUM schemes'
REDUCTIONS = ("max", "min")
_REDUCTION_BASE = 64
#: the scheme field's name of a barrier's round (:mod:`._barrier`)
BARRIER = "barrier"
_BARRIER_CODE = 96
_LOW = (1 << 31) - 1


_WIDE = 16  #: added to a float dtype's code when its values travel as two words (``precision``)


def _dtype_code(dtype: torch.dtype, float_words: int = 1) -> int:
    return (_DTYPES.index(dtype) + 1 + _WIDE * (float_words - 1)) if dtype in _DTYPES else 0


def describe(numel: int, dtype: torch.dtype, scheme: str, world_size: int, streams: Sequence[Stream],
             device: torch.device, float_words: int = 1,
             verify: Callable[[torch.Tensor], None] | None = None) -> Stream:
    """The descriptor stream of a call whose first round carries ``streams`` (``float_words``:
    words per float value, part of the dtype field: ranks that differ in ``precision`` disagree),
    verified by :func:`check`, or by ``verify`` when given (the codec's
    :class:`~homagg.transport._base.CheckOnce` of :func:`check`)."""
    round_words = sum(s.length for s in streams)
    return Stream(NAME, CombineOp.MAX, _tensor(numel, dtype, scheme, world_size, round_words, float_words, device),
                  verify=check if verify is None else verify)


@lru_cache(maxsize=256)
def _tensor(numel: int, dtype: torch.dtype, scheme: str, world_size: int, round_words: int, float_words: int,
            device: torch.device) -> torch.Tensor:
    """The descriptor stream's words on ``device`` (:func:`words`, then :data:`SPARE` MAX
    identities), built once per call signature: a stream's words are only read (ports copy them
    into datagrams or combine copies; ``tests/test_rank_mismatch.py`` checks they stay)."""
    head = words(numel, dtype, scheme, world_size, round_words, float_words)
    return torch.tensor(head + (_EMPTY,) * SPARE, dtype=torch.int32).to(device)


@lru_cache(maxsize=1024)
def words(numel: int, dtype: torch.dtype, scheme: str, world_size: int, round_words: int,
          float_words: int = 1) -> tuple[int, ...]:
    """The ``2 * len(FIELDS)`` descriptor words (each field ``f``, then each ``~f``) of a call
    whose first round carries ``round_words`` other words (cached: a call signature repeats)."""
    values = (_VERSION, numel & _LOW, numel >> 31, _dtype_code(dtype, float_words),
              _scheme_code(scheme), world_size, round_words & _LOW, round_words >> 31)
    return values + tuple(~v for v in values)


def _scheme_code(scheme: str) -> int:
    if scheme in SCHEMES:
        return SCHEMES.index(scheme) + 1
    if scheme == BARRIER:
        return _BARRIER_CODE
    return _REDUCTION_BASE + REDUCTIONS.index(scheme) if scheme in REDUCTIONS else 0


def _name(key: str, value: int) -> str:
    if key == "dtype":
        wide, code = divmod(value, _WIDE)
        name = str(_DTYPES[code - 1]) if 0 < code <= len(_DTYPES) and wide < 2 else f"dtype #{value}"
        return name + " in two words" if wide == 1 else name
    if key == "scheme":
        if value == _BARRIER_CODE:
            return "a barrier"
        if 0 <= value - _REDUCTION_BASE < len(REDUCTIONS):
            return f"{REDUCTIONS[value - _REDUCTION_BASE]} (a MAX/MIN all_reduce)"
        return SCHEMES[value - 1] if 0 < value <= len(SCHEMES) else f"scheme #{value}"
    return f"{value:,}"


def check(combined: torch.Tensor | np.ndarray) -> None:
    """Raise :class:`RankMismatchError` naming every field on which the ranks disagree (the
    combined stream: :data:`LENGTH` words, or a small call's datagram starting with them)."""
    n = len(FIELDS)
    if isinstance(combined, np.ndarray):
        flat = combined.tolist()
    elif combined.is_cpu:  # read in place (a stream is 1-D: no reshape)
        flat = (combined if combined.dim() == 1 else combined.reshape(-1)).tolist()
    else:
        flat = combined.to("cpu").reshape(-1).tolist()
    if len(flat) < 2 * n or (not isinstance(combined, np.ndarray) and len(flat) != LENGTH):
        raise ProtocolError(f"descriptor: {len(flat)} combined words, expected {LENGTH}")
    high = flat[:n]
    low = [~v for v in flat[n:2 * n]]
    if high == low:
        return
    parts = []
    for i, key in enumerate(FIELDS):
        if key.endswith("_high"):
            continue
        wide = i + 1 < n and FIELDS[i + 1] == key + "_high"
        if low[i] == high[i] and not (wide and low[i + 1] != high[i + 1]):
            continue
        label = key.replace("_", " ")
        if wide and low[i + 1] != high[i + 1]:  # per-word MAX/MIN cannot rebuild a 62-bit range
            parts.append(f"{label} (differs; some rank's is >= 2**31)")
        else:
            base = low[i + 1] << 31 if wide else 0
            parts.append(f"{label} ({_name(key, base + low[i])} .. {_name(key, base + high[i])})")
    raise RankMismatchError(
        "ranks disagree about this all_reduce: " + "; ".join(parts)
        + " (min .. max over ranks; every rank must call all_reduce on tensors of the same size and "
          "dtype, in the same order, with the same options)")


#: :func:`check` as a round's ``verify`` that a port may judge itself (each field is MAX-combined as
#: itself and as its complement: the ranks agree exactly when word ``i`` is the complement of word
#: ``len(FIELDS) + i``; the native datapath checks that in C and calls :func:`check` only where it
#: fails, for the message)
AGREEMENT = AgreementCheck(lambda combined: check(combined), len(FIELDS))  # this module's check when called
