"""Creating a homagg process group: its two gloo groups within the creation deadline, and the one
error a failed creation raises.

gloo's ``ProcessGroupGloo`` constructor waits up to its timeout for each peer's address in the
store, then up to *five times* that timeout for each peer's connection (gloo's ``Pair`` waits
``5 * timeout`` for the initial connect).  A rank whose peer gave up half-way (its store died with
group rank 0 while it still read addresses) sat in the constructor for five group timeouts (100 s
for 20 s), far past the group's creation deadline, and then failed with an untyped connect timeout.
The constructor cannot be given a shorter timeout instead: gloo keeps it for its pairs, whose
receives in torch's collectives then time out early (a 220 MB DDP broadcast at 100 Mbit/s did).
So:

* every rank first arrives at a store barrier (:data:`ARRIVED_KEY`, bounded by the deadline), so
  that ranks reaching the group at different times are absorbed there (naming the ranks that did
  not come; failing at once when the store is gone), not by gloo's own waits;
* each gloo group is constructed with the group timeout, in a thread (the constructor releases
  the GIL) that this rank watches: it stops waiting, with one typed error, at the creation
  deadline, as soon as a peer reports a failed creation (:func:`creation_error` posts it), or as
  soon as the store is unreachable.  An abandoned constructor finishes or fails on its own, in the
  background, within gloo's bound.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed import PrefixStore

from .._errors import ConfigError, GroupCreationError, RankTimeoutError, TransportError
from ._switch_setup import absent_ranks, await_ranks, report_failure

__all__ = ["ARRIVED_KEY", "READY_KEY", "arrive", "gloo_group", "creation_error"]

ARRIVED_KEY = "homagg/arrived"  # creation barrier: every rank entered creation (before gloo)
READY_KEY = "homagg/ready"  # creation barrier: every rank registered with the switch
_POLL_S = 0.2  #: how often a rank waiting for a gloo group's connect looks at the store


def arrive(store: dist.Store, rank: int, size: int, deadline: float) -> None:
    """Wait (until ``deadline``, monotonic) for every rank of the group to enter its creation."""
    await_ranks(store, ARRIVED_KEY, rank, size, max(deadline - time.monotonic(), 0.0),
                "group creation (every rank entering it)")


def gloo_group(
    store: dist.Store, prefix: str, rank: int, size: int, timeout: timedelta, deadline: float, what: str
) -> dist.ProcessGroupGloo:
    """A gloo group over ``PrefixStore(prefix, store)`` with ``timeout``, connected before ``deadline``
    (monotonic) unless a peer failed or the store went away first (each raises, naming it)."""
    if deadline - time.monotonic() <= 0:
        raise RankTimeoutError(f"homagg: no time left to connect the {what} gloo group "
                               f"(group-creation deadline of {timeout.total_seconds():.1f}s passed)", ())
    done: dict[str, Any] = {}

    def build() -> None:
        try:
            done["group"] = dist.ProcessGroupGloo(PrefixStore(prefix, store), rank, size, timeout)
        except BaseException as exc:  # noqa: BLE001 - handed to the creating thread
            done["error"] = exc

    t0 = time.monotonic()
    connect = threading.Thread(target=build, name=f"homagg-{what}-gloo-connect", daemon=True)
    connect.start()
    while connect.is_alive():
        connect.join(_POLL_S)
        if not connect.is_alive():
            break
        _check_peers(store, what, deadline, timeout, t0)
    if "error" in done:
        exc = done["error"]
        text = str(exc).split("\nException raised from", 1)[0][:300]  # torch appends C++ frames
        raise TransportError(f"homagg: the {what} gloo group did not connect ({time.monotonic() - t0:.1f}s spent; "
                             f"a peer gave up, died, or lost the store): {text}") from exc
    return done["group"]


def _check_peers(store: dist.Store, what: str, deadline: float, timeout: timedelta, t0: float) -> None:
    """While a gloo group connects: raise if the deadline passed, a peer posted a failed creation,
    or the store is unreachable."""
    spent = f"{time.monotonic() - t0:.1f}s"
    if time.monotonic() >= deadline:
        raise RankTimeoutError(f"homagg: the {what} gloo group did not connect within the group-creation "
                               f"deadline ({timeout.total_seconds():.1f}s; {spent} in gloo's connect)", ())
    try:
        failed = store.check([f"{READY_KEY}/failed"])
    except RuntimeError as exc:
        raise TransportError(f"homagg: the rendezvous store became unreachable while the {what} gloo group "
                             f"connected ({spent}; the process hosting it may have died): {exc}") from exc
    if failed:
        raise TransportError(f"homagg: a peer's group creation failed while the {what} gloo group connected "
                             f"({spent} in gloo's connect)")


def creation_error(exc: BaseException, store: dist.Store, rank: int, size: int, group_id: str) -> BaseException:
    """The one error a failed group creation raises on this rank (``exc`` itself for config errors).

    Tells the ranks still waiting in the creation barrier (they fail at once, naming this rank).
    """
    if not isinstance(exc, Exception):
        return exc  # KeyboardInterrupt, SystemExit
    report_failure(store, READY_KEY, rank, f"{type(exc).__name__}: {str(exc)[:300]}")
    if isinstance(exc, ConfigError):
        return exc
    try:
        missing = [r for r in absent_ranks(store, READY_KEY, size) if r != rank]
        where = ""
    except RuntimeError:
        missing = []
        where = "; the rendezvous store is unreachable (the process hosting it may have died)"
    named = tuple(missing or getattr(exc, "ranks", ()))  # rank 0 is among them if it never got there
    who = f"; rank(s) {', '.join(map(str, named))} had not finished registering" if named else ""
    text = str(exc).split("\nException raised from", 1)[0][:400]  # torch appends C++ frames
    return GroupCreationError(
        f"homagg: creating process group {group_id or '0'} failed on rank {rank} of {size}{who}{where}: "
        f"{type(exc).__name__}: {text}", named)
