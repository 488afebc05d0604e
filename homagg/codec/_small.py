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
  block's fresh exponent and negated guess in its two spare words) and one ADD stream of values;
  a steady call (:class:`_Steady`) writes them into the port's own arrays where it keeps them
  (:meth:`~homagg.transport.SwitchPort.own_round`: no copies, checks or new arrays), and the
  descriptor goes as :data:`~homagg.codec._descriptor.AGREEMENT`, which the native datapath
  judges in C (the Python check runs only where ranks disagree, for its message);
* a steady in-place call of a contiguous CPU float32/float64 tensor encodes and decodes in C
  (:meth:`_Steady.native`, :mod:`homagg.codec._small_native`): the elements read from the tensor's
  memory into the own arrays and the sums written back, no Python numbers in between; a device
  tensor of those dtypes (or an integer one) runs on a host copy, one copy there and one back.

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

from collections.abc import Callable, Hashable, Sequence
from functools import lru_cache

import numpy as np
import torch

from ..transport import SwitchPort
from ..wire import CombineOp
from . import _descriptor, _hostops, _small_native
from ._config import CodecConfig
from ._fixedpoint import float_words
from ._history import Agreed, History
from ._small_ints import IntSteady, int_call, limbs_of
from ._small_grid import (EMPTY, changed_figure, decode, dequantize, exponent_tensor, grid, local_exponent,
                          nonzero_rows, previous_exponent, quantize)
from ._stats import WorkerStats

__all__ = ["takes", "allreduce"]

_FLOATS = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16})
_INTS = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
#: dtypes whose result a CPU tensor's numpy view takes directly (float16/bfloat16 go through torch's
#: own conversion from float64, as the general path's)
_NUMPY = frozenset({torch.float32, torch.float64, torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8})
#: dtypes the native kernels read and write in the tensor's own memory (:mod:`._small_native`)
_NATIVE = frozenset({torch.float32, torch.float64})
#: dtypes whose device tensors run on a host copy (float16/bfloat16 convert their results on the device)
_STAGED = _NATIVE | _INTS
_OPS = (CombineOp.MAX, CombineOp.ADD)
_MAX_ONLY = (CombineOp.MAX,)
_ADD_ONLY = (CombineOp.ADD,)


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
        limbs = limbs_of(dtype)
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


def allreduce(tensor: torch.Tensor, port: SwitchPort, scheme: str, cfg: CodecConfig, stats: WorkerStats,
              inplace: bool, history: History | None, key: Hashable) -> torch.Tensor:
    """The exact SUM of ``tensor`` over the workers behind ``port`` (see the module docstring);
    ``inplace``: written into ``tensor``, which is returned."""
    dtype, n, world = tensor.dtype, tensor.numel(), port.world_size
    if not tensor.is_cpu and dtype in _STAGED:  # a device tensor's call on a host copy: the same bits
        return _hostops.on_host_copy(tensor, inplace,
                                     lambda host: allreduce(host, port, scheme, cfg, stats, True, history, key))
    slot = (key, n, dtype, world, cfg.block_size)
    prior = history.get(slot) if history is not None else None
    steady: _Steady | None = None  # a float call's kept signature
    previous: int | None = None  # the exponent the slot's last call agreed
    guess_from: int | None = None  # ... where this call is steady: quantise under the guess
    if dtype in _FLOATS:
        steady = _steady(n, dtype, scheme, world, cfg.precision, cfg.guess_window)
        previous = previous_exponent(prior)
        if previous is not None and prior is not None and min(prior.changed, prior.changed_before) * n * steady.limbs <= 1:
            guess_from = previous  # ``_schemes._guess_pays`` for one block
            if inplace and steady.native_ok and tensor.is_cpu and tensor.is_contiguous():
                done = steady.native(port, stats, tensor, previous)
                if done is not None:
                    _record(history, slot, prior, *done)
                    return tensor
    view: np.ndarray | None = None  # a contiguous CPU tensor's own memory, when numpy can hold its dtype
    if dtype in _NUMPY and tensor.is_cpu and tensor.is_contiguous():
        view = (tensor.detach() if tensor.requires_grad else tensor).numpy()
        if view.ndim != 1:
            view = view.reshape(-1)
        host: torch.Tensor | np.ndarray = view
    else:
        flat = tensor.detach().reshape(-1)
        host = flat if flat.device.type == "cpu" else flat.cpu()
    stats.schemes["dense"] += 1
    if steady is not None:
        limbs = steady.limbs
        values = host.tolist() if n <= _SCALAR else (
            host.astype(np.float64) if view is not None else host.to(torch.float64).numpy())
        if guess_from is not None:
            out, exponents, changed, union = steady.call(port, stats, values, guess_from)
        else:
            call = _Call(port, stats, n, dtype, scheme, world)
            call.limbs = limbs
            out, exponents, changed = _float_call(call, values, cfg, previous)
            union = call.union
    else:
        if inplace and view is not None:  # in the port's own arrays, where it keeps them
            own_union = _int_steady(n, dtype, scheme, world).run(port, stats, view)
            if own_union is not None:
                if history is not None:
                    _record(history, slot, prior, None, 0.0, own_union)
                return tensor
        call = _Call(port, stats, n, dtype, scheme, world)
        call.limbs = limbs_of(dtype)
        values = host.tolist() if n <= _SCALAR else (
            host.astype(np.int64) if view is not None else host.to(torch.int64).numpy())
        out = int_call(call, values, dtype)
        exponents, changed, union = None, 0.0, call.union
    if history is not None:
        _record(history, slot, prior, exponents, changed, union)
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


def _record(history: History, slot: Hashable, prior: Agreed | None, exponents: torch.Tensor | None, changed: float,
            union: int) -> None:
    """The call's record in ``history`` (``prior``: the slot's before the call), unless the stored
    one says the same (:func:`_same`)."""
    before = prior.changed if prior is not None else 0.0
    if not _same(prior, exponents, union, changed, before):
        history.put(slot, Agreed(exponents, union, changed, 0, before))


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
            verify = _descriptor.AGREEMENT
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
            self.union = nonzero_rows(sums, self.limbs)
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
                previous: int | None) -> tuple[list[float] | np.ndarray, torch.Tensor, float]:
    """Mirror of the general dense protocol's first call for one block (``_schemes._first_call``:
    the exponent round, then the values under the agreed exponent; also a call with history whose
    exponents keep moving); returns the values, the agreed exponent (a
    :func:`~homagg.codec._small_grid.exponent_tensor`) and the ``changed`` figure to record
    (:class:`_Steady` runs the steady calls)."""
    local = local_exponent(values)
    limbs = call.limbs
    p, limit, slack = grid(call.world, limbs, call.dtype == torch.float64, cfg.guess_window)
    agreed = call.round(local, None, None)[0][0]
    sums = call.round(None, None, quantize(values, agreed, p, limit, limbs))[1]
    return dequantize(sums, agreed, p, limbs, isinstance(values, list)), exponent_tensor(agreed), \
        changed_figure(previous, agreed, slack)


class _Steady:
    """A steady float call of one signature (:func:`_steady`): the general dense protocol's steady
    call for one block (``_schemes._steady``; the Worker's guess, settle and redo) as one round
    through the port, with the signature's constants (the grid, the descriptor) kept.
    Invariant: the words sent, the rounds, the statistics and the results are :class:`_Call`'s
    (the first round's descriptor and spare words, the ADD redo round), bit for bit."""

    __slots__ = ("n", "limbs", "p", "limit", "slack", "raise_by", "head", "value_bytes", "lengths", "is64", "native_ok")

    def __init__(self, n: int, dtype: torch.dtype, scheme: str, world: int, precision: str, window: bool) -> None:
        limbs = float_words(precision, world)
        self.n, self.limbs = n, limbs
        self.p, self.limit, self.slack = grid(world, limbs, dtype == torch.float64, window)
        self.raise_by = self.slack // 2
        self.head = _head(n, dtype, scheme, world, _descriptor.SPARE + n * limbs, limbs)  # copied per call
        self.value_bytes = 4 * n * limbs
        self.lengths = (_descriptor.LENGTH, n * limbs)
        self.is64 = dtype == torch.float64
        #: whether :meth:`native` may run (float32 and float64, where the library has the kernels)
        self.native_ok = _small_native.AVAILABLE and dtype in _NATIVE

    def native(self, port: SwitchPort, stats: WorkerStats, tensor: torch.Tensor,
               previous: int) -> tuple[torch.Tensor, float, int] | None:
        """:meth:`call` of a contiguous CPU float32/float64 ``tensor`` (:attr:`native_ok`), in
        place, with the C kernels on the port's own arrays (no Python numbers, lists or arrays per
        call; the signature's :class:`~homagg.codec._small_native.SmallKernel` is kept with them,
        one per port: a port's rounds run one at a time); returns the agreed exponent's tensor,
        ``changed`` and the union count, or None where it does not run (the port keeps no own
        arrays; a NaN or an infinity, whose error :meth:`call` raises): then nothing was sent or
        counted."""
        own = port.own_round(_OPS, self.lengths)
        if own is None:
            return None
        kernel = own.kept.get(self)
        if kernel is None:
            kernel = own.kept[self] = _small_native.SmallKernel(self.n, self.limbs, self.is64, self.p, self.limit,
                                                                self.slack, self.raise_by, self.head)
        head, words = own.ins
        address = tensor.data_ptr()
        if kernel.encode(address, previous, head, words) != _small_native.ENCODED:
            return None
        stats.schemes["dense"] += 1
        stats.rounds += 1
        sent = stats.bytes_per_stream
        sent[_descriptor.NAME] += 4 * _descriptor.LENGTH
        sent["values"] += self.value_bytes
        combined = own.run(_descriptor.AGREEMENT)  # the descriptor's check runs exactly once (see call)
        if kernel.decode(combined[0], combined[1], address) == _small_native.DECODED:
            agreed, union = kernel.agreed, kernel.union
        else:  # the guess missed the window (the tensor still holds the inputs): redo under ``agreed``
            agreed = kernel.agreed
            values = tensor.detach().reshape(-1).tolist()
            out, union = decode(self._redo(port, stats, values, agreed), agreed, self.p, self.limbs, True)
            tensor.detach().numpy().reshape(-1)[:] = out
        return exponent_tensor(agreed), changed_figure(previous, agreed, self.slack), union

    def _redo(self, port: SwitchPort, stats: WorkerStats, values: list[float] | np.ndarray, agreed: int) -> np.ndarray:
        """The ADD round again under the ``agreed`` exponent (the guess missed its window): the sums."""
        stats.rounds += 1
        stats.redos += 1
        stats.redone += self.n
        stats.bytes_per_stream["redo"] += self.value_bytes
        return port.combine_arrays(_ADD_ONLY, [quantize(values, agreed, self.p, self.limit, self.limbs)])[0]

    def call(self, port: SwitchPort, stats: WorkerStats, values: list[float] | np.ndarray,
             previous: int) -> tuple[list[float] | np.ndarray, torch.Tensor, float, int]:
        """One steady call (``previous``: the exponent the last call agreed); returns the values,
        the agreed exponent (an :func:`~homagg.codec._small_grid.exponent_tensor`), ``changed`` and
        the union count."""
        local = local_exponent(values)
        p, limit, limbs, slack = self.p, self.limit, self.limbs, self.slack
        guess = EMPTY if local == EMPTY else max(previous if previous == EMPTY else previous + self.raise_by, local)
        own = port.own_round(_OPS, self.lengths)  # the port's own arrays, where it keeps them
        if own is None:
            head, words = self.head.copy(), quantize(values, guess, p, limit, limbs)
        else:
            head, words = own.ins
            np.copyto(head, self.head)
            quantize(values, guess, p, limit, limbs, words)
        stats.rounds += 1
        sent = stats.bytes_per_stream
        sent[_descriptor.NAME] += 4 * _descriptor.LENGTH
        sent["values"] += self.value_bytes
        head[-2] = local
        head[-1] = EMPTY if guess == EMPTY else -guess
        # either runs the descriptor's check on its combined words exactly once; the own round's
        # results are read before the port's next round (the redo's shape has a plan of its own)
        combined = port.combine_arrays(_OPS, [head, words], _descriptor.AGREEMENT) if own is None else own.run(
            _descriptor.AGREEMENT)
        agreed, negated = combined[0][-_descriptor.SPARE:].tolist()
        sums = combined[1]
        used = -negated
        if agreed == EMPTY:
            used = agreed
        elif used < agreed or used > agreed + slack:  # a guess outside the window: redo under ``agreed``
            sums = self._redo(port, stats, values, agreed)
            used = agreed
        out, union = decode(sums, used, p, limbs, isinstance(values, list))
        return out, exponent_tensor(agreed), changed_figure(previous, agreed, slack), union


@lru_cache(maxsize=1024)
def _steady(n: int, dtype: torch.dtype, scheme: str, world: int, precision: str, window: bool) -> _Steady:
    """The kept :class:`_Steady` of a float call signature (read-only once made; every float call
    asks for it: its ``limbs`` are the call's words per value)."""
    return _Steady(n, dtype, scheme, world, precision, window)


# -------------------------------------------------------------------------------------- integers
@lru_cache(maxsize=1024)
def _int_steady(n: int, dtype: torch.dtype, scheme: str, world: int) -> IntSteady:
    """The kept :class:`~homagg.codec._small_ints.IntSteady` of an integer call signature."""
    return IntSteady(n, dtype, _head(n, dtype, scheme, world, _descriptor.SPARE + n * limbs_of(dtype), 1))
