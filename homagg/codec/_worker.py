"""One worker's local view of one tensor, and the round helper every scheme uses.

:class:`Worker` holds the local tensor (a dense flat view, or the nonzeros of a sparse COO input),
quantises it under a set of block exponents (agreed, or guessed from an earlier call), answers
"my grid words at these positions" or "my grid words of every element", and writes the decoded
sums into the result (in place when asked).  :func:`exchange` yields one round of non-empty
streams and accounts for it in the statistics.

Two representations, computed only when a scheme needs them: the *dense* one (block views of the
flat tensor, :mod:`homagg.codec._blocks`; what the dense scheme uses, no index tensors) and the *index*
one (sorted nonzero positions ``idx`` and their grid words, :mod:`homagg.codec._fixedpoint`; what
compact and sketch use).  Both give the same words for the same element.
"""

from __future__ import annotations

from collections.abc import Generator
from functools import cache

import torch

from . import _bitmap, _blocks, _dense_source, _exponents, _fixedpoint, _hostops, _sparse
from ._config import CodecConfig
from ._decoding import Decoding
from .._errors import ProtocolError
from ._stats import WorkerStats
from ..transport._base import Stream
from ..wire import CombineOp

__all__ = ["Worker", "Round", "exchange"]

Round = list[Stream]


class Worker(Decoding):
    """Local view of one tensor; the grid words follow the exponents set by :meth:`quantize`.

    Invariants: ``idx`` is sorted (flat positions of the nonzeros); ``grid`` rows align with
    ``idx``; ``exponents`` are the exponents the words are quantised with (floats) — after the
    protocol ends they are the *agreed* exponents of this call, which is what :attr:`exponents`
    and :attr:`union` record for the next call.
    """

    def __init__(self, tensor: torch.Tensor, world_size: int, cfg: CodecConfig, inplace: bool = False) -> None:
        """A dense (strided) tensor, or a sparse COO one (whose result is then a COO tensor too)."""
        self.cfg = cfg
        self.world_size = world_size
        self.dtype = tensor.dtype
        #: int32 words per value: a float's one or two (``cfg.precision``), an integer's limbs
        self.is_float, self.limbs = _words_of(tensor.dtype, cfg.precision, world_size)
        self.numel = tensor.numel()
        self.device = tensor.device
        self.like: torch.Tensor | None = None  # the sparse input whose layout the result takes
        self.flat: torch.Tensor | None = None  # the dense input, flat
        self.target: torch.Tensor | None = None  # where an in-place result goes
        self._idx: torch.Tensor | None = None
        self._raw: torch.Tensor | None = None
        self._bitmap: torch.Tensor | None = None
        if tensor.layout == torch.sparse_coo:
            self.like = tensor
            self._idx, raw = _sparse.flat_nonzeros(tensor)
            self._raw = raw.to(torch.float64) if self.is_float else raw
            if self.is_float:
                _fixedpoint.check_finite(self._raw)
        else:
            # a plain 1-D tensor outside autograd is its own flat view (detach/reshape: two tensor objects per call)
            self.flat = (tensor if tensor.dim() == 1 and not tensor.requires_grad
                         else tensor.detach().reshape(-1))
            # In place: the result overwrites the input (a float's zeros too: -0.0 -> +0.0, Decoding._zeroed).
            if inplace and self.flat.data_ptr() == tensor.data_ptr() and tensor.is_contiguous():
                self.target = self.flat
        #: a dense input whose values the host reads only at a synchronisation (CUDA): the codec
        #: lists no local nonzeros for compact, and reads what it must once per round (:meth:`fetch`)
        self.device_path = self.flat is not None and not _hostops.reads_free(self.flat)
        self._union_positions: torch.Tensor | None = None  # the union's positions (device compact)
        #: the previous call's agreed exponents (history), and the fraction of blocks a guess from
        #: them redid, once :meth:`fetch` read it (else the protocol computes it at the end)
        self.prior: torch.Tensor | None = None
        self.changed: float | None = None
        self._local_exponents: torch.Tensor | None = None
        #: :meth:`guess`'s exponents and their negation (the MAX stream), computed together
        self._guessed: tuple[torch.Tensor, torch.Tensor] | None = None
        self.exponents: torch.Tensor | None = None
        #: the fresh agreed (largest local) exponents where they differ from :attr:`exponents`
        #: (after a guess); None when the words were quantised under the agreed exponents
        self.agreed: torch.Tensor | None = None
        self._grid: torch.Tensor | None = None  # (nnz, L) int32, index representation
        self._quantized = False
        self.union = 0  # distinct nonzeros of the combined result (recorded for the next call)
        self.nnz_hint: int | None = None  # expected local nonzeros (room for the scan's listing)

    # ------------------------------------------------------------------ representations
    @property
    def idx(self) -> torch.Tensor:
        """Sorted flat positions of the local nonzeros (computed on first use)."""
        if self._idx is None:
            assert self.flat is not None
            # the values and the packed bitmap come with the scan (each chunk still in cache)
            odd: list[int] = []
            self._idx, raw, self._bitmap = _hostops.nonzeros_and_bitmap(self.flat, self.nnz_hint, odd)
            self._raw = raw.to(torch.float64) if self.is_float else raw
            self.plain_zeros = odd == [0]  # the scan saw no -0.0: an in-place result needs no fill
        return self._idx

    @property
    def listed_nnz(self) -> int:
        """Local nonzeros, where the index list was built (else 0: nothing is scanned for it)."""
        return 0 if self._idx is None else self._idx.numel()

    @property
    def bitmap(self) -> torch.Tensor:
        """int32 nonzero bitmap words of :attr:`idx` (:func:`homagg.codec._bitmap.pack_positions`)."""
        if self._bitmap is None and self._idx is None and self.device_path:
            assert self.flat is not None  # packed from the input: no positions listed, no host read
            self._bitmap = _hostops.nonzero_bitmap(self.flat)
        if self._bitmap is None:
            idx = self.idx  # a dense input's scan packs the bitmap too
            if self._bitmap is None:
                self._bitmap = _bitmap.pack_positions(idx, self.numel)
        return self._bitmap

    @property
    def raw(self) -> torch.Tensor:
        """Values at :attr:`idx` (float64 for floats)."""
        if self._raw is None:
            self.idx  # noqa: B018 - the scan that finds the positions also gathers the values
        assert self._raw is not None
        return self._raw

    @property
    def grid(self) -> torch.Tensor:
        """(nnz, L) int32 grid words of the local nonzeros under :attr:`exponents`."""
        assert self._quantized, "quantize() first"
        if self._grid is None:
            if self.is_float:
                assert self.exponents is not None
                self._grid = _fixedpoint.quantize_words(self.idx, self.raw, self.exponents, self.cfg.block_size,
                                                        self.world_size, self.limbs)
            else:
                self._grid = _fixedpoint.to_limbs(self.raw, self.limbs)
        return self._grid

    @property
    def local_exponents(self) -> torch.Tensor | None:
        """int32 exponent of each block's largest local magnitude (None for integers); computed on
        first use from the index list when it exists and holds under 1/16 of the elements (O(nnz),
        ~20 ns each), else by one pass over the dense tensor (:func:`homagg.codec._blocks.exponents`,
        ~1 ns per element native) — the two are equal bit for bit.

        Raises :class:`~homagg.NonFiniteError` for NaN/Inf input (before anything is sent: every
        protocol asks for it, or for :attr:`idx`, before its first round)."""
        if self._local_exponents is None and self.is_float:
            if self._idx is not None and (self.flat is None or 16 * self._idx.numel() < self.numel):
                # block_exponents checks the values are finite (in its native pass where built)
                self._local_exponents = _fixedpoint.block_exponents(self._idx, self.raw, self.numel,
                                                                    self.cfg.block_size)
            else:
                assert self.flat is not None
                self._local_exponents = _blocks.exponents(self.flat, self.cfg.block_size)
        return self._local_exponents

    @property
    def blocks(self) -> int:
        return -(-self.numel // self.cfg.block_size)

    # ------------------------------------------------------------------ exponents
    def exponent_streams(self) -> Round:
        return [] if self.local_exponents is None else [Stream("exponents", CombineOp.MAX, self.local_exponents)]

    def quantize(self, exponents: torch.Tensor | None) -> None:
        """Quantise under ``exponents`` (floats; ``None`` for integers: exact 16-bit limbs)."""
        if self.is_float:
            assert exponents is not None
            self.exponents = exponents
            self._grid = None
        self._quantized = True

    def set_exponents(self, combined: list[torch.Tensor]) -> list[torch.Tensor]:
        """Consume the exponent stream (floats) from a round's results, quantise; return the rest."""
        if self.is_float:
            self.quantize(combined[0])
            return combined[1:]
        self.quantize(None)
        return combined

    def window(self) -> tuple[int, int]:
        """(raise_by, slack) of this call's guesses (:func:`homagg.codec._exponents.guess_exponents`,
        :func:`~homagg.codec._exponents.mismatched_blocks`): half the unused precision bits above
        the previous maximum, all of them as tolerance; (0, 0) with ``guess_window`` off."""
        return _window(self.world_size, self.limbs if self.is_float else 1, self.cfg.guess_window)

    def guess(self, previous: torch.Tensor) -> torch.Tensor:
        """Quantise under this worker's guess of the exponents (from the previous call's agreed
        ones, raised by :meth:`window`'s headroom); return the guess."""
        assert self.local_exponents is not None
        guess, negated = _exponents.guess_and_negated(previous, self.local_exponents, self.window()[0])
        self._guessed = (guess, negated)
        self.quantize(guess)
        return guess

    def guess_streams(self, guess: torch.Tensor) -> Round:
        """What travels with words quantised under ``guess``: the fresh exponents and the guesses."""
        guessed = self._guessed
        negated = guessed[1] if guessed is not None and guessed[0] is guess else _exponents.negated_guess(guess)
        return self.exponent_streams() + [Stream("guess", CombineOp.MAX, negated)]

    def settle(self, fresh: torch.Tensor, max_negated_guess: torch.Tensor) -> torch.Tensor:
        """After a round quantised under guesses: the blocks whose common guess stands keep it (the
        exponent their sums decode with), the others take the agreed ``fresh`` exponents.

        Returns the bool mask of blocks to redo (contributors guessed differently, or outside the
        window), unread.  The words are re-quantised under the exponents used, when next asked
        for: in every block that stands they are the words sent (each contributor guessed the
        common exponent there), so only a redo or repair round asks.  ``fresh`` (the largest local
        exponents) is what the next call's guess starts from (:attr:`agreed`); on the host,
        :attr:`changed` (``fresh`` against :attr:`prior`) comes from the same pass.
        """
        settled = _exponents.settle_exponents(fresh, max_negated_guess, *self.window(), previous=self.prior)
        self.agreed = fresh
        self.quantize(settled.exponents)
        if settled.changed is not None:  # read on the host with the rest (a device's: at :meth:`fetch`)
            self.changed = settled.changed
        return settled.bad

    def fetch(self, **scalars: torch.Tensor) -> dict[str, int]:
        """The values of 0-d integer or bool tensors, read in one transfer (one synchronisation
        on a device).  With them, once this call's exponents are agreed and it has a previous
        call (:attr:`prior`), the counts behind :attr:`changed`."""
        names, values = list(scalars), [v.reshape(()).to(torch.int64) for v in scalars.values()]
        agreed = self.agreed if self.agreed is not None else self.exponents
        counts = (self.changed is None and self.prior is not None and agreed is not None
                  and self.prior.shape == agreed.shape)
        if counts:
            assert self.prior is not None and agreed is not None
            values += _exponents.changed_counts(self.prior, agreed, *self.window())
        read = torch.stack(values).tolist() if values else []
        if counts:
            held, moved = read[-2:]
            self.changed = moved / held if held else 0.0
        return dict(zip(names, read, strict=False))

    def nnz(self) -> int:
        """Local nonzeros (counted without building the index list when it does not exist yet)."""
        if self._idx is None and self.flat is not None:
            return int(torch.count_nonzero(self.flat))
        return self.idx.numel()

    def union_sample(self) -> tuple[torch.Tensor, float]:
        """Bitmap words (combine with OR) of the local nonzeros in a fixed sample of the tensor, and
        the factor that scales the sample's union size to the whole tensor.

        The sample is the whole tensor when it has at most ``cfg.union_sample`` elements, else every
        k-th full block (identical on every worker: it depends on numel and the options only).
        """
        b = self.cfg.block_size
        full = self.numel // b
        if self.numel <= self.cfg.union_sample or full == 0:
            return self.bitmap, 1.0
        k = -(-full * b // self.cfg.union_sample)
        rows = -(-full // k)  # blocks 0, k, 2k, ... below full
        if self._idx is None and self.flat is not None:  # no index list: scan the sampled blocks only
            pos = torch.nonzero(self.flat[: full * b].view(full, b)[::k].reshape(-1)).squeeze(1)
        else:
            blk = self.idx // b
            sel = torch.nonzero((blk % k == 0) & (blk < full)).squeeze(1)
            pos = (blk[sel] // k) * b + self.idx[sel] % b
        return _bitmap.pack_positions(pos, rows * b), self.numel / (rows * b)

    # ------------------------------------------------------------------ words to send
    def values_at(self, positions: torch.Tensor) -> torch.Tensor:
        """(len(positions), L) int32 of this worker's grid words at sorted ``positions`` (0 if absent)."""
        out = torch.zeros((positions.numel(), self.limbs), dtype=torch.int32, device=self.device)
        idx = self.idx
        if idx.numel() and positions.numel():
            slot = _hostops.sorted_slots(positions, idx).clamp_(max=positions.numel() - 1)
            hit = _hostops.gather(positions, slot) == idx
            out[slot[hit]] = self.grid[hit]
        return out

    def union_values(self, words: torch.Tensor, union_size: int) -> torch.Tensor:
        """(U, L) int32 of this worker's grid words in the order of the set bits of the OR-combined
        bitmap ``words`` (which holds every local nonzero's bit): ``values_at(union)`` without a
        search, each local word's slot counted from the bitmap (:func:`homagg.codec._hostops.bit_ranks`);
        for floats on CPU, quantised straight into the slots in one native pass
        (:func:`homagg.codec._fixedpoint.quantize_into_slots`, bit for bit the same words)."""
        if self._idx is None and self.device_path:
            return self._union_words(words, union_size)
        out = torch.zeros((union_size, self.limbs), dtype=torch.int32, device=self.device)
        if self.idx.numel():
            assert self._quantized, "quantize() first"
            bs = self.cfg.block_size
            if (self._grid is None and self.is_float and self.limbs == 1
                    and _fixedpoint.places_natively(self.idx, self.raw, words, bs)):
                # quantised straight into the union's slots: no slot, grid or scatter pass
                assert self.exponents is not None
                _fixedpoint.quantize_into_slots(self.idx, self.raw, self.exponents, bs, self.world_size, words,
                                                out.view(-1))
                return out
            slot = _hostops.bit_ranks(words, self.idx)
            if self.limbs == 1:
                _hostops.scatter_(out.view(-1), slot, self.grid.view(-1))
            else:
                out[slot] = self.grid
        return out

    def _union_words(self, words: torch.Tensor, union_size: int) -> torch.Tensor:
        """:meth:`union_values` of a device input with no listed nonzeros: this worker's values
        gathered at the union's positions (zero where it holds none; the union holds all it
        does) and quantised there, the same words as at its own positions; the positions are
        kept for the result (:meth:`result_at_bits`)."""
        assert self.flat is not None and self._quantized, "quantize() first"
        positions = _hostops.set_bit_positions(words, union_size)
        self._union_positions = positions
        values = self.flat.index_select(0, positions)
        if self.is_float:
            assert self.exponents is not None
            return _fixedpoint.quantize_words(positions, values.to(torch.float64), self.exponents,
                                              self.cfg.block_size, self.world_size, self.limbs)
        return _fixedpoint.to_limbs(values, self.limbs)

    def dense_values(self, blocks: torch.Tensor | None = None) -> torch.Tensor:
        """Flat int32 words of every element (of the blocks flagged in ``blocks``, if given)."""
        assert self._quantized, "quantize() first"
        if self.flat is None:  # sparse input: from the index representation
            if blocks is not None:
                return self.values_at(self.block_positions(blocks)).reshape(-1)
            values = torch.zeros((self.numel, self.limbs), dtype=torch.int32, device=self.device)
            values[self.idx] = self.grid
            return values.reshape(-1)
        if self.is_float:
            assert self.exponents is not None
            return _blocks.quantize(self.flat, self.exponents, self.world_size, self.cfg.block_size, blocks,
                                    self.limbs)
        flat = self.flat if blocks is None else self.flat[self.block_positions(blocks)]
        return _fixedpoint.to_limbs(flat, self.limbs).reshape(-1)

    def dense_stream(self, name: str = "values") -> Stream:
        """The ADD stream of every element's words (:meth:`dense_values`): a float32 CPU tensor's as a
        :class:`~homagg.codec._dense_source.QuantizedWords` source, which a native datapath
        quantises straight into its datagrams (no words tensor), else the words themselves."""
        assert self._quantized, "quantize() first"
        if self.flat is not None and self.is_float and self.limbs == 1 and _dense_source.fills_natively(self.flat):
            assert self.exponents is not None
            source = _dense_source.QuantizedWords(self.flat, self.exponents, self.world_size, self.cfg.block_size)
            return Stream(name, CombineOp.ADD, None, source=source)
        return Stream(name, CombineOp.ADD, self.dense_values())

    def block_positions(self, bad: torch.Tensor) -> torch.Tensor:
        """Sorted flat positions of every element of the blocks flagged in ``bad``."""
        b = self.cfg.block_size
        starts = torch.nonzero(bad).squeeze(1) * b
        pos = (starts.unsqueeze(1) + torch.arange(b, device=self.device)).reshape(-1)
        return pos[pos < self.numel]


@cache
def _words_of(dtype: torch.dtype, precision: str, world_size: int) -> tuple[bool, int]:
    """(whether ``dtype`` is a float, int32 words per value): :func:`homagg.codec._fixedpoint.is_float_dtype`
    and :func:`~homagg.codec._fixedpoint.limb_count` (raising :class:`~homagg.InputError` for a
    dtype homagg does not aggregate), computed once per job's dtype."""
    return (_fixedpoint.is_float_dtype(dtype),
            _fixedpoint.limb_count(dtype, _fixedpoint.float_words(precision, world_size)))


@cache
def _window(world_size: int, words: int, guess_window: bool) -> tuple[int, int]:
    """:meth:`Worker.window` of a job: (half the slack, the slack) of
    :func:`homagg.codec._fixedpoint.guess_slack`, (0, 0) without a guess window (a pure function
    of the three, computed once)."""
    if not guess_window:
        return 0, 0
    slack = _fixedpoint.guess_slack(world_size, words)
    return slack // 2, slack


def exchange(streams: Round, stats: WorkerStats) -> Generator[Round, list[torch.Tensor], list[torch.Tensor]]:
    """Yield the non-empty streams as one round; return results aligned with ``streams``.

    An all-empty round is not sent (and not counted); its "results" are the empty inputs.
    """
    lengths = [s.length for s in streams]  # each asked once (a property)
    every = all(lengths)  # the usual round: every stream sent, the results as they come
    sent = list(streams) if every else [s for s, n in zip(streams, lengths) if n]
    counts = stats.bytes_per_stream
    for s, n in zip(sent, lengths if every else [n for n in lengths if n]):
        counts[s.name] += 4 * n
    combined = (yield sent) if sent else []
    stats.rounds += 1 if sent else 0
    if len(combined) != len(sent):
        raise ProtocolError(f"switch returned {len(combined)} streams for a round of {len(sent)}")
    if every:
        return list(combined)
    it = iter(combined)
    return [next(it) if s.length else torch.zeros(0, dtype=torch.int32, device=s.device) for s in streams]
