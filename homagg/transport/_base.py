"""The switch contract: what a worker needs from an aggregating network element.

A *round* is a list of :class:`Stream` objects, each an int32 word vector tagged with the way a
switch combines it (:class:`~homagg.wire.CombineOp`, the wire encoding).  Every worker of a job
hands its round to its :class:`SwitchPort`; ``combine`` returns, to every worker, the
element-wise combination over all workers of each stream:

* ``ADD`` -- two's complement addition modulo 2**32 (wraps, like P4 ``bit<32>`` arithmetic),
* ``OR``  -- bitwise or,
* ``MAX`` -- signed int32 maximum.

Invariants every port keeps: streams of one round have equal names, ops and lengths on every
worker (else :class:`~homagg.ProtocolError`); the result is identical on every worker and
independent of arrival order; every wait is bounded and raises
:class:`~homagg.SwitchTimeoutError` naming what was missing.  The codec never knows how words
travel; transports never know what they mean.

:func:`combine_words` is the reference semantics in torch (the in-process switch and the tests'
oracle); the emulator's numpy stage (``switch_emulator/combine.py``) and the P4 program
(``p4/combine.p4``) are the other targets, checked against it by tests.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._errors import ProtocolError
from ..wire import CombineOp

__all__ = ["AgreementCheck", "CheckOnce", "CombineOp", "OwnRound", "Stream", "SwitchPort", "VerifyOnce", "WordSource", "array_lengths",
           "array_streams", "combine_words", "wrap_int32"]

_INT32 = np.dtype(np.int32)  # native-endian
_OPS = frozenset(CombineOp)


class WordSource(abc.ABC):
    """Words a stream computes on demand instead of holding them: a port that can fills each
    datagram's payload straight from the source (:meth:`native_fill`), one pass and no tensor of
    the whole stream; every other port takes :meth:`materialize`'s words (the reference).

    Invariant: the words :meth:`native_fill`'s function writes for ``[off, off + n)`` are, in
    big-endian order, ``materialize()[off:off + n]``, bit for bit, whatever the chunking.
    """

    #: words in the stream
    length: int
    #: where the stream's words (and so its combined result) live
    device: torch.device

    @abc.abstractmethod
    def materialize(self) -> torch.Tensor:
        """The words, a 1-D int32 tensor of :attr:`length` on :attr:`device`."""

    def native_fill(self) -> tuple[int, int] | None:
        """``(function, context)`` addresses of a C function
        ``void fill(const void *context, uint8_t *dst, int64_t off, int64_t n)`` that writes words
        ``[off, off + n)`` big-endian into ``dst``, valid while this object lives; None where there
        is none (then ports use :meth:`materialize`)."""
        return None


@dataclass(frozen=True)
class Stream:
    """One int32 word vector of a round, with its combine op and a name for statistics.

    The words are ``words`` (a 1-D int32 tensor) or, when ``source`` is given instead, computed by
    that :class:`WordSource` on demand: use :attr:`length`, :attr:`device` and :meth:`materialize`,
    which serve both.

    ``verify``, if set, is called with the stream's combined words (a tensor); it raises (a typed
    :class:`~homagg.HomAggError`) when they show the workers out of step.  A port calls it as soon
    as the stream's words are back (before waiting for the rest of the round, where it can) and
    then raises that error instead of waiting.  A :class:`CheckOnce` verifier also takes the words
    as a host numpy array (a port holding them so passes that, no tensor) and records that it ran:
    the codec's call descriptor uses one and checks the round's results only where no port did
    (one check per call on every port, ``tests/test_descriptor_checked_once.py``).
    """

    name: str
    op: CombineOp
    words: torch.Tensor | None
    verify: Callable[[torch.Tensor], None] | None = field(default=None, compare=False, repr=False)
    source: WordSource | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (self.words is None) == (self.source is None):
            raise ProtocolError(f"stream {self.name!r} needs exactly one of words and source")
        w = self.words
        if w is not None and (w.dtype != torch.int32 or w.dim() != 1):
            raise ProtocolError(f"stream {self.name!r} must be a 1-D int32 tensor, got {w.dtype} {tuple(w.shape)}")

    @property
    def length(self) -> int:
        """Words in the stream."""
        return self.words.numel() if self.words is not None else self.source.length  # type: ignore[union-attr]

    @property
    def device(self) -> torch.device:
        """The device of the stream's words (where its combined words go back to)."""
        return self.words.device if self.words is not None else self.source.device  # type: ignore[union-attr]

    def materialize(self) -> torch.Tensor:
        """The words as a 1-D int32 tensor (computed by the source, where there is one)."""
        return self.words if self.words is not None else self.source.materialize()  # type: ignore[union-attr]


def combine_words(op: CombineOp, vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Combine equal-length int32 vectors with ``op`` exactly as a switch does (ADD wraps mod 2**32)."""
    if not vectors:
        raise ProtocolError("nothing to combine")
    if op == CombineOp.ADD:
        acc = torch.zeros_like(vectors[0], dtype=torch.int64)
        for v in vectors:
            acc += v
        return wrap_int32(acc)
    acc = vectors[0].clone()
    for v in vectors[1:]:
        if op == CombineOp.OR:
            acc |= v
        elif op == CombineOp.MAX:
            torch.maximum(acc, v, out=acc)
        else:  # pragma: no cover - enum is closed
            raise ProtocolError(f"unknown combine op {op!r}")
    return acc


def array_lengths(ops: Sequence[CombineOp], words: Sequence[np.ndarray]) -> tuple[int, ...]:
    """The lengths of :meth:`SwitchPort.combine_arrays`' streams, checked: one op per array (a
    :class:`~homagg.wire.CombineOp` or its value), each a 1-D native-endian int32 numpy array (else
    :class:`~homagg.ProtocolError`)."""
    if len(ops) != len(words):
        raise ProtocolError(f"combine_arrays: {len(ops)} ops for {len(words)} word arrays")
    for j, op in enumerate(ops):
        if op not in _OPS:
            raise ProtocolError(f"combine_arrays: ops[{j}] = {op!r} is no combine op ({', '.join(o.name for o in CombineOp)})")
    lengths = []
    for j, w in enumerate(words):
        if type(w) is not np.ndarray or w.dtype != _INT32 or w.ndim != 1:
            raise ProtocolError(f"combine_arrays: words[{j}] must be a 1-D native-endian int32 numpy array, got "
                                f"{getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
        lengths.append(w.size)
    return tuple(lengths)


def array_streams(ops: Sequence[CombineOp], words: Sequence[np.ndarray],
                  verify: Callable[[np.ndarray], None] | None = None) -> list[Stream]:
    """The :class:`Stream` round equivalent to ``combine_arrays(ops, words, verify)`` (checked as
    :func:`array_lengths` does): stream ``j`` is named ``words[j]`` and holds ``words[j]`` (no copy);
    stream 0's verifier hands ``verify`` its combined words as a numpy array."""
    array_lengths(ops, words)
    check = None if verify is None else (lambda t: verify(t.detach().cpu().numpy()))
    return [Stream(f"words[{j}]", CombineOp(op), torch.from_numpy(w), verify=check if j == 0 else None)
            for j, (op, w) in enumerate(zip(ops, words, strict=True))]


class AgreementCheck:
    """A ``verify`` of words that agree exactly when ``words[i] == ~words[agree_words + i]`` for
    every ``i < agree_words`` (each field MAX-combined once as itself and once complemented: the
    codec's call descriptor); ``check(words)`` raises, naming what disagrees, where they do not.

    A port may judge the agreement itself and call ``check`` only where it fails: the native
    datapath does it in its C loop, without returning to Python (``_fastround.c``).  That counts as
    the round's call of ``verify`` (:class:`VerifyOnce` remembers it)."""

    __slots__ = ("check", "agree_words")

    def __init__(self, check: Callable[[np.ndarray], None], agree_words: int) -> None:
        self.check, self.agree_words = check, agree_words

    def __call__(self, words: np.ndarray) -> None:
        self.check(words)


class VerifyOnce:
    """A ``combine_arrays`` verifier that runs ``verify`` **at most once**, however many times it is
    called: a port whose round may or may not call it (a ``combine`` that verifies early only on
    some paths) or may call it twice (a :class:`~homagg.torch._fallback.PathPort` round whose
    switch port verified early and then failed: the host path redoes the round and verifies it
    again) passes this one down and then calls :meth:`ensure` with the round's first array, so that
    the caller's ``verify`` runs exactly once (the :meth:`SwitchPort.combine_arrays` contract).

    Invariants: :attr:`called` is True from the first call on (also where ``verify`` raised: the
    round is abandoned, the error propagates, and a later call does not judge again) and where a
    port judged the agreement itself (:class:`AgreementCheck`: the port sets :attr:`called`).
    ``verify`` takes the words as the port hands them: a 1-D int32 numpy array here
    (:class:`CheckOnce`: a tensor as well)."""

    __slots__ = ("verify", "called", "agree_words")

    def __init__(self, verify: Callable[[np.ndarray], None]) -> None:
        self.verify = verify
        self.called = False
        #: the verifier's, where it is an :class:`AgreementCheck` (a port may judge it: see there)
        self.agree_words: int = getattr(verify, "agree_words", 0)

    def __call__(self, words: np.ndarray) -> None:
        if not self.called:
            self.called = True
            self.verify(words)

    def ensure(self, results: list[np.ndarray]) -> list[np.ndarray]:
        """Call ``verify`` on ``results[0]`` unless it already ran (or the round has no array);
        returns ``results``."""
        if results:
            self(results[0])
        return results


class OwnRound(abc.ABC):
    """A round shape whose input and output arrays a port keeps (:meth:`SwitchPort.own_round`):
    the caller writes its words into :attr:`ins` and calls :meth:`run`, instead of handing
    :meth:`SwitchPort.combine_arrays` arrays to copy in and getting new ones back (a steady small
    call's copies, checks and allocations).

    Invariant: :meth:`run` is :meth:`SwitchPort.combine_arrays` of ``ops`` and copies of
    :attr:`ins` (the same round, wire bytes, results, errors and ``verify`` contract), except that
    its results are the port's own arrays: valid until the port's next round, so the caller reads
    or copies them at once and never writes them."""

    ops: tuple[CombineOp, ...]
    #: the round's input arrays (1-D int32, one per stream, the shape's lengths): the caller's to fill
    ins: list[np.ndarray]
    #: what callers keep with these arrays, by a key of their own (the codec's encoder bound to
    #: :attr:`ins`: :class:`homagg.codec._small_native.SmallKernel`); one dict per port and shape,
    #: so a port's rounds, one at a time, never share an entry with another port's
    kept: dict[Any, Any]
    #: whether :meth:`run`'s results stay valid until the port's *next* round of this shape has
    #: ended (a large shape's two arrays sets, taken in turn), not only until its next round
    stable: bool = False

    @abc.abstractmethod
    def run(self, verify: Callable[[np.ndarray], None] | None = None,
            on_results: tuple[int, int] | None = None) -> list[np.ndarray]:
        """One round of :attr:`ins` (see the class docstring).  ``on_results``: the addresses of
        a C results hook and its context (``hg_results_fn``, ``homagg/transport/_fastpath.h``),
        called by the port's C round loop after each batch of results, so that the caller can
        decode completed chunks while later ones are still in flight.  A round the C loop does
        not run (the Python datapath, the host path after a fallback) never calls it: the caller
        still finishes from the returned arrays, which are the round's results either way."""


class CheckOnce(VerifyOnce):
    """:class:`VerifyOnce` as a :attr:`Stream.verify` (the codec's call descriptor): the same
    at-most-once behaviour, but its ``verify`` takes the combined words as a tensor *or* as a 1-D
    int32 host numpy array (as :func:`homagg.codec._descriptor.check` does).  That is the one
    difference, and why the class exists: a port that holds the words in numpy (the UDP port's
    early verify) hands a ``CheckOnce`` them as they are, where it wraps any other
    :attr:`Stream.verify` to hand it a tensor.  The stream's owner checks the round's results
    itself where no port did (``called`` is False)."""

    __slots__ = ()

    if TYPE_CHECKING:  # the wider argument type only; the behaviour is VerifyOnce's
        def __call__(self, words: np.ndarray | torch.Tensor) -> None: ...


def wrap_int32(x: torch.Tensor) -> torch.Tensor:
    """Reduce an int64 tensor modulo 2**32 into two's complement int32 (no overflow, any device)."""
    return (((x + 2**31) & 0xFFFFFFFF) - 2**31).to(torch.int32)


class SwitchPort(abc.ABC):
    """One worker's access to the switch; the base of every transport.

    Siblings to copy for a new transport: :class:`~homagg.transport.InProcessSwitch`'s port
    (threads of one process), :class:`~homagg.transport.UdpSwitchPort` (emulator or BMv2 over
    UDP), :class:`~homagg.transport.GlooSwitchPort` (a private gloo group, no network element).
    A port maps its own failures to the :class:`~homagg.HomAggError` tree with
    :func:`homagg.transport.transport_error` (the one mapping).
    """

    rank: int
    world_size: int

    @abc.abstractmethod
    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        """Send this worker's round; return the combined words of every stream (same order, int32,
        on the device of that stream's words)."""

    def combine_arrays(self, ops: Sequence[CombineOp], words: Sequence[np.ndarray],
                       verify: Callable[[np.ndarray], None] | None = None) -> list[np.ndarray]:
        """One round of host int32 streams: ``words[j]`` (1-D, native-endian int32) combined with
        ``ops[j]`` over the job's workers; returns, per stream, a new int32 array the caller owns
        (the port never reuses it).  Same semantics, wire bytes, results and errors as
        :meth:`combine` of :func:`array_streams` (names do not travel); bad arrays raise
        :class:`~homagg.ProtocolError`.

        ``verify`` (when given, and the round has an array): every port calls it **exactly once**
        per round that returns, with stream 0's combined words, before
        returning -- as soon as they are back where the port can (before waiting for the rest),
        else once the round is complete; the caller need not check them again.  If it raises, the
        round is abandoned and the error propagates (on the in-process switch, rank 0's verifier
        also judges a round whose ranks' shapes differ).  Every port keeps this: the
        UDP port, the in-process switch (and the in-process trees built on it), the gloo host path,
        the process group's :class:`~homagg.torch._fallback.PathPort` on either path and through a
        fallback (``tests/test_transport_verify_once.py``).

        This default goes through :meth:`combine` (with :class:`VerifyOnce`: a ``combine`` that
        verified early is not verified again); :class:`~homagg.transport.UdpSwitchPort` runs it
        without a tensor or a per-round object that it can keep (the small-call path)."""
        if verify is None:
            return [t.detach().cpu().numpy() for t in self.combine(array_streams(ops, words))]
        once = VerifyOnce(verify)
        return once.ensure([t.detach().cpu().numpy() for t in self.combine(array_streams(ops, words, once))])

    def own_round(self, ops: tuple[CombineOp, ...], lengths: tuple[int, ...]) -> OwnRound | None:
        """The port's own arrays for rounds of this shape, where it keeps them (a small shape on
        the native UDP datapath), else None (use :meth:`combine_arrays`); see :class:`OwnRound`."""
        return None

    @contextlib.contextmanager
    def patient(self, timeout_s: float) -> Iterator[None]:
        """Within it, a round waits up to ``timeout_s`` for the other workers (a barrier waits for a
        late rank), and its timers learn nothing from that wait (it measures the peers, not the
        path).  Every other wait, and a dead switch or peer, is found as always.  This default (a
        port without its own progress timeout) changes nothing."""
        yield

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources held by this port (idempotent)."""

    def __enter__(self) -> SwitchPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
