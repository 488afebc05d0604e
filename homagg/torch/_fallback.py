"""The switch as an accelerator, not a single point of failure: a port that falls back to the host path.

A homagg process group sends every round through :class:`PathPort`.  On the switch path it is
the group's UDP port; when the switch fails (killed, restarted, unreachable, the job's admission
lost: the port raises :class:`~homagg.TransportError`), every rank agrees over the group's private
gloo group on how far each got, completes the failed round the same way, and the group continues on
the *host path*: the same codec, its rounds combined by :class:`~homagg.transport.GlooSwitchPort`
(words ADDed/ORed/MAXed by gloo), so a call's result is bit-identical whichever path carried it.
While on the host path, rank 0 probes the switch; when it answers, every rank re-admits the job
(new job, token and slots), runs a canary round on it, and the group returns to the switch at a call
boundary all ranks agree on (when and how often: :mod:`._comeback`).

State machine (every rank passes the same transitions at the same round/call)::

    switch --(a round fails on some rank: agreement, recovery)--> host
    host   --(call boundary, rank 0's probe answered, every rank re-registered,
              the canary round right on every rank)--> switch
    host   --(``return_attempts`` failed returns in a row)--> host for the group's life

Agreement.  Every rank counts the rounds it completed (``rounds``; the codec makes every rank run
the same rounds in the same order).  A round completes at a rank only when every rank sent its
words, and a rank sends round ``n + 1`` only after round ``n`` completed at it; so when the switch
fails, the ranks' counts differ by at most one.  The agreement (an allgather over gloo) then says:

* some ranks completed round ``m + 1`` and others did not: the first of those that did broadcasts
  that round's combined words, which it still holds (:attr:`PathPort.last`: the result arrays of
  its last round, kept referenced, never copied, until its next round completes), to the others;
* nobody completed it: every rank redoes it on the host path from the words it was sending.

Then every rank continues on the host path; a rank that was already one round further redoes that
round on the host path, where the others arrive after their protocol consumed round ``m + 1``.
Nothing is summed twice (each round is combined exactly once per rank) and nothing is lost.

Headers.  A rank that finished a call on the switch may go on to a gloo operation (broadcast,
barrier) while another rank still waits for that call's last round: before the first gloo
operation after switch rounds each rank runs the same agreement (:meth:`PathPort.before_gloo_op`)
with nothing failed, so a waiting rank's agreement and the finished rank's header are the same
collective (an allgather of every rank's state, rounds and calls).  Where every rank was in it with
nothing failed, each entered it as the header of the same operation: a barrier is then that
collective alone (the group skips gloo's); where a rank failed, that rank joined from inside its
call and meets the others' barrier later, on gloo.

Closing.  A rank that finished the last call on the switch may close the group while another still
waits for that call's last result.  :meth:`PathPort.close` runs the same agreement first, bounded by
the switch's progress timeout plus a margin (the longest the waiting rank takes to find the switch
failed), so the waiting rank gets the result from the others before they exit.

Policy: ``fallback="error"`` keeps the old behaviour (the port's error reaches the caller, the group
is unusable).  Errors a fallback cannot fix still surface: a peer that died (the agreement's gloo
collective fails), ranks out of step (:class:`~homagg.RankMismatchError` is not a transport error),
bad input; a peer known dead (:class:`~homagg.RankTimeoutError` from the port: its presence
socket is closed) reaches the caller as it is, without a fallback.

Invariants: every rank's result of every round is the same combination of every rank's words, on
either path; every rank leaves each call on the same path; every wait is bounded (the switch port's
timeout, then gloo's, then the store's).
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from .._errors import HomAggError, PathWarning, ProtocolError, RankTimeoutError, TransportError
from ..codec import WorkerStats
from ..transport import CombineOp, GlooSwitchPort, OwnRound, Stream, SwitchPort, transport_error
from ._comeback import GIVE_UP, TRY, ReturnSchedule, canary
from ._link import SwitchLink, close_quietly
from ._path_round import PathRounds, arrays_round

__all__ = ["PathPort"]

_OK, _FAILED, _ABORTED = 0, 1, 2  # a rank's state in the agreement
#: the agreement at close waits this long past the switch's progress timeout for a rank still in the last round
_CLOSE_SLACK_S = 5.0
#: bound on waiting for failed links' closes at :meth:`PathPort.close` (each is bounded itself: the store
#: count of closed ports, a connect to the switch, an emulator's stop)
_CLOSE_JOIN_S = 20.0


class PathPort(SwitchPort):
    """One rank's rounds, on the switch or on the host path (see the module docstring).

    ``open_link(epoch)`` opens a new switch link for the group (collective: rank 0 admits a job,
    every rank registers); ``probe()`` (rank 0) says whether the switch answers again;
    ``return_attempts``: failed returns in a row after which the group stays on the host path
    (:mod:`._comeback`); ``timeout_s``: gloo's bound; ``switch_timeout_s``: the switch port's
    progress timeout (bounds the agreement at :meth:`close`).
    """

    def __init__(self, link: SwitchLink, gloo: dist.ProcessGroup, rank: int, world_size: int, *,
                 stats: WorkerStats, policy: str, timeout_s: float, probe_interval_s: float,
                 open_link: Callable[[int], SwitchLink], probe: Callable[[], bool],
                 switch_timeout_s: float = 30.0, return_attempts: int = 3) -> None:
        self.rank, self.world_size = rank, world_size
        #: the link in use: the switch's, or on the host path one of kind ``host`` over the
        #: group's gloo host path (never a failed, closed link)
        self.link: SwitchLink = link
        self.path = "switch"
        self.policy = policy
        self.stats = stats
        #: the last switch round's combined words (see above): tensors, or a host-array round's arrays
        self.last: list[torch.Tensor | np.ndarray] | None = None
        self.rounds = 0  #: rounds completed, on either path (the same count on every rank)
        self.epoch = 0  #: switch links opened after the first
        self._gloo = gloo
        self._host = GlooSwitchPort(gloo, rank, world_size, timeout_s=timeout_s)
        self._timeout_s = timeout_s
        self._close_wait_s = min(timeout_s, switch_timeout_s + _CLOSE_SLACK_S)
        self._open_link = open_link
        self._returns = ReturnSchedule(probe_interval_s, return_attempts, probe)
        self._on_host_for_good = False  # the schedule gave up returning
        self._dirty = False  # switch rounds since the last agreement
        self._call_host = False  # the current call used the host path
        self._calls = 0  # calls started (at_call_boundary)
        self._sync_from = 0  # the first call whose boundary syncs on the host path
        self._fallback_at = 0.0
        self._host_link = SwitchLink(self._host, "host")  # what :attr:`link` is on the host path
        self._closing: list[threading.Thread] = []  # closes of failed links, joined by close()
        self._own_rounds = PathRounds(self)  # own_round's last wrappers

    # ------------------------------------------------------------------ rounds
    def combine(self, streams: Sequence[Stream]) -> list[torch.Tensor]:
        return self._round(lambda port: port.combine(streams), lambda: streams, lambda out: out)

    def combine_arrays(self, ops: Sequence[CombineOp], words: Sequence[np.ndarray],
                       verify: Callable[[np.ndarray], None] | None = None) -> list[np.ndarray]:
        """:meth:`combine` of host arrays (the small path): the same paths and fallback; ``verify`` runs once."""
        return arrays_round(self, lambda port, once: port.combine_arrays(ops, words, once), ops, lambda: words, verify,
                            list)  # as tensors only if a recovery broadcasts them (see _recover)

    def own_round(self, ops: tuple[CombineOp, ...], lengths: tuple[int, ...]) -> OwnRound | None:
        """:meth:`SwitchPort.own_round` on the switch path: the link's port's, run through this
        port's rounds (:class:`~homagg.torch._path_round.PathRound`; the last two are kept)."""
        inner = self.link.port.own_round(ops, lengths) if self.path != "host" else None
        if inner is None:
            return None
        return self._own_rounds.of(inner)

    def patient(self, timeout_s: float) -> contextlib.AbstractContextManager[None]:
        """:meth:`SwitchPort.patient` of the switch's port (gloo's waits are the group's already)."""
        return self.link.port.patient(timeout_s) if self.path == "switch" else contextlib.nullcontext()

    def _round(self, run: Callable[[SwitchPort], list[Any]], streams: Callable[[], Sequence[Stream]],
               as_tensors: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """``run(port)`` on the path in use; on the switch, a transport error falls back with the round
        as ``streams()``; a switch round's results, ``as_tensors``, are :attr:`last`."""
        if self.path == "host":
            self._call_host = True
            out = run(self._host)
            self.rounds += 1
            return out
        t0 = time.monotonic()
        try:
            out = run(self.link.port)
        except TransportError as exc:
            if self.policy == "error" or isinstance(exc, RankTimeoutError):  # a peer died: no path helps
                raise
            return self._fall_back(streams(), exc, time.monotonic() - t0)
        self.rounds += 1
        self.last = as_tensors(out)
        self._dirty = True
        return out

    def _fall_back(self, streams: Sequence[Stream], exc: TransportError, detect_s: float) -> list[torch.Tensor]:
        t0 = time.monotonic()
        table = self._agree(_FAILED)
        aborted = _ranks_in(table, _ABORTED)
        if aborted:  # the switch is fine: a rank left the call with its own error (e.g. NaN input)
            exc.add_note(f"homagg: rank(s) {aborted} failed this call with an error of their own (see their logs); "
                         "no fallback")
            raise exc
        out = self._recover(table, streams)
        assert out is not None  # this rank failed: _recover completed its round
        self.rounds += 1
        self._to_host(f"rank {self.rank}: {exc}", detect_s, time.monotonic() - t0)
        return out

    def before_gloo_op(self) -> bool:
        """Header of a gloo operation on the worker: after switch rounds, agree that nobody still
        waits for one (a waiting rank's agreement is this same collective).  Returns whether the
        agreement ran and every rank was in it with nothing failed: then each rank entered it as the
        header of this same operation, and no rank left it before all had entered (a barrier needs
        nothing more).  Where a rank failed, it joined from inside its call: not this operation."""
        if self.path != "switch" or not self._dirty or self.policy == "error":
            return False
        t0 = time.monotonic()
        table = self._agree(_OK)
        self._dirty = False
        aborted = _ranks_in(table, _ABORTED)
        if aborted:
            raise TransportError(f"homagg rank {self.rank}: rank(s) {aborted} failed the last call with an error of "
                                 "their own (see their logs); the group is out of step")
        failed = _ranks_in(table, _FAILED)
        if failed:
            self._recover(table, None)
            self._to_host(f"ranks {failed} lost the switch", 0.0, time.monotonic() - t0)
            return False
        return True

    def abort(self, exc: BaseException) -> None:
        """This rank leaves the current call with an error a fallback cannot fix (non-finite input,
        ranks out of step...).  Ranks still waiting for its words at the switch fall back at their
        timeout and meet this agreement, which tells them to raise instead (their error names
        this rank); errors of the agreement itself are dropped (``exc`` is what the caller raises)."""
        if self.policy == "error" or self.path != "switch":
            return
        try:
            self._agree(_ABORTED)
        except HomAggError:
            pass
        self._dirty = False

    # ------------------------------------------------------------------ agreement
    def _agree(self, state: int, bound_s: float | None = None) -> list[tuple[int, int]]:
        """Every rank's (state, rounds completed): an allgather over the private gloo group.

        It also carries each rank's call count: the first call boundary that syncs on the host path
        (:meth:`at_call_boundary`) is the first call that no rank had started at the agreement, so
        a rank that fell back inside call ``c`` and one that fell back inside call ``c + 1`` sync
        at the same boundary."""
        mine = torch.tensor([state, self.rounds, self._calls], dtype=torch.int64)
        rows = [torch.empty(3, dtype=torch.int64) for _ in range(self.world_size)]
        opts = AllgatherOptions()
        if bound_s is not None:
            opts.timeout = timedelta(seconds=bound_s)
        # one exchange of every rank's row (an allgather: W - 1 steps where an allreduce takes twice that)
        self._gloo_call("agreement on the switch failure", lambda: self._gloo.allgather([rows], [mine], opts), bound_s)
        table = torch.stack(rows).tolist()
        self._sync_from = max(calls for _, _, calls in table) + 1
        return [(s, n) for s, n, _ in table]

    def _recover(self, table: list[tuple[int, int]], streams: Sequence[Stream] | None) -> list[torch.Tensor] | None:
        """Complete the round the ranks that failed were in; return this rank's result of it (None
        when this rank was not in it).  ``streams``: this rank's words of that round, if it failed."""
        counts = [n for _, n in table]
        low, high = min(counts), max(counts)
        if high - low > 1 or any(state == _OK and n != high for state, n in table):
            raise ProtocolError(f"homagg: ranks out of step when the switch failed (state, rounds): {table}")
        behind = counts[self.rank] == low and high > low
        if high == low:  # nobody holds the round: everyone redoes it on the host path
            if streams is None:
                raise ProtocolError(f"homagg: rank {self.rank} holds no round to redo: {table}")
            return self._host.combine(streams)
        source = counts.index(high)
        if behind:
            if streams is None:
                raise ProtocolError(f"homagg: rank {self.rank} is behind without a round: {table}")
            lengths, devices = [s.length for s in streams], [s.device for s in streams]
            buf = torch.empty(sum(lengths), dtype=torch.int32)
        else:
            held = [torch.from_numpy(t) if isinstance(t, np.ndarray) else t for t in self.last or []]
            lengths, devices = [t.numel() for t in held], [t.device for t in held]
            buf = (torch.cat([t.detach().cpu().view(-1) for t in held]) if held
                   else torch.empty(0, dtype=torch.int32))
        opts = dist.BroadcastOptions()
        opts.rootRank = source
        self._gloo_call(f"rank {source}'s words of round {high}", lambda: self._gloo.broadcast([buf], opts))
        out = [part.to(dev) for part, dev in zip(torch.split(buf, lengths), devices, strict=True)]
        if not behind:  # a rank one round further redoes its own round (if any) on the host path
            return self._host.combine(streams) if streams is not None else None
        return out

    def _allreduce(self, t: torch.Tensor, op: Any, what: str, bound_s: float | None = None) -> None:
        """``t`` reduced over the private gloo group, within gloo's timeout or ``bound_s``."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        if bound_s is not None:
            opts.timeout = timedelta(seconds=bound_s)
        self._gloo_call(what, lambda: self._gloo.allreduce([t], opts), bound_s)

    def _gloo_call(self, what: str, call: Callable[[], Any], bound_s: float | None = None) -> None:
        t0 = time.monotonic()
        try:
            call().wait()
        except RuntimeError as exc:  # a peer died, or gloo's timeout
            raise transport_error(exc, f"homagg rank {self.rank}: {what} (host path)",
                                  timeout_s=bound_s or self._timeout_s, waited_s=time.monotonic() - t0) from exc

    # ------------------------------------------------------------------ transitions
    def _to_host(self, cause: str, detect_s: float, agree_s: float) -> None:
        dead, self.path = self.link, "host"
        self.link = self._host_link  # never the failed link: that one is being closed
        self.last, self._dirty, self._call_host = None, False, True
        self._fallback_at = time.monotonic()
        self._returns.fell_back(self._fallback_at, cause)  # in the first call after a return: it failed
        self.stats.transitions.append({"at_call": self._calls, "from": "switch", "to": "host", "cause": cause,
                                       "detect_s": round(detect_s, 4), "agree_s": round(agree_s, 4)})
        warnings.warn(f"homagg: the switch failed ({cause}); rank {self.rank} continues on the host path "
                      "(gloo), probing the switch", PathWarning, stacklevel=2)
        self._closing.append(close_quietly(dead))

    def at_call_boundary(self) -> None:
        """Before each call: on the host path, go back to the switch when rank 0's schedule says
        try, the probe found it, every rank re-registered and the canary round came back right on
        every rank (each decision is a collective: the same on every rank); or stay on the host
        path for good once the schedule gives up (:mod:`._comeback`)."""
        self._calls += 1
        self._call_host = self.path == "host"
        if self.path != "host" or self._on_host_for_good or self._calls < self._sync_from:
            return
        verdict = torch.zeros(1, dtype=torch.int64)
        if self.rank == 0:
            verdict[0] = self._returns.verdict(time.monotonic())
        self._allreduce(verdict, dist.ReduceOp.MAX, "the switch probe's verdict")
        if verdict[0] == TRY:
            self._try_return()
        elif verdict[0] == GIVE_UP:
            self._give_up()
        self._call_host = self.path == "host"

    def _try_return(self) -> None:
        t0 = time.monotonic()
        self.epoch += 1
        link: SwitchLink | None = None
        why = ""
        try:
            link = self._open_link(self.epoch)
        except HomAggError as exc:
            why = f"re-admission failed: {exc}"
        ok = torch.tensor([int(link is not None)], dtype=torch.int64)
        self._allreduce(ok, dist.ReduceOp.MIN, "re-admission to the switch")
        if ok[0]:
            assert link is not None
            why = canary(link.port, self.rank, self.world_size) or ""
            ok[0] = int(not why)
            self._allreduce(ok, dist.ReduceOp.MIN, "the canary round's verdict")
        if not ok[0]:
            if link is not None:
                self._closing.append(close_quietly(link))
            why = why or "re-admission or the canary round failed on another rank"
            self._returns.failed(time.monotonic(), why)
            self.stats.transitions.append({"at_call": self._calls, "from": "host", "to": "host", "cause": why,
                                           "readmit_s": round(time.monotonic() - t0, 4)})
            return
        assert link is not None
        self.link, self.path, self._dirty = link, "switch", False
        self._returns.returned(time.monotonic())
        readmit_s = time.monotonic() - t0
        self.stats.transitions.append({"at_call": self._calls, "from": "host", "to": "switch",
                                       "cause": f"switch answers again (job {link.job_id})",
                                       "readmit_s": round(readmit_s, 4),
                                       "host_s": round(time.monotonic() - self._fallback_at, 4)})
        warnings.warn(f"homagg: the switch answers again; rank {self.rank} is back on it (job {link.job_id}, "
                      f"re-admitted and checked in {readmit_s:.3f}s)", PathWarning, stacklevel=2)

    def _give_up(self) -> None:
        self._on_host_for_good = True
        attempts, failures = self._returns.attempts, self._returns.failures
        cause = (f"{failures} returns to the switch failed in a row (last: {self._returns.last_failure})"
                 if attempts else "returns to the switch are off")
        self.stats.transitions.append({"at_call": self._calls, "from": "host", "to": "host",
                                       "cause": f"staying on the host path: {cause}", "gave_up": True})
        warnings.warn(f"homagg: rank {self.rank} stays on the host path for the rest of this group's life: {cause} "
                      f"(return_attempts={attempts}, HOMAGG_RETURN_ATTEMPTS)", PathWarning, stacklevel=2)

    def end_call(self) -> None:
        """Count the call that just completed under the path that completed it."""
        self.stats.paths["host" if self._call_host else "switch"] += 1
        if not self._call_host:
            self._returns.served()

    def close(self) -> None:
        """Release the host path and the link in use; wait (bounded) for failed links' closes.

        After switch rounds, first the agreement every gloo operation starts with
        (:meth:`before_gloo_op`), bounded by the switch's progress timeout plus a margin: a rank
        still waiting for the last call's result (it reached the others, then the switch died)
        meets it when it finds the switch failed, and gets that result from the others."""
        try:
            self._settle_last_round()
        finally:
            self._release()

    def _settle_last_round(self) -> None:
        if self.path != "switch" or not self._dirty or self.policy == "error":
            return
        self._dirty = False
        try:
            table = self._agree(_OK, self._close_wait_s)
            if _ranks_in(table, _FAILED):
                self._recover(table, None)
        except HomAggError as exc:
            warnings.warn(f"homagg rank {self.rank}: closing, could not confirm that every rank got the last "
                          f"call's result ({exc})", RuntimeWarning, stacklevel=3)

    def _release(self) -> None:
        self.last = None
        self._host.close()
        self.link.close()
        deadline = time.monotonic() + _CLOSE_JOIN_S
        for thread in self._closing:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._closing.clear()


def _ranks_in(table: list[tuple[int, int]], state: int) -> list[int]:
    """The ranks whose agreement row has ``state``."""
    return [r for r, (s, _) in enumerate(table) if s == state]
