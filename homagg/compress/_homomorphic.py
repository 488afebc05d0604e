"""The homomorphic quantised allreduce: agree a scale with MAX, ADD packed codes, decode once.

Rounds (a generator of rounds, like the codec's protocols: it never knows how words travel)::

    first call   1  qscale (MAX, one word per block)            -> agreed scale code K
                 2  qcodes (ADD, packed codes under K)           -> summed codes
    steady       1  qscale (MAX) + qguess, qguessmax (MAX) + qcodes (ADD, under the guess)
                 2  qredo (ADD) only for blocks where workers guessed differently
    onebit       1  qscale (MAX) + qcodes (ADD): its codes do not depend on the scale

**The scale round is the codec's exponent round.**  A block's scale is coded as the integer ``k``
with ``2**(k/R) > sigma`` minimal (``R`` = ``steps`` grid points per octave; ``R = 1`` with
``sigma = max|x|`` gives exactly the codec's frexp block exponent, :func:`homagg.codec._blocks.exponents`),
``EMPTY_EXPONENT`` for an all-zero block.  MAX over workers gives the shared ``K``; the scale is
``2**(K/R)``, computed from the integer alone (a host table of ``2**(j/R)`` and an exact
``ldexp``), so every worker, on any device, uses the same float.

**Steady state: a guess that only has to be common, not exact.**  As in the codec
(:func:`homagg.codec._fixedpoint.guess_exponents`), each worker quantises under its guess
``max(previous K, own k)`` and sends, in the same round as its codes, its fresh ``k`` (MAX), its
guess (MAX) and ``-guess`` (MAX, i.e. the smallest guess).  Unlike the codec, a quantiser does not
need the *fresh* maximum: any scale at least every contributor's own one keeps the codes valid
(probabilities <= 1) as long as every contributor used the *same* one.  So a block is accepted when
the largest and smallest guess agree (then its scale is that guess, i.e. the previous ``K`` unless
some worker's scale rose above it) and is re-sent under the fresh ``K`` only otherwise (codes of a
worker whose block is all zero do not depend on the scale, so such a worker does not count).
Consequence: while gradient magnitudes shrink, a block's scale lags one call behind (at most the
previous call's maximum), which adds variance (stochastic codes) or raises the 2-bit threshold for
that call, but never bias; every call with no rising block takes a single round.  The fresh ``K``
is what the :class:`~homagg.History` records for the next guess.

**Packing.**  Codes ``u in [0, umax]`` summed over W workers fit in ``b = bit_length(W * umax)``
bits, so ``32 // b`` codes share one int32 word as disjoint bit lanes; ADD modulo 2**32 of such
words never carries between lanes (each lane's sum is < 2**b).  E.g. W = 4: onebit 10 codes per
word (3.2 bits each), TernGrad 8, QSGD with 16 levels 4.

Invariant: the decoded sum equals ``sum over workers of s * (a*u_w - c) / d`` with the block's
common scale ``s`` (>= every contributor's own scale), computed from exact integer sums with one float64 rounding; every worker gets the same
bits; each worker's own contribution (``own``) is exactly what it added, for error feedback.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Hashable

import torch

from .._errors import ConfigError, NonFiniteError
from ..codec._fixedpoint import EMPTY_EXPONENT, guess_exponents, negated_guess
from ..codec._history import Agreed, History
from ..codec._stats import WorkerStats
from ..codec._worker import Round, exchange
from ..transport._base import Stream, wrap_int32
from ..wire import CombineOp
from ._quantize import Quantizer

__all__ = ["scale_codes", "scales", "lane_bits", "pack", "unpack", "quantized_protocol", "QuantizedResult"]

QuantizedResult = tuple[torch.Tensor, torch.Tensor]  # (sum, own contribution), flat float64


def scale_codes(sigma: torch.Tensor, steps: int) -> torch.Tensor:
    """int32 ``k`` per block: the least integer with ``2**(k/steps) > sigma`` (EMPTY where sigma == 0)."""
    if sigma.numel() and not bool(torch.isfinite(sigma).all()):
        raise NonFiniteError("input holds non-finite values; nothing was sent")
    pos = sigma > 0
    safe = torch.where(pos, sigma, torch.ones_like(sigma))
    k = torch.floor(torch.log2(safe) * steps).to(torch.int64) + 1
    k = k + (scales(k, steps) <= safe).to(torch.int64)  # correct log2's last-bit rounding, both ways
    k = k - (scales(k - 1, steps) > safe).to(torch.int64)
    return torch.where(pos, k, torch.full_like(k, EMPTY_EXPONENT)).to(torch.int32)


def scales(k: torch.Tensor, steps: int) -> torch.Tensor:
    """float64 ``2**(k/steps)`` from integer codes alone (0 where ``k`` is EMPTY): identical everywhere."""
    k64 = k.to(torch.int64)
    table = torch.tensor([math.pow(2.0, j / steps) for j in range(steps)], dtype=torch.float64, device=k.device)
    empty = k64 == EMPTY_EXPONENT
    k64 = torch.where(empty, torch.zeros_like(k64), k64)
    out = torch.ldexp(table[torch.remainder(k64, steps)], torch.div(k64, steps, rounding_mode="floor"))
    return torch.where(empty, torch.zeros_like(out), out)


def lane_bits(world_size: int, umax: int) -> int:
    """Bits per code lane: enough for the sum of ``world_size`` codes in ``[0, umax]``."""
    b = (world_size * umax).bit_length()
    if b > 32:
        raise ConfigError(f"codes up to {umax} from {world_size} workers do not fit a 32-bit word")
    return b


def pack(u: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words holding the flat int64 codes ``u`` in ``32 // bits`` lanes each (zero-padded)."""
    m = 32 // bits
    n = u.numel()
    padded = torch.zeros(-(-n // m) * m, dtype=torch.int64, device=u.device)
    padded[:n] = u
    shifts = torch.arange(m, device=u.device, dtype=torch.int64) * bits
    return wrap_int32((padded.view(-1, m) << shifts).sum(dim=1))


def unpack(words: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """The first ``n`` int64 lane values of combined ``words`` (inverse of :func:`pack` for sums)."""
    m = 32 // bits
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(m, device=words.device, dtype=torch.int64) * bits
    return ((w.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1)[:n]


def _blocks_of(flat: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, block) float64 zero-padded view of ``flat`` and each block's real element count."""
    n = flat.numel()
    nb = -(-n // block)
    x = torch.zeros(nb * block, dtype=torch.float64, device=flat.device)
    x[:n] = flat
    counts = torch.full((nb,), float(block), dtype=torch.float64, device=flat.device)
    if nb and n % block:
        counts[-1] = float(n % block)
    return x.view(nb, block), counts


def quantized_protocol(flat: torch.Tensor, q: Quantizer, rank: int, world_size: int, key: Hashable,
                       stats: WorkerStats, history: History | None = None
                       ) -> Generator[Round, list[torch.Tensor], QuantizedResult]:
    """One worker's quantised SUM of ``flat``; returns ``(sum, own)`` as flat float64 tensors."""
    n = flat.numel()
    x, counts = _blocks_of(flat, q.block)
    nb = x.shape[0]
    k_local = scale_codes(q.local_scale(x, counts), q.steps)
    step = q.next_step(key)
    noise = None
    if q.stochastic:
        from ._base import generator
        gen = generator(flat.device, q.name, q.seed, str(key), step, rank)
        noise = torch.rand(x.shape, dtype=torch.float64, device=flat.device, generator=gen)
    bits = lane_bits(world_size, q.umax)
    slot = ("homagg.compress", q.name, str(key), n, world_size, q.block, q.steps)
    prior = history.get(slot) if history is not None else None
    if q.scale_free_codes:  # onebit: codes are signs; scale and codes share one round
        u = q.codes(x, scales(k_local, q.steps).unsqueeze(1), noise)
        agreed, words = yield from exchange([Stream("qscale", CombineOp.MAX, k_local),
                                             Stream("qcodes", CombineOp.ADD, pack(u.reshape(-1), bits))], stats)
        total = unpack(words, bits, nb * q.block).view(nb, q.block)
        fresh = agreed
    elif prior is None or prior.exponents is None or prior.exponents.numel() != nb:
        (agreed,) = yield from exchange([Stream("qscale", CombineOp.MAX, k_local)], stats)
        u = q.codes(x, scales(agreed, q.steps).unsqueeze(1), noise)
        (words,) = yield from exchange([Stream("qcodes", CombineOp.ADD, pack(u.reshape(-1), bits))], stats)
        total = unpack(words, bits, nb * q.block).view(nb, q.block)
        fresh = agreed
    else:
        guess = guess_exponents(prior.exponents.to(k_local.device), k_local)
        u = q.codes(x, scales(guess, q.steps).unsqueeze(1), noise)
        fresh, max_neg, max_guess, words = yield from exchange([
            Stream("qscale", CombineOp.MAX, k_local),
            Stream("qguess", CombineOp.MAX, negated_guess(guess)),
            Stream("qguessmax", CombineOp.MAX, guess),
            Stream("qcodes", CombineOp.ADD, pack(u.reshape(-1), bits)),
        ], stats)
        total = unpack(words, bits, nb * q.block).view(nb, q.block).clone()
        held = max_guess != EMPTY_EXPONENT
        bad = held & (-max_neg.to(torch.int64) != max_guess.to(torch.int64))
        used = torch.where(bad, fresh, max_guess)  # EMPTY where nobody holds a value (= fresh there)
        if bool(bad.any()):
            rows = torch.nonzero(bad).squeeze(1)
            s_bad = scales(fresh.index_select(0, rows), q.steps).unsqueeze(1)
            redo_u = q.codes(x.index_select(0, rows), s_bad, None if noise is None else noise.index_select(0, rows))
            u = u.clone()
            u[rows] = redo_u
            stats.redos += 1
            stats.redone += redo_u.numel()
            (fixed,) = yield from exchange([Stream("qredo", CombineOp.ADD, pack(redo_u.reshape(-1), bits))], stats)
            total[rows] = unpack(fixed, bits, redo_u.numel()).view(-1, q.block)
        agreed = used
    if history is not None:
        history.put(slot, Agreed(fresh, 0))
    s = scales(agreed, q.steps).unsqueeze(1)
    result = q.sum_values(total, s, world_size).reshape(-1)[:n]
    own = q.values(u, s).reshape(-1)[:n]
    return result, own
