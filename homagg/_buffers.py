"""Large int32 word arrays reused across calls instead of allocated afresh.

A fresh tensor-sized array costs page faults on first touch: on the 2-core VM of
docs/benchmarks.md, allocating and filling 100 MB (25M int32 words) takes ~145 ms, against ~30 ms
to copy 100 MB between touched pages.  The codec's dense words (:mod:`homagg.codec._blocks`) and the
transport's round results (:mod:`homagg.transport._udp`) are written in full every call, so an
array of an earlier call that nobody references any more serves as well as a new one.

:class:`KeptResults` keeps, per stream of one round shape, the last few result arrays with their
addresses: a steady call of the same shape takes its arrays back without a scan, a size match or
a numpy address lookup (the transport's round plans, :mod:`homagg.transport._roundplan`).

Invariant: an array is handed out again only when no tensor, view or array made from it is
alive (its reference count says so), so reuse never changes a value anyone can still see.
"""

from __future__ import annotations

import sys
import threading
from sys import getrefcount

import numpy as np

__all__ = ["spare_int32", "WordPool", "KeptResults"]


def spare_int32(spare: list[np.ndarray], n: int) -> np.ndarray:
    """An int32 array of ``n`` words: one of ``spare`` (arrays of earlier rounds) that nobody
    references any more, taken out of the list, else a new one.

    An array of exactly ``n`` words is preferred; else the smallest one of ``n`` to ``n + n // 4``
    words serves, as its first ``n`` words (DDP buckets and pipelined segments differ in size by a
    few percent from one round to the next: a fresh array costs a page fault per 4 KiB on first
    touch, ~10% of the ranks' CPU in a 25M dense call on loopback)."""
    best = -1
    for k in range(len(spare)):
        arr = spare[k]
        # references: the spare list, ``arr`` and getrefcount's argument; a live tensor, view or
        # array made from it would add one (torch.from_numpy holds the array)
        if n <= arr.size <= n + n // 4 and sys.getrefcount(arr) <= 3:
            if arr.size == n:
                best = k
                break
            if best < 0 or arr.size < spare[best].size:
                best = k
    if best >= 0:
        arr = spare.pop(best)
        return arr if arr.size == n else arr[:n]
    return np.empty(n, dtype=np.int32)


class WordPool:
    """At most ``keep`` int32 arrays handed out earlier, reused once unreferenced (thread-safe).

    ``take(n)`` returns an uninitialised array of ``n`` words (the caller writes every word); the
    pool keeps a reference and hands it out again once every other reference is gone.  Arrays
    beyond ``keep`` are dropped oldest first (memory held: at most ``keep`` arrays)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._arrays: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> np.ndarray:
        with self._lock:
            arr = spare_int32(self._arrays, n)
            self._arrays.append(arr)
            if len(self._arrays) > self.keep:
                del self._arrays[0]
            return arr

    def clear(self) -> None:
        with self._lock:
            self._arrays.clear()


class KeptResults:
    """Result arrays of a round shape's streams (``lengths`` words each), at most ``depth`` per
    stream, each handed out again once unreferenced (not thread-safe: one port's rounds).

    :meth:`take` returns one array per stream and its address: a kept one that nobody references
    any more (no tensor, view or array made from it alive), else a new one, kept while the stream
    keeps fewer than ``depth``.  ``depth`` 2: a caller holding the last call's results while it
    makes the next call (``out = port.combine(...)`` in a loop) still finds the one before free."""

    __slots__ = ("lengths", "depth", "_arrays", "_at")

    def __init__(self, lengths: tuple[int, ...], depth: int = 2) -> None:
        self.lengths, self.depth = lengths, depth
        self._arrays: list[list[np.ndarray]] = [[] for _ in lengths]  # per stream: its kept arrays
        self._at: list[list[int]] = [[] for _ in lengths]  # ... and their addresses

    def take(self) -> tuple[list[np.ndarray], list[int]]:
        """One int32 array per stream (uninitialised: the caller writes every word) and their
        addresses; see the class docstring."""
        outs: list[np.ndarray] = []
        at: list[int] = []
        for arrays, addresses, n in zip(self._arrays, self._at, self.lengths):
            for k in range(len(arrays)):
                # references: the list and getrefcount's argument; a live tensor, view or array
                # made from it adds one (torch.from_numpy's storage holds the array)
                if getrefcount(arrays[k]) <= 2:
                    outs.append(arrays[k])
                    at.append(addresses[k])
                    break
            else:
                arr = np.empty(n, dtype=np.int32)
                address = arr.ctypes.data
                if len(arrays) < self.depth:
                    arrays.append(arr)
                    addresses.append(address)
                outs.append(arr)
                at.append(address)
        return outs, at
