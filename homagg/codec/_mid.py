"""Mid-size steady calls: the general path's steady dense call of a float32 CPU tensor, in place,
without its per-call machinery.

A tensor of a few blocks to :data:`MAX_ELEMENTS` (a DDP bucket's tail, a layer's gradient, a
model's statistics) spends most of a steady call on the general path in Python set-up: a
:class:`~homagg.codec._worker.Worker`, the protocol's generators, ``Stream`` objects, the port's
stream-to-array conversion and the decoder's bookkeeping, several hundred microseconds against a
round whose C loop takes about as long.  This path runs the same steps on the same kernels, in
one function:

* the blocks' local exponents (``homagg_block_peaks32``, frexp) straight into the round's
  ``exponents`` array, the guess and its negation (``homagg_guess32``) into the ``guess`` array,
  the words under the guess (``homagg_quantize32``, or ``_wide`` for two words per value) into the
  ``values`` array: the port's own arrays where it keeps them
  (:meth:`~homagg.transport.SwitchPort.own_round`), else new arrays handed to
  :meth:`~homagg.transport.SwitchPort.combine` as the general path's named streams;
* one round of [descriptor, exponents, guess, values] (MAX, MAX, MAX, ADD): the streams, lengths
  and order of the general path's steady dense round (``_schemes._dense`` under a guess, with
  ``_schemes._described``'s descriptor), so the wire cannot tell the paths apart and a rank may
  take either (whether this one runs is a rank's own business: a port without own arrays, a
  non-finite input, a tensor not in place);
* ``homagg_settle32`` (the blocks to redo, the decode exponents, the ``changed`` counts), the
  general path's redo round where a block left the window, ``homagg_dequantize32`` into the
  tensor, and the history's record.

It takes a call only where the general path would run exactly that: a steady call (a history
entry with one exponent per block, ``_guess_pays``) whose continuation is dense (scheme
``dense``, or ``auto`` choosing dense from the remembered union); any other call goes the
general way, as does an input holding NaN or an infinity (whose error that path raises before
anything is sent).

Invariant: the words sent, the rounds, the results, the statistics and the history's record are
the general path's, bit for bit (``tests/test_mid_calls.py`` runs both on the same inputs,
redos included).
"""

from __future__ import annotations

from collections.abc import Hashable
from functools import lru_cache

import numpy as np
import torch

from ..transport import CheckOnce, Stream, SwitchPort
from ..wire import CombineOp
from . import _descriptor, _exponent_native, _exponents, _hostops, _mid_native, _native
from ._blocks import _float32_limit, dequantize_into, quantize
from ._config import CodecConfig
from ._cost import choose
from ._fixedpoint import EMPTY_EXPONENT, float_words, precision_bits
from ._history import Agreed, History
from ._host_factors import frexp_exponents32, grid_factors32_kept
from ._schemes import guess_pays
from ._stats import WorkerStats

__all__ = ["MAX_ELEMENTS", "allreduce"]

#: the largest tensor this path takes (1 MiB of float32: above it the round's own set-up is a
#: small part of a call, and large tensors stream in segments)
MAX_ELEMENTS = 1 << 18
_OPS = (CombineOp.MAX, CombineOp.MAX, CombineOp.MAX, CombineOp.ADD)
#: the general path's names of the round's streams (``_descriptor.describe``, ``Worker.guess_streams``,
#: ``Worker.dense_stream``)
_NAMES = (_descriptor.NAME, "exponents", "guess", "values")


class _Signature:
    """The constants of one call signature (numel, scheme, world, the config's grid): the
    descriptor's words, the round's lengths, the guess window and the float32 clamp."""

    __slots__ = ("n", "blocks", "limbs", "p", "limit", "raise_by", "slack", "head", "lengths", "value_bytes", "quantize")

    def __init__(self, n: int, scheme: str, world: int, block_size: int, precision: str, window: bool) -> None:
        from ._worker import _window

        limbs = float_words(precision, world)
        self.n, self.limbs, self.blocks = n, limbs, -(-n // block_size)
        self.p = precision_bits(world, limbs)
        self.limit = _float32_limit(self.p)
        self.raise_by, self.slack = _window(world, limbs, window)
        value_words = n * limbs
        self.lengths = (_descriptor.LENGTH, self.blocks, self.blocks, value_words)
        self.head = np.array(_descriptor.words(n, torch.float32, scheme, world, 2 * self.blocks + value_words, limbs)
                             + (EMPTY_EXPONENT,) * _descriptor.SPARE, dtype=np.int32)
        self.value_bytes = 4 * value_words
        self.quantize = _native.quantize32 if limbs == 1 else _native.quantize32_wide


@lru_cache(maxsize=1024)
def _signature(n: int, scheme: str, world: int, block_size: int, precision: str, window: bool) -> _Signature | None:
    """The kept :class:`_Signature` of a call, or None where this path never takes it (a single
    block: the small-call path's; two words per value without the wide kernels)."""
    if not block_size < n <= MAX_ELEMENTS:
        return None
    sig = _Signature(n, scheme, world, block_size, precision, window)
    if sig.limbs != 1 and not _native.WIDE:
        return None
    return sig


def allreduce(tensor: torch.Tensor, port: SwitchPort, scheme: str, cfg: CodecConfig, stats: WorkerStats,
              history: History | None, key: Hashable) -> bool:
    """The exact SUM of ``tensor`` over the workers behind ``port``, written into ``tensor``,
    where this path takes the call (see the module docstring): True once done, False where it
    does not take it (nothing was sent or counted: the general path runs the call)."""
    # the kernels, asked per call (``homagg.bench``'s device_paths turns them off for a while), and
    # a tensor the host reads for free (not a CUDA one, nor one that the codec treats as such)
    if (history is None or tensor.dtype != torch.float32 or not _hostops.reads_free(tensor)
            or not (_native.AVAILABLE and _exponent_native.AVAILABLE) or tensor.layout != torch.strided
            or not tensor.is_contiguous() or scheme not in ("auto", "dense")):
        return False
    n, world, block = tensor.numel(), port.world_size, cfg.block_size
    sig = _signature(n, scheme, world, block, cfg.precision, cfg.guess_window)
    if sig is None:
        return False
    slot = (key, n, torch.float32, world, block)
    prior = history.get(slot)
    if prior is None or not _continues_dense(prior, sig, scheme, cfg):
        return False
    previous = prior.exponents
    assert previous is not None
    flat = (tensor.detach() if tensor.requires_grad else tensor).view(-1)
    own = port.own_round(_OPS, sig.lengths)
    kernel: _mid_native.MidKernel | None = None
    if own is not None and _mid_native.AVAILABLE:  # the steps in one C call, into the port's own arrays
        kernel = own.kept.get(sig)
        if kernel is None:
            kernel = own.kept[sig] = _mid_native.MidKernel(sig, block, own.ins)
        arrays = own.ins
        if kernel.encode(flat.data_ptr(), previous.data_ptr(), flat.data_ptr()) != _mid_native.ENCODED:
            return False  # a NaN or an infinity: the general path raises NonFiniteError, before anything is sent
    else:
        arrays = own.ins if own is not None else _arrays(sig)
        if not _encode(sig, flat.numpy(), block, previous, arrays):
            return False
    stats.schemes["dense"] += 1
    stats.rounds += 1
    sent = stats.bytes_per_stream
    sent[_descriptor.NAME] += 4 * _descriptor.LENGTH
    sent["exponents"] += 4 * sig.blocks
    sent["guess"] += 4 * sig.blocks
    sent["values"] += sig.value_bytes
    # the descriptor's check runs exactly once (a mismatch raises here, nothing decoded)
    # the values decode into the tensor as their chunks come (``kernel.on_results``, where the
    # settle allows it): the inputs are in the round's arrays by now, never read from the tensor again
    combined = own.run(_descriptor.AGREEMENT, kernel.on_results if kernel is not None else None) \
        if own is not None else _named_round(port, arrays)
    agreed = torch.from_numpy(combined[1].copy())  # the history keeps it: the own arrays are the port's
    if kernel is not None and kernel.decode(combined, flat.data_ptr()) == _mid_native.DECODED:
        union, held, moved = kernel.figures()
        history.put(slot, Agreed(agreed, union, moved / held if held else 0.0, 0, prior.changed))
        return True
    # a block to redo, a float64 decode, or no kernels: the steps one by one (nothing was written yet)
    settled = _exponents.settle_exponents(agreed, torch.from_numpy(combined[2]), sig.raise_by, sig.slack, previous)
    sums = torch.from_numpy(combined[3])
    bad = settled.bad.numpy()
    if bad.any():  # ``_schemes._dense``'s redo round: the blocks whose guess missed, under the agreed exponents
        redo = _positions(bad, block, n)
        stats.redos += 1
        stats.redone += redo.numel()
        again = quantize(flat, settled.exponents, world, block, settled.bad, sig.limbs)
        stats.rounds += 1
        sent["redo"] += 4 * again.numel()
        (fixed,) = port.combine([Stream("redo", CombineOp.ADD, again)])
        sums = sums.clone().reshape(-1, sig.limbs)  # the port's own arrays are never written
        sums[redo] = fixed.reshape(-1, sig.limbs)
        sums = sums.reshape(-1)
    counted = dequantize_into(flat, sums, settled.exponents, world, block, None, sig.limbs)
    union = counted if counted is not None else int(
        torch.count_nonzero(sums.reshape(-1, sig.limbs).any(dim=1) if sig.limbs > 1 else sums))
    changed = settled.changed
    if changed is None:  # pragma: no cover - host tensors of one shape: settle counted them
        changed = _exponents.changed_fraction(previous, agreed, sig.raise_by, sig.slack)
    history.put(slot, Agreed(agreed, union, changed, 0, prior.changed))
    return True


def _encode(sig: _Signature, x: np.ndarray, block_size: int, previous: torch.Tensor, arrays: list[np.ndarray]) -> bool:
    """:mod:`._mid_native`'s encode, one kernel call at a time: the round's ``arrays`` written, or
    False for a NaN or an infinity (nothing written)."""
    peaks, nonfinite = _native.block_peaks32(x, block_size)
    if nonfinite:
        return False
    head, local, negated, words = arrays
    np.copyto(head, sig.head)
    np.copyto(local, frexp_exponents32(peaks))
    guess = np.empty(sig.blocks, dtype=np.int32)
    _exponent_native.guess32(previous.data_ptr(), local.ctypes.data, sig.blocks, sig.raise_by, guess.ctypes.data,
                             negated.ctypes.data)
    f1, f2 = grid_factors32_kept(guess, sig.p)
    sig.quantize(x, block_size, f1, f2, sig.limit, words)
    return True


def _continues_dense(prior: Agreed, sig: _Signature, scheme: str, cfg: CodecConfig) -> bool:
    """Whether the general path's steady call (``_schemes._steady``) of this entry is dense under
    a guess: one exponent per block kept on the host, the guess pays (``_guess_pays``), and the
    continuation (``auto``'s choice from the remembered union) is dense."""
    held = prior.exponents
    if held is None or held.numel() != sig.blocks or not held.is_cpu or held.dtype != torch.int32 \
            or not held.is_contiguous():
        return False
    if not guess_pays(prior, sig.n, sig.limbs, sig.blocks):
        return False
    return scheme == "dense" or choose(sig.n, float(prior.union), sig.limbs, cfg) == "dense"


def _named_round(port: SwitchPort, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """The round through :meth:`~homagg.transport.SwitchPort.combine` as the general path sends
    it: its streams' names and the descriptor's :class:`~homagg.transport.CheckOnce` (a port that
    keeps no own arrays may compare the names: the in-process switch, a replay), checked here
    where the port did not (``_schemes._first_results``)."""
    once = CheckOnce(_descriptor.AGREEMENT)
    streams = [Stream(name, op, torch.from_numpy(a), verify=once if j == 0 else None)
               for j, (name, op, a) in enumerate(zip(_NAMES, _OPS, arrays))]
    combined = port.combine(streams)
    if not once.called:
        once(combined[0])
    return [t.numpy() for t in combined]


def _arrays(sig: _Signature) -> list[np.ndarray]:
    """The round's input arrays where the port keeps none (new per call: a port without own
    arrays copies or binds them, and a call on another thread may run beside this one)."""
    return [np.empty(k, dtype=np.int32) for k in sig.lengths]


def _positions(bad: np.ndarray, block_size: int, n: int) -> torch.Tensor:
    """Sorted flat positions of every element of the blocks flagged in ``bad``
    (:meth:`~homagg.codec._worker.Worker.block_positions`)."""
    pos = (np.flatnonzero(bad)[:, None] * block_size + np.arange(block_size)).reshape(-1)
    return torch.from_numpy(pos[pos < n])
