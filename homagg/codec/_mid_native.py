"""The mid-size steady call's two C calls (``homagg/codec/_mid_kernels.c``, in the codec's native
library), for :mod:`homagg.codec._mid`.

A :class:`MidKernel` holds one call signature's C struct bound to one port's own round arrays (its
four input arrays, the scratch of a few words per block) and is kept with them
(:attr:`homagg.transport.OwnRound.kept`): one ctypes call encodes the tensor into the round's
arrays, one decodes the combined words into it.  :data:`AVAILABLE` says whether the library has
the kernels (else :mod:`homagg.codec._mid` runs its steps from Python: the same kernels, one call
each).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from . import _native

__all__ = ["AVAILABLE", "MidKernel", "ENCODED", "NONFINITE", "DECODED", "REDO", "FLOAT64"]

_LIB = _native._LIB
#: whether the codec's library holds the kernels (a library built before them does not)
AVAILABLE = _LIB is not None and hasattr(_LIB, "homagg_mid_encode")
ENCODED, NONFINITE = 0, -1  #: :meth:`MidKernel.encode`'s answers
#: :meth:`MidKernel.decode`'s answers: the results written; a block to redo; a float64 decode (a
#: factor outside float32's normal range, or two words per value): nothing written on the last two
DECODED, REDO, FLOAT64 = 0, 1, 2
_P = ctypes.c_void_p


class _Call(ctypes.Structure):
    """``hg_mid_call`` (``_mid_kernels.c``), field for field."""

    _fields_ = [("n", ctypes.c_int64), ("block_size", ctypes.c_int64), ("blocks", ctypes.c_int64),
                ("limbs", ctypes.c_int32), ("p", ctypes.c_int32), ("raise_by", ctypes.c_int64),
                ("slack", ctypes.c_int64), ("limit", ctypes.c_float), ("peak", _P), ("guess", _P), ("f1", _P),
                ("f2", _P), ("factor", _P), ("bad", _P), ("exps", _P), ("head", _P), ("head_tpl", _P),
                ("head_len", ctypes.c_int64), ("local", _P), ("negated", _P), ("words", _P), ("agreed", _P),
                ("mng", _P), ("sums", _P), ("src", _P), ("dst", _P), ("previous", _P),
                ("union_count", ctypes.c_int64), ("held", ctypes.c_int64), ("moved", ctypes.c_int64)]


class _Sink(ctypes.Structure):
    """``hg_mid_sink`` (``_mid_kernels.c``), field for field."""

    _fields_ = [("call", _P), ("state", ctypes.c_int64), ("next", ctypes.c_int64), ("first", ctypes.c_int64),
                ("union_count", ctypes.c_int64), ("sums", _P), ("off", _P), ("wc", _P), ("total", ctypes.c_int64)]


#: whether the library decodes a round's chunks as they come (``homagg_mid_results``: a library built
#: before it decodes after the round); ``HOMAGG_MID_OVERLAP=0`` turns it off (A/B runs, tests)
OVERLAP = AVAILABLE and hasattr(_LIB, "homagg_mid_results") and os.environ.get("HOMAGG_MID_OVERLAP", "1") != "0"
_RESULTS_HOOK = (ctypes.cast(_LIB.homagg_mid_results, ctypes.c_void_p).value  # type: ignore[union-attr]
                 if OVERLAP else None)

if AVAILABLE:
    assert _LIB is not None
    for _name in ("homagg_mid_encode", "homagg_mid_decode") + (("homagg_mid_finish",) if OVERLAP else ()):
        getattr(_LIB, _name).argtypes = [ctypes.c_void_p]
        getattr(_LIB, _name).restype = ctypes.c_int


class MidKernel:
    """One signature's struct (``sig``: :class:`homagg.codec._mid._Signature`) bound to ``ins``,
    the round's four input arrays (descriptor, exponents, guess, values).  Not thread-safe: one
    is kept per port and round shape, whose rounds run one at a time."""

    def __init__(self, sig: Any, block_size: int, ins: list[np.ndarray]) -> None:
        assert AVAILABLE and [a.size for a in ins] == list(sig.lengths)
        blocks = sig.blocks
        scratch = [np.zeros(blocks, dtype=t) for t in (np.uint32, np.int32, np.float32, np.float32, np.float32,
                                                        np.uint8, np.int32)]
        self._keep = [*scratch, sig.head, *ins]  # the arrays the struct points at live as long as it
        peak, guess, f1, f2, factor, bad, exps = (a.ctypes.data for a in scratch)
        head, local, negated, words = (a.ctypes.data for a in ins)
        st = self._st = _Call(n=sig.n, block_size=block_size, blocks=blocks, limbs=sig.limbs, p=sig.p,
                              raise_by=sig.raise_by, slack=sig.slack, limit=sig.limit, peak=peak, guess=guess,
                              f1=f1, f2=f2, factor=factor, bad=bad, exps=exps, head=head,
                              head_tpl=sig.head.ctypes.data, head_len=sig.head.size, local=local, negated=negated,
                              words=words)
        self._ref = ctypes.addressof(st)
        self._encode, self._decode = _LIB.homagg_mid_encode, _LIB.homagg_mid_decode  # type: ignore[union-attr]
        self._outs: list[np.ndarray] | None = None  # the combined arrays the struct points at now
        self._sink = _Sink(call=self._ref)
        #: the round's results hook (:meth:`~homagg.transport.OwnRound.run`'s ``on_results``) where
        #: the values decode as they come (one word per value), else None
        self.on_results = (_RESULTS_HOOK, ctypes.addressof(self._sink)) if OVERLAP and sig.limbs == 1 else None
        #: values chunks the hook decoded during the last round (the rest: after it)
        self.early = 0
        if self.on_results is not None:
            self._decode = _LIB.homagg_mid_finish  # type: ignore[union-attr]
            self._decode_ref = self.on_results[1]
        else:
            self._decode_ref = self._ref

    def encode(self, src: int, previous: int, dst: int) -> int:
        """The float32 elements at ``src`` into the round's arrays, guessed from the int32
        exponents at ``previous``: :data:`ENCODED`, or :data:`NONFINITE` (nothing written).
        ``dst``: where the round's results hook (:attr:`on_results`) decodes the round's values;
        the hook is reset for the round."""
        st, sink = self._st, self._sink
        st.src, st.previous, st.dst = src, previous, dst
        sink.state = sink.next = sink.first = sink.union_count = 0
        sink.sums = None
        return self._encode(self._ref)

    def decode(self, combined: list[np.ndarray], dst: int) -> int:
        """The round's combined arrays into the float32 elements at ``dst`` (the call's
        :meth:`encode`'s): :data:`DECODED`, :data:`REDO` or :data:`FLOAT64` (see there);
        :attr:`held` and :attr:`moved` set on all three.  Where the results hook decoded chunks
        of these very arrays during the round, only the rest."""
        st = self._st
        outs = self._outs
        if outs is None or any(a is not b for a, b in zip(outs, combined)):  # bound once per array set
            assert [a.size for a in combined] == [st.head_len, st.blocks, st.blocks, st.n * st.limbs]
            assert all(a.dtype == np.int32 and a.flags.c_contiguous for a in combined)
            st.agreed, st.mng, st.sums = combined[1].ctypes.data, combined[2].ctypes.data, combined[3].ctypes.data
            self._outs = list(combined)
        st.dst = dst
        sink = self._sink
        self.early = sink.next - sink.first if sink.state == 1 and sink.sums == st.sums else 0
        return self._decode(self._decode_ref)

    def figures(self) -> tuple[int, int, int]:
        """(nonzero sums, blocks held in both calls, those that left the window) of the last decode."""
        st = self._st
        return st.union_count, st.held, st.moved
