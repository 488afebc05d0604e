"""The codec: one worker's side of an exact allreduce through a switch port.

What its callers use (``homagg.allreduce`` and the torch backend hand these on)::

    allreduce(tensor, port, scheme="auto", stats=None, **options)   # one worker's SUM
    History()                                                      # what earlier calls agreed
    CodecConfig, SCHEMES                                           # the options, validated once
    WorkerStats()                                                  # bytes, rounds, redos

The modules, top down (each imports only those below it, and :mod:`homagg.transport`,
:mod:`homagg.wire` and :mod:`homagg._errors`):

* ``_protocol`` -- :func:`allreduce`, the one entry point every front end uses;
* ``_pipeline`` -- a large tensor in segments, earlier segments decoding while later ones travel;
* ``_schemes`` -- the schemes' protocols, written as generators of rounds, and the cost model;
* ``_descriptor``, ``_sketch`` -- the call descriptor checked by every rank; the count sketch;
* ``_worker`` -- one worker's view of one tensor, and the exchange of one round (its decoding
  half in ``_decoding``);
* ``_bitmap``, ``_blocks``, ``_fixedpoint``, ``_hostops`` -- bitmaps, block fixed point (whole
  dense tensors and index lists), the O(n) scans and scatters;
* ``_exponents`` -- the steady calls' per-block exponent bookkeeping (guesses, which blocks
  stand, what moved; numpy on the host, torch elsewhere);
* ``_native`` -- the optional C kernels (``_native_kernels.c``, ``_scan_kernels.c``, ``_dense_kernels.c``, built as
  ``homagg.codec._native_kernels``), loaded with ctypes; ``_hashing``, ``_sparse``;
* ``_config``, ``_history``, ``_stats`` -- options, agreed state, statistics.

Names load their module on first access: ``import homagg`` reads the options (``_config``)
without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_attributes

if TYPE_CHECKING:
    from ._config import SCHEMES, CodecConfig
    from ._history import History
    from ._protocol import allreduce
    from ._stats import WorkerStats

#: public name -> module that defines it (relative to this package)
_LAZY = {
    "allreduce": "._protocol",
    "History": "._history",
    "CodecConfig": "._config",
    "SCHEMES": "._config",
    "WorkerStats": "._stats",
}

__all__ = ["allreduce", "History", "CodecConfig", "SCHEMES", "WorkerStats"]


__getattr__, __dir__ = lazy_attributes(__name__, globals(), _LAZY, __all__)
