"""Creating a homagg process group: its two gloo groups within the creation deadline, and the one
error a failed creation raises.

gloo's ``ProcessGroupGloo`` constructor waits up to its timeout for each peer's address in the
store, then up to *five times* that timeout for each peer's connection (gloo's ``Pair`` waits
``5 * timeout`` for the initial connect).  Constructed with the group timeout, a rank whose peer
gave up half-way (its store died with group rank 0 while it still read addresses) sat in the
constructor for five group timeouts (100 s for 20 s), far past the group's creation deadline, and
then failed with an untyped connect timeout.  So:

* every rank first arrives at a store barrier (:data:`ARRIVED_KEY`, bounded by the deadline), so
  that ranks reaching the group at different times are absorbed there (naming the ranks that did
  not come; failing at once when the store is gone), not by gloo's own waits;
* each gloo group is then constructed with the timeout ``remaining / 12`` (remaining: until the
  deadline, the group timeout after creation began): its worst case, one address wait plus one
  connect wait (6 x), is half of what remains;
* once connected, the gloo group gets the group timeout back (``_set_default_timeout``: its
  options and its contexts), which it uses for every op, as before.  (gloo's pairs keep the
  connect timeout, which they use only in gloo's sync mode and for bound buffers: torch uses neither.)

With ``TORCH_GLOO_LAZY_INIT`` gloo connects at the first op instead: the group timeout is kept then.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import PrefixStore

from .._errors import ConfigError, GroupCreationError, RankTimeoutError, TransportError
from ._switch_setup import absent_ranks, await_ranks, report_failure

__all__ = ["ARRIVED_KEY", "READY_KEY", "arrive", "gloo_group", "creation_error"]

ARRIVED_KEY = "homagg/arrived"  # creation barrier: every rank entered creation (before gloo)
READY_KEY = "homagg/ready"  # creation barrier: every rank registered with the switch
#: a gloo group connects with the timeout ``remaining / GLOO_SHARE``: gloo's waits for a peer that
#: gave up (1x for its address, 5x for its connection) then end within half of what remains
GLOO_SHARE = 12.0


def arrive(store: dist.Store, rank: int, size: int, deadline: float) -> None:
    """Wait (until ``deadline``, monotonic) for every rank of the group to enter its creation."""
    await_ranks(store, ARRIVED_KEY, rank, size, max(deadline - time.monotonic(), 0.0),
                "group creation (every rank entering it)")


def gloo_group(
    store: dist.Store, prefix: str, rank: int, size: int, timeout: timedelta, deadline: float, what: str
) -> dist.ProcessGroupGloo:
    """A gloo group over ``PrefixStore(prefix, store)`` connected before ``deadline``, with ``timeout`` for its ops."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise RankTimeoutError(f"homagg: no time left to connect the {what} gloo group "
                               f"(group-creation deadline of {timeout.total_seconds():.1f}s passed)", ())
    lazy = os.environ.get("TORCH_GLOO_LAZY_INIT", "0") not in ("", "0")
    connect = timeout if lazy else min(timeout, timedelta(seconds=max(remaining / GLOO_SHARE, 0.001)))
    t0 = time.monotonic()
    try:
        group = dist.ProcessGroupGloo(PrefixStore(prefix, store), rank, size, connect)
    except RuntimeError as exc:
        text = str(exc).split("\nException raised from", 1)[0][:300]  # torch appends C++ frames
        raise TransportError(
            f"homagg: the {what} gloo group did not connect (gloo timeout {connect.total_seconds():.2f}s, "
            f"{time.monotonic() - t0:.1f}s spent; a peer gave up, died, or lost the store): {text}") from exc
    if connect != timeout:
        group._set_default_timeout(timeout)  # its ops wait the group timeout, as without this bound
    return group


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
