"""Worker-side protocols of the schemes, written as generators of rounds.

A protocol yields a round (a list of :class:`~homagg.transport.Stream`), receives the combined
words, and finally returns the result tensor.  It never knows how words travel.

First call of a tensor (no :class:`~homagg.History` entry; floats; integers have no exponent
stream; ``n`` elements, ``U`` distinct nonzeros over all workers, ``L`` words per element (floats:
1, or 2 with wide words, ``CodecConfig.precision``; integers: their limbs), ``B`` elements per
exponent block):

=========  ===============================================  ================================
scheme     rounds                                           words sent per worker
=========  ===============================================  ================================
dense      1 exponents(MAX) ; 2 values(ADD)                 n/B + nL
compact    1 exponents(MAX) + bitmap(OR) ; 2 values at U    n/B + n/32 + UL
 2-level   1 exponents + word bitmap(OR) ; 2 held words(OR) n/B + n/1024 + h n/32 + UL
           ; 3 values at U  (h: fraction of bitmap words the union holds; chosen by the cost
           model at low density, :func:`bitmap_levels`)
sketch     1 exponents(MAX) + union sample(OR) + nnz(MAX/ADD); n/B + S/32 + n/32 + cL  (c ~ 1.4U)
           2 bitmap(OR) + count sketch(ADD) ;
           3 repair(ADD) only if the 2-core is non-empty    + (2-core size) L
auto       round 1 of sketch, then the continuation with
           the lowest modelled cost (see :func:`choose`)
           (S = min(n, union_sample): the OR of a fixed sample of blocks estimates U)
=========  ===============================================  ================================

Steady state (the :class:`~homagg.History` holds the previous call's agreed exponents ``G`` and
union size): each worker quantises under its guess ``max(G + raise, own exponent)`` (per block,
where it holds a value; ``raise`` is the headroom of ``CodecConfig.guess_window``) and sends, in
the *same* round, its fresh exponents (MAX) and its negated guesses (MAX, i.e. the smallest
guess); a block stands when every contributor guessed the same exponent within the window above
the agreed one (drift of a few binary orders costs nothing), and is redone in one more round with
the agreed exponents otherwise (only those blocks' elements, ``redo`` stream).  A block held by
one worker alone is always right (moving sparse supports):

=========  ==================================================================  ==========
scheme     rounds                                                              typical
=========  ==================================================================  ==========
dense      1 exponents + values(under G) ; 2 redo if a block's exponent moved  1
compact    as on the first call (its values wait for the bitmap anyway)        2
sketch     1 exponents + bitmap + sketch(under G, cells from the last union) ;  1
           2 repair: 2-core and moved blocks, only if either is non-empty
auto       the continuation chosen from the last union size, steady form       1 or 2
=========  ==================================================================  ==========

A first call's integer sums are those of quantising under the *agreed* exponents, so its results
are bit-identical across schemes; a steady call's are those of quantising under the exponents
that stood (the common guess, or the agreed exponent where redone): identical on every worker,
within the same bound, and bit-identical to a first call with ``guess_window=False``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
import torch

from . import _bitmap, _descriptor, _exponents, _fixedpoint, _hostops, _sketch
from ._config import CodecConfig, check_scheme
from ._cost import _bitmap_cost_of, _choice, bitmap_levels, choose  # noqa: F401 - re-exported (the cost model's home)
from .._errors import ProtocolError
from ._history import Agreed, History
from ._stats import WorkerStats
from ..transport import Stream, SwitchPort
from ..transport._base import CheckOnce
from ._worker import Round, Worker, exchange
from ..wire import CombineOp

__all__ = ["protocol", "run", "begin", "drive", "prepare", "choose", "Round"]

Protocol = Generator[Round, list[torch.Tensor], torch.Tensor]
_HOST = torch.device("cpu")  #: where the call descriptor's words live, whatever the input's device


def protocol(
    tensor: torch.Tensor,
    world_size: int,
    scheme: str,
    cfg: CodecConfig,
    stats: WorkerStats,
    inplace: bool = False,
    history: History | None = None,
    key: Hashable = None,
) -> Protocol:
    """The worker-side protocol; returns the flat result.  decode(sum of encodings) == exact sum.

    With ``inplace`` the result is written into ``tensor`` when it is contiguous (the returned flat
    tensor is then a view of it).  With ``history``, the call reuses what the previous call under
    the same ``key`` (and numel, dtype, world size, block size) agreed, and records its own.
    """
    check_scheme(scheme)
    return run(Worker(tensor, world_size, cfg, inplace), scheme, stats, history, key)


def run(w: Worker, scheme: str, stats: WorkerStats, history: History | None = None, key: Hashable = None) -> Protocol:
    """The protocol of an already prepared :class:`Worker` (its input is checked: nothing is
    sent for an input that :class:`Worker` refused).  The call's set-up (history, local
    exponents: :class:`~homagg.NonFiniteError`) runs here, before the generator is returned; the
    generator is the body's with the descriptor at its head (:func:`_described`), no layer that
    only forwards rounds."""
    body, slot, prior = begin(w, scheme, stats, history, key)
    return _described(body, w, scheme, stats, history, slot, prior)


def begin(w: Worker, scheme: str, stats: WorkerStats, history: History | None = None,
          key: Hashable = None) -> tuple[Protocol, tuple[Hashable, ...], Agreed | None]:
    """:func:`run`'s set-up: the body (its rounds, no descriptor), the history slot and its entry."""
    slot = _slot(w, key)
    prior = history.get(slot) if history is not None else None
    w.prior = prior.exponents if prior is not None else None
    continuation = _prepare(w, scheme, prior)
    body = _first_call(w, scheme, stats) if prior is None else _steady(w, continuation, stats, prior)
    return body, slot, prior


def drive(w: Worker, port: SwitchPort, scheme: str, stats: WorkerStats, history: History | None = None,
          key: Hashable = None) -> torch.Tensor:
    """:func:`run`'s protocol combined on ``port`` up to its flat result: :func:`_described`'s loop (the
    same rounds, checks and record) with ``port.combine`` as its combining step, so that each round
    goes from the body to the port and back with no generator between them (``_described``'s own
    is resumed once per call, to its return)."""
    body, slot, prior = begin(w, scheme, stats, history, key)
    try:
        next(_described(body, w, scheme, stats, history, slot, prior, port.combine))
    except StopIteration as stop:
        return stop.value
    raise AssertionError("a protocol given its combining step yielded a round")  # pragma: no cover


def _record(w: Worker, history: History, slot: tuple[Hashable, ...], prior: Agreed | None) -> None:
    """What this call agreed, for the next call under ``slot``."""
    agreed = w.agreed if w.agreed is not None else w.exponents
    changed = w.changed if w.changed is not None else _changed(prior, agreed, *w.window())
    history.put(slot, Agreed(agreed, w.union, changed, w.listed_nnz, prior.changed if prior is not None else 0.0))


def _changed(prior: Agreed | None, agreed: torch.Tensor | None, raise_by: int, slack: int) -> float:
    """Fraction of the blocks holding a value in both calls whose agreed exponent left the guess
    window around ``prior``'s (:func:`homagg.codec._exponents.outside_window`: the blocks a guess
    redoes; a block filled afresh is guessed right by a worker holding it alone, as embedding rows
    are)."""
    if prior is None or prior.exponents is None or agreed is None or prior.exponents.shape != agreed.shape:
        return 0.0
    return _exponents.changed_fraction(prior.exponents, agreed, raise_by, slack)


def _guess_pays(w: Worker, prior: Agreed) -> bool:
    """Quantise under the previous exponents (and redo what left the window) rather than agree
    exponents in a round of their own: unless the last *two* calls each moved blocks that, redone,
    would carry more words than an exponent round (one per block).  One call that moved (a new
    input regime, a learning-rate step) is not a trend: the next call guesses again.  Agreed
    inputs: every worker decides alike."""
    return guess_pays(prior, w.numel, w.limbs, w.blocks)


def guess_pays(prior: Agreed, numel: int, limbs: int, blocks: int) -> bool:
    """:func:`_guess_pays` of a call of ``numel`` elements, ``limbs`` words each, in ``blocks``
    blocks (the mid-size path asks it without a Worker)."""
    return min(prior.changed, prior.changed_before) * numel * limbs <= blocks


def _described(body: Protocol, w: Worker, scheme: str, stats: WorkerStats, history: History | None,
               slot: tuple[Hashable, ...], prior: Agreed | None,
               combine: Callable[[Round], list[torch.Tensor]] | None = None) -> Protocol:
    """``body`` with the call descriptor (:mod:`homagg.codec._descriptor`) at the head of its first round:
    ranks that disagree about the call raise :class:`~homagg.RankMismatchError` after that round;
    once ``body`` returned, the call is recorded in ``history`` under ``slot`` (:func:`_record`).

    Each round is yielded to the generator's driver, or, given ``combine`` (:func:`drive`: a port's),
    combined by it in place of the yield: then nothing is yielded, and the generator's first resume
    runs the whole call to its return.  The one loop of both drives: they cannot differ.

    The descriptor is checked exactly once per call: by the port, as soon as its words are back
    (the stream's :class:`~homagg.transport._base.CheckOnce` records it), else here on the round's
    results (a port that verifies nothing early: the in-process switch)."""
    try:
        first = next(body)
    except StopIteration as stop:  # a protocol that needed no round
        return _done(stop.value, w, history, slot, prior)
    once = CheckOnce(_descriptor.AGREEMENT)
    head = _head_round(w, scheme, stats, first, once)
    value = _first_results(combine(head) if combine is not None else (yield head), once)
    while True:
        try:
            streams = body.send(value)
        except StopIteration as stop:
            return _done(stop.value, w, history, slot, prior)
        value = combine(streams) if combine is not None else (yield streams)


def _head_round(w: Worker, scheme: str, stats: WorkerStats, first: Round, once: CheckOnce) -> Round:
    """The first round with the call descriptor at its head, verified by ``once``."""
    # the descriptor's words stay on the host whatever the input's device: checking them reads no device
    head = _descriptor.describe(w.numel, w.dtype, scheme, w.world_size, first, _HOST,
                                w.limbs if w.is_float else 1, once)
    stats.bytes_per_stream[head.name] += 4 * head.length
    return [head, *first]


def _first_results(combined: list[torch.Tensor], once: CheckOnce) -> list[torch.Tensor]:
    """The body's results of the first round (the descriptor's checked, unless a port did)."""
    if not combined:
        raise ProtocolError("switch returned no streams for a call's first round")
    if not once.called:
        once(combined[0])
    return combined[1:]


def _done(result: torch.Tensor, w: Worker, history: History | None, slot: tuple[Hashable, ...],
          prior: Agreed | None) -> torch.Tensor:
    """``result``, once the call is recorded in ``history`` (:func:`_record`)."""
    if history is not None:
        _record(w, history, slot, prior)
    return result


def _slot(w: Worker, key: Hashable) -> tuple[Hashable, ...]:
    return (key, w.numel, w.dtype, w.world_size, w.cfg.block_size)


def prepare(w: Worker, scheme: str, history: History | None = None, key: Hashable = None) -> None:
    """Check ``w``'s input (NaN/Inf raise :class:`~homagg.NonFiniteError`) before anything is sent,
    along the representation the call will use: when the continuation is known in advance
    (compact, sketch, or auto's steady-state choice) the index list is built first and the local
    exponents come from it in O(nnz); otherwise one dense pass computes them.  Idempotent;
    :func:`run` calls it, the pipeline calls it for every segment before the first round."""
    _prepare(w, scheme, history.get(_slot(w, key)) if history is not None else None)


def _prepare(w: Worker, scheme: str, prior: Agreed | None) -> str:
    """:func:`prepare` given the history's entry; returns the scheme a steady call continues with
    (``auto``'s :func:`choose` from the remembered union, made once per call)."""
    if prior is not None and prior.local_nnz:  # room for the scan's listing: the last call's count and some
        w.nnz_hint = prior.local_nnz + prior.local_nnz // 8 + 1024
    if scheme == "auto" and prior is not None:
        scheme = choose(w.numel, float(prior.union), w.limbs, w.cfg)
    if scheme == "sketch" or (scheme == "compact" and not w.device_path):
        w.idx  # noqa: B018 - built first: the exponents then cost O(nnz), not a dense pass (a device's
        # compact lists no local nonzeros: its words are gathered at the union's positions)
    w.local_exponents  # noqa: B018 - computed (and the input checked) now
    return scheme


def _first_call(w: Worker, scheme: str, stats: WorkerStats) -> Protocol:
    if scheme == "dense":
        w.set_exponents((yield from exchange(w.exponent_streams(), stats)))
        return (yield from _dense(w, stats))
    if scheme == "compact":
        return (yield from _compact(w, stats, bitmap_levels(w.numel, None, w.cfg)))
    # sketch / auto: a first round agrees exponents and estimates the union (sampled bitmap)
    if scheme == "sketch" and w.cfg.sketch_cells is not None and not w.is_float:
        w.quantize(None)  # statically sized integer sketch: a single round
        return (yield from _sketch_round(w, stats, 0.0))
    sample, scale = w.union_sample()
    nnz = w.nnz()
    combined = yield from exchange(w.exponent_streams() + [
        Stream("union_sample", CombineOp.OR, sample),
        Stream("nnz_max", CombineOp.MAX, _words([nnz], w.device)),
        Stream("nnz_sum", CombineOp.ADD, _words([nnz & 0xFFFF, nnz >> 16], w.device)),
    ], stats)
    sampled, nnz_max, nnz_sum = w.set_exponents(combined)
    upper = min(w.numel, int(nnz_sum[0]) + (int(nnz_sum[1]) << 16))
    estimate = min(max(_bitmap.popcount(sampled) * scale, float(nnz_max[0])), float(upper))
    if scheme == "auto":
        scheme = choose(w.numel, estimate, w.limbs, w.cfg)
        if scheme == "dense":
            return (yield from _dense(w, stats))
        if scheme == "compact":
            return (yield from _compact(w, stats, bitmap_levels(w.numel, estimate, w.cfg), exponents_done=True))
    return (yield from _sketch_round(w, stats, estimate))


def _steady(w: Worker, scheme: str, stats: WorkerStats, prior: Agreed) -> Protocol:
    """A call with a history entry; ``scheme``: :func:`_prepare`'s continuation (never ``auto``).

    Not a generator itself: it quantises under the guess (where one pays) now, before any round,
    and returns the continuation's generator, so the rounds pass through no layer that only
    forwards them."""
    if scheme == "compact":
        return _compact(w, stats, bitmap_levels(w.numel, float(prior.union), w.cfg))
    previous = prior.exponents if w.is_float else None
    if previous is not None and previous.numel() != w.blocks:  # pragma: no cover - the key includes numel
        previous = None
    if w.is_float and (previous is None or not _guess_pays(w, prior)):
        return _first_call(w, scheme, stats)
    guess = w.guess(previous) if previous is not None else None
    if guess is None:
        w.quantize(None)
    if scheme == "dense":
        return _dense(w, stats, guess)
    return _sketch_round(w, stats, float(prior.union), guess)


def _dense(w: Worker, stats: WorkerStats, guess: torch.Tensor | None = None) -> Protocol:
    """Words of every element (quantised under the agreed exponents, or under ``guess``)."""
    stats.schemes["dense"] += 1
    streams = w.guess_streams(guess) if guess is not None else []
    streams.append(w.dense_stream())
    combined = yield from exchange(streams, stats)
    sums = combined[-1]  # flat, as combined: the decoder takes it so (no (n, L) view to undo)
    bad = w.settle(combined[0], combined[1]) if guess is not None else None
    known = w.read_dense(sums, bad)  # one read: whether to redo, and what decoding needs
    if known["redo"]:
        assert bad is not None
        redo = w.block_positions(bad)
        stats.redos += 1
        stats.redone += redo.numel()
        (fixed,) = yield from exchange([Stream("redo", CombineOp.ADD, w.dense_values(bad))], stats)
        sums = sums.reshape(-1, w.limbs)
        sums[redo] = fixed.reshape(-1, w.limbs)
        known = {}  # figures of the sums before the redo
    return w.dense_result(sums, known)


def _compact(w: Worker, stats: WorkerStats, levels: int, exponents_done: bool = False) -> Protocol:
    stats.schemes["compact"] += 1
    streams = [] if exponents_done else w.exponent_streams()
    local = w.bitmap
    streams.append(Stream("bitmap", CombineOp.OR, local) if levels == 1 else
                   Stream("word_bitmap", CombineOp.OR, _bitmap.word_bitmap(local)))
    combined = yield from exchange(streams, stats)
    if not exponents_done:
        combined = w.set_exponents(combined)
    words = combined[0]
    if levels == 2:  # the union's nonzero bitmap words are known (the set bits of ``words``): combine only those
        count = w.fetch(held=_hostops.set_bit_count(words))["held"] if w.device_path else None
        held = Stream("bitmap", CombineOp.OR, _bitmap.select_words(local, words, count))
        (selected,) = yield from exchange([held], stats)
        words = _bitmap.place_words(selected, words, local.numel())
    in_range = None
    if w.device_path:  # one read: the union's size (the values stream's length) and the decoding's range
        ranged = {"in_range": _fixedpoint.float32_in_range(w.exponents, w.world_size)} if (
            w.dtype == torch.float32 and w.exponents is not None) else {}
        known = w.fetch(union=_hostops.set_bit_count(words), **ranged)
        w.union, in_range = known["union"], (bool(known["in_range"]) if ranged else None)
    else:
        w.union = _bitmap.popcount(words)
    (sums,) = yield from exchange([Stream("values", CombineOp.ADD, w.union_values(words, w.union).reshape(-1))],
                                  stats)
    return w.result_at_bits(words, sums.reshape(-1, w.limbs), in_range)


def _words(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _sketch_round(w: Worker, stats: WorkerStats, estimate: float, guess: torch.Tensor | None = None) -> Protocol:
    """Bitmap + count sketch (+ fresh exponents when quantised under ``guess``), then one repair
    round for the unpeelable 2-core and the elements of blocks whose exponent moved, if any."""
    cfg = w.cfg
    stats.schemes["sketch"] += 1
    cells = cfg.sketch_cells or _sketch.sketch_cells(estimate, cfg.sketch_overhead)
    stats.sketch_cells = cells
    streams = w.guess_streams(guess) if guess is not None else []
    streams += [
        Stream("bitmap", CombineOp.OR, w.bitmap),
        Stream("sketch", CombineOp.ADD, _sketch.encode(w.idx, w.grid, cells, cfg.seed)),
    ]
    combined = yield from exchange(streams, stats)
    bitmap, table = combined[-2:]
    union = _bitmap.unpack_positions(bitmap)
    w.union = union.numel()
    sums, core = _sketch.peel(union, table, w.limbs, cfg.seed)
    redo = core
    if guess is not None:
        bad = w.settle(combined[0], combined[1])
        if bool(bad.any()):
            moved = torch.nonzero(bad.index_select(0, union // cfg.block_size)).squeeze(1)
            stats.redos += 1
            stats.redone += moved.numel()
            redo = torch.unique(torch.cat([core, moved]))  # sorted
    if core.numel():
        stats.repaired += core.numel()
    if redo.numel():
        (fixed,) = yield from exchange([Stream("repair", CombineOp.ADD, w.values_at(union[redo]).reshape(-1))], stats)
        sums[redo] = fixed.reshape(-1, w.limbs)
    return w.result(union, sums)
