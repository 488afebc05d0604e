"""The dense scheme's words as a :class:`~homagg.transport.WordSource`: quantised into the datagrams.

A dense call's values stream is every element's int32 grid word, the size of the tensor itself.
Materialised, it costs a tensor-sized write (``homagg_quantize32``) and a second read when the
transport copies the words into its datagrams (``hg_words_to_wire``): two passes over 100 MB for a
25M-element float32 tensor.  :class:`QuantizedWords` instead hands the worker port's native
datapath ``homagg_fill_quantize32`` (``homagg/codec/_dense_kernels.c``), which quantises each
chunk's elements straight into its datagram's payload, big-endian, as the datagram is built: one
pass over the input and no words array.  A retransmission resends the datagram's bytes as built.

Invariant: the words written for ``[off, off + n)`` are, big-endian, ``materialize()[off:off + n]``
bit for bit (the same float32 factors, the same operations in the same order, the same clamp;
``tests/test_dense_source.py``), so every port and both datapaths put the same words on the wire.
The source reads its input while its round runs: the caller does not write the tensor before the
round completes (the codec writes results only after it).
"""

from __future__ import annotations

import ctypes

import torch

from . import _blocks, _native
from ..transport._base import WordSource

__all__ = ["QuantizedWords", "fills_natively"]


class _QuantCtx(ctypes.Structure):  # hg_quant_src (_dense_kernels.c)
    _fields_ = [("x", ctypes.c_void_p), ("f1", ctypes.c_void_p), ("f2", ctypes.c_void_p),
                ("limit", ctypes.c_float), ("bs", ctypes.c_int64)]


def fills_natively(flat: torch.Tensor) -> bool:
    """Whether a :class:`QuantizedWords` of ``flat`` has a native fill function (the native kernels
    built, ``flat`` contiguous float32 on the CPU, outside autograd)."""
    return (_native.FILL_QUANTIZE32 is not None and flat.dtype == torch.float32 and flat.device.type == "cpu"
            and flat.is_contiguous() and not flat.requires_grad)


class QuantizedWords(WordSource):
    """Every element's grid word of flat float32 ``flat`` under per-block ``exponents`` (the words
    of :func:`homagg.codec._blocks.quantize`), computed where they are needed."""

    def __init__(self, flat: torch.Tensor, exponents: torch.Tensor, world_size: int, block_size: int) -> None:
        self.length = flat.numel()
        self.device = flat.device
        self._flat, self._exponents = flat, exponents
        self._world_size, self._block_size = world_size, block_size
        self._ctx: _QuantCtx | None = None
        self._keep: tuple[object, ...] = ()

    def materialize(self) -> torch.Tensor:
        return _blocks.quantize(self._flat, self._exponents, self._world_size, self._block_size)

    def native_fill(self) -> tuple[int, int] | None:
        if not fills_natively(self._flat):
            return None
        if self._ctx is None:
            f1, f2, limit = _blocks.float32_grid(self._exponents, self._world_size)  # contiguous host arrays
            self._keep = (f1, f2)  # the context points into them
            self._ctx = _QuantCtx(self._flat.data_ptr(), f1.ctypes.data, 0 if f2 is None else f2.ctypes.data,
                                  limit, self._block_size)
        assert _native.FILL_QUANTIZE32 is not None
        return _native.FILL_QUANTIZE32, ctypes.addressof(self._ctx)
