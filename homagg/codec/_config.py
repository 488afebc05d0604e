"""Validated codec options shared by every scheme (one object, checked once)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError

__all__ = ["CodecConfig", "SCHEMES", "PRECISIONS", "check_scheme"]

#: the codec's schemes, the one definition (the CLI, the torch backend and the benchmarks import it)
SCHEMES: tuple[str, ...] = ("auto", "sketch", "compact", "dense")
#: ``precision``'s values: words per float value by the world size, one, or two
#: (:func:`homagg.codec._fixedpoint.float_words`)
PRECISIONS: tuple[str, ...] = ("auto", "single", "wide")


@dataclass(frozen=True)
class CodecConfig:
    """Options of the codec.  Every worker of a job must use equal options.

    block_size       elements sharing one fixed-point exponent (the error bound is per block).
    sketch_overhead  count-sketch cells per estimated distinct nonzero (peeling needs >= ~1.222).
    sketch_cells     fixed cell count instead of the estimate (static sizing; tiny values force the
                     2-core repair path, which stays exact).
    union_sample     elements (whole blocks, evenly strided) whose OR-ed bitmap estimates the union's
                     size on a tensor's first call (sketch/auto); the whole tensor when smaller.
    bandwidth_gbps   link bandwidth assumed by ``auto``'s cost model.
    rtt_us           round-trip time assumed by ``auto``'s cost model.
    peel_ns          decode time per distinct nonzero of the sketch's peeling, in ``auto``'s cost
                     model (~280 ns measured at a 900k union on a 2-core VM; 0 ignores CPU).
    dense_ns         encode + decode time per element of the dense continuation, in ``auto``'s
                     cost model (native fixed point: ~2.1 ns measured, 25M fp32, one core of VM C).
    compact_ns       encode + decode time per union element of compact (values gathered at the
                     union, quantised, scattered back: ~20 ns at a 10% and a 60% density, measured
                     as ``dense_ns``; 28 and 50 ns before quantising at positions was native).  With both, ``auto`` picks dense where compact's
                     bytes saved cost more CPU than they save wire time (e.g. VGG19's 60%-dense
                     gradients on 1 Gbit/s links).
    seed             hash seed (cells and signs of the sketch).
    bitmap_levels    compact's bitmap: 1 (every word), 2 (a bitmap of the nonzero words first, then
                     only the words the union holds: one more round, far fewer words at low
                     density) or None (by ``auto``'s cost model, from the union size agreed on an
                     earlier call or estimated on this one; 1 when neither is known).
    guess_window     steady-state calls (a :class:`~homagg.History` entry) quantise each block under
                     the previous call's agreed exponent raised by half the precision bits the error
                     bound leaves unused (:func:`homagg.codec._fixedpoint.guess_slack`: 5 bits at
                     W = 4, so +2) and keep every block whose fresh exponent lies within that
                     window (-3..+2 binary orders at W = 4): exponents that drift, as they do at
                     every training step, cost no redo round.  Results stay identical on every
                     worker and within the documented bound, but a steady call's grid may be up to
                     ``slack`` bits coarser than a call that agreed exponents first.  False: only
                     guesses equal to the fresh exponents stand (results bit-identical to a call
                     without history; a redo round whenever a block's exponent moves).
    segment          elements per pipelined segment of a large dense tensor (rounded down to a
                     multiple of block_size; 0: never segment).  Segments stream through the
                     switch while earlier ones encode/decode; results are bit-identical.  None
                     (default): 2**23 for CPU tensors, 0 for device (CUDA) tensors, whose encoding
                     runs asynchronously on the device: segments would only add their host reads
                     (two per segment in steady state) and launches.  Every worker of a call must
                     segment alike: a job mixing CPU and CUDA tensors sets it explicitly (else its
                     ranks disagree about the call and raise ``RankMismatchError``).
    precision        int32 words per float value.  ``"single"``: one word, ``P = 31 - ceil(log2 W)``
                     bits below each block's exponent.  ``"wide"``: two words (the integer path's
                     16-bit limbs), ``P2 = 47 - ceil(log2 W)`` bits: twice the value words and
                     bytes, an error of at most one float32 rounding at the block's scale
                     (docs/trees.md).  ``"auto"`` (default): wide where single words keep fewer
                     than float32's 24 bits (``W > 128``), else single
                     (:func:`homagg.codec._fixedpoint.float_words`).  Integers are exact either way.
    small_calls      a dense tensor of at most one block (``numel <= block_size``) with scheme
                     ``auto`` or ``dense`` takes the small-call path (:mod:`homagg.codec._small`):
                     the dense protocol in scalar arithmetic, its descriptor, exponent and guess in
                     one MAX datagram and its values in one ADD stream (one round trip in steady
                     state; a first float call two); results bit-identical to the general path
                     (``False``), which ``auto`` would otherwise run with a union estimate first.
                     Also the mid-size steady calls (:mod:`homagg.codec._mid`: an in-place
                     float32 CPU tensor of 2 blocks to 256K elements whose steady call is dense
                     runs the general path's round without its per-call set-up; the same words
                     and results).
    """

    block_size: int = 1024
    sketch_overhead: float = 1.4
    sketch_cells: int | None = None
    union_sample: int = 1 << 20
    bandwidth_gbps: float = 10.0
    rtt_us: float = 100.0
    peel_ns: float = 300.0
    dense_ns: float = 2.0
    compact_ns: float = 20.0
    seed: int = 0x5EED
    segment: int | None = None
    bitmap_levels: int | None = None
    guess_window: bool = True
    precision: str = "auto"
    small_calls: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(f"block_size must be a positive int, got {self.block_size!r}")
        if not self.sketch_overhead >= 1.0:
            raise ConfigError(f"sketch_overhead must be >= 1.0, got {self.sketch_overhead!r}")
        if self.sketch_cells is not None and (not isinstance(self.sketch_cells, int) or self.sketch_cells < 3):
            raise ConfigError(f"sketch_cells must be an int >= 3, got {self.sketch_cells!r}")
        if self.segment is not None and (not isinstance(self.segment, int) or self.segment < 0):
            raise ConfigError(f"segment must be an int >= 0 or None (by device), got {self.segment!r}")
        if not isinstance(self.union_sample, int) or self.union_sample < 1:
            raise ConfigError(f"union_sample must be a positive int, got {self.union_sample!r}")
        if self.bitmap_levels not in (None, 1, 2) or isinstance(self.bitmap_levels, bool):
            raise ConfigError(f"bitmap_levels must be 1, 2 or None (cost model), got {self.bitmap_levels!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not isinstance(self.small_calls, bool):
            raise ConfigError(f"small_calls must be True or False, got {self.small_calls!r}")
        if not isinstance(self.guess_window, bool):
            raise ConfigError(f"guess_window must be True or False, got {self.guess_window!r}")
        for name in ("peel_ns", "dense_ns", "compact_ns"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.bandwidth_gbps > 0 or not self.rtt_us >= 0:
            raise ConfigError(f"need bandwidth_gbps > 0 and rtt_us >= 0, got {self.bandwidth_gbps}, {self.rtt_us}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**31:
            raise ConfigError(f"seed must be an int in [0, 2**31), got {self.seed!r}")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> CodecConfig:
        """Build from keyword options; unknown names raise :class:`ConfigError`."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"unknown codec option(s) {unknown}; known: {sorted(known)}")
        return cls(**options)


def check_scheme(scheme: str) -> str:
    """``scheme`` if it is one of :data:`SCHEMES`, else raise :class:`ConfigError`."""
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown scheme {scheme!r}; choose one of {SCHEMES}")
    return scheme
