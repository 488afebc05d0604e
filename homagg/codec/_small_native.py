"""The steady small call's encode and decode in C (``homagg/codec/_small_kernels.c``, in the
codec's native library), for :class:`homagg.codec._small._Steady`.

A :class:`SmallKernel` holds one call signature's C struct (the grid, the descriptor template) and,
per call, points it at the tensor's memory and the port's own arrays
(:meth:`~homagg.transport.SwitchPort.own_round`): :meth:`SmallKernel.encode` writes the descriptor
round's MAX words and the values' ADD words there; :meth:`SmallKernel.decode` writes the exact sums
back into the tensor.  No Python numbers, lists or new arrays per call: the tensor is read and
written at its ``data_ptr()`` (contiguous CPU float32 or float64 only), and the arrays' addresses
are kept while the port hands out the same arrays.

Invariant: the words, exponents and values are those of :mod:`homagg.codec._small_grid` bit for bit
(``tests/test_small_native.py``); where the library lacks the kernels (no compiler,
``HOMAGG_NATIVE=0``), :data:`AVAILABLE` is False and ``_Steady`` runs the Python arithmetic.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import _native

__all__ = ["AVAILABLE", "SmallKernel", "ENCODED", "NONFINITE", "DECODED", "REDO"]

_LIB = _native._LIB
#: whether the library has the kernels (an older build lacks them)
AVAILABLE = _LIB is not None and hasattr(_LIB, "homagg_small_encode")
ENCODED, NONFINITE = 0, -1  #: :meth:`SmallKernel.encode`'s answers
DECODED, REDO = 0, 1  #: :meth:`SmallKernel.decode`'s answers

_i32p = ctypes.POINTER(ctypes.c_int32)


class _Call(ctypes.Structure):
    """``hg_small_call`` (``_small_kernels.c``), field for field."""

    _fields_ = [("n", ctypes.c_int64), ("limbs", ctypes.c_int32), ("is64", ctypes.c_int32), ("p", ctypes.c_int32),
                ("raise_by", ctypes.c_int32), ("limit", ctypes.c_int64), ("slack", ctypes.c_int64),
                ("head_tpl", ctypes.c_void_p), ("head_len", ctypes.c_int64), ("src", ctypes.c_void_p),
                ("dst", ctypes.c_void_p), ("previous", ctypes.c_int32), ("head", ctypes.c_void_p),
                ("words", ctypes.c_void_p), ("head_out", ctypes.c_void_p), ("sums", ctypes.c_void_p),
                ("local", ctypes.c_int32), ("guess", ctypes.c_int32), ("agreed", ctypes.c_int32),
                ("nonfinite", ctypes.c_int32), ("union_count", ctypes.c_int64)]


if AVAILABLE:
    assert _LIB is not None
    _LIB.homagg_small_encode.argtypes = [ctypes.c_void_p]
    _LIB.homagg_small_encode.restype = ctypes.c_int
    _LIB.homagg_small_decode.argtypes = [ctypes.c_void_p]
    _LIB.homagg_small_decode.restype = ctypes.c_int


class SmallKernel:
    """One call signature's C struct: ``n`` elements of float64 (``is64``) or float32, ``limbs``
    words each, the grid ``(p, limit, slack)``, the guess's margin ``raise_by`` and the
    descriptor round's template ``head`` (int32, kept alive here).  Not thread-safe: one is kept
    per port and round shape (:attr:`homagg.transport.OwnRound.kept`), whose rounds run one at a
    time."""

    def __init__(self, n: int, limbs: int, is64: bool, p: int, limit: int, slack: int, raise_by: int,
                 head: np.ndarray) -> None:
        assert AVAILABLE and head.dtype == np.int32 and head.flags.c_contiguous
        self._head_tpl = head
        st = self._st = _Call(n=n, limbs=limbs, is64=int(is64), p=p, raise_by=raise_by, limit=limit, slack=slack,
                              head_tpl=head.ctypes.data, head_len=head.size)
        self._ref = ctypes.addressof(st)
        self._encode, self._decode = _LIB.homagg_small_encode, _LIB.homagg_small_decode  # type: ignore[union-attr]
        # the arrays the struct points at now (their addresses are asked again only for others)
        self._ins: tuple[np.ndarray, np.ndarray] | None = None
        self._outs: tuple[np.ndarray, np.ndarray] | None = None

    def encode(self, address: int, previous: int, head: np.ndarray, words: np.ndarray) -> int:
        """Quantise the tensor's elements at ``address`` under the guess from ``previous`` into
        ``words`` and fill ``head`` (the template, then the local exponent and the negated guess):
        :data:`ENCODED`, or :data:`NONFINITE` (a NaN or an infinity; nothing written)."""
        st = self._st
        ins = self._ins
        if ins is None or ins[0] is not head or ins[1] is not words:
            assert head.size == st.head_len and words.size == st.n * st.limbs
            st.head, st.words = head.ctypes.data, words.ctypes.data
            self._ins = (head, words)
        st.src = address
        st.previous = previous
        return self._encode(self._ref)

    def decode(self, head_out: np.ndarray, sums: np.ndarray, address: int) -> int:
        """The combined words (``head_out``: the descriptor round's MAX, ``sums``: the values') as
        the tensor's elements at ``address``: :data:`DECODED` (:attr:`agreed`, :attr:`union` set),
        or :data:`REDO` (the guess missed the agreed window; only :attr:`agreed` set)."""
        st = self._st
        outs = self._outs
        if outs is None or outs[0] is not head_out or outs[1] is not sums:
            assert head_out.dtype == np.int32 and sums.dtype == np.int32 and head_out.flags.c_contiguous \
                and sums.flags.c_contiguous and head_out.size == st.head_len and sums.size == st.n * st.limbs
            st.head_out, st.sums = head_out.ctypes.data, sums.ctypes.data
            self._outs = (head_out, sums)
        st.dst = address
        return self._decode(self._ref)

    @property
    def local(self) -> int:
        return self._st.local

    @property
    def guess(self) -> int:
        return self._st.guess

    @property
    def agreed(self) -> int:
        return self._st.agreed

    @property
    def union(self) -> int:
        return self._st.union_count
