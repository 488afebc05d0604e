"""A :class:`~homagg.transport.UdpSwitchPort`'s cached round set-up: one :class:`RoundPlan` per
round shape (the streams' lengths and ops), reused by every round of that shape.

Set up afresh, every round built its chunk table, a :class:`._datapath.Round` with its per-slot
arrays, and the native datapath's ctypes structures (``_Job``, ``_Chunks``, pointer arrays, counts)
and its C round loop's (``_RoundState``, ``_Slots``, ``_Bufs``): about half of a small round's
CPU.  A plan builds them once; a round then refills only what changes (:meth:`RoundPlan.run`): the
first global chunk ``seq0``, the arrays' addresses, the per-slot state.  Rounds of at most
:data:`SMALL_WORDS` words of :meth:`~homagg.transport.SwitchPort.combine_arrays` go through the
plan's own input and output arrays (a copy in and a copy out of a few KB: cheaper than taking the
addresses of the caller's arrays), so they bind no address at all (:meth:`RoundPlan.run_small`).
With the native datapath every round, ``combine``'s included, then runs the same way
(:meth:`RoundPlan._run_native`): the round's start and its C loop in one ``homagg_fp_round`` call
each (``_fastround.c``), Python taking only the RTT samples, two counts and stream 0's
verification, until anything else happens (then the general loop takes the round over from the
state C left: the same decisions).  A plan's C loop state is refilled from the port before every
round (its window and RTO: :meth:`._fastpath.NativeRound.push`), and a plan binds the caller's
arrays' addresses before every round that is not over its own arrays
(``tests/test_transport_round_shapes.py``: shapes alternating, the window cut in between).

Invariants: a round run through a plan puts the same datagrams on the wire and makes the same
decisions as one set up afresh (the protocol's state lives in the port: ``_seq``, the window, the
RTO estimator, ``_last_g``/``_last_retx``); a plan holds no reference to the caller's arrays once
its round ended, whether it completed or raised (``spare_int32`` reuses result arrays nobody
references); a port keeps at most :data:`PLANS` plans (the oldest goes first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import time
from typing import Any

import numpy as np

from .._buffers import KeptResults
from . import _fastpath as fastpath
from ._base import OwnRound, VerifyOnce
from ._datapath import PyDatapath, Round
from ._roundloop import RoundLoop, chunk_table

__all__ = ["RoundPlan", "PlanRound", "PLANS", "SMALL_WORDS", "OWN_WORDS", "KEPT_WORDS"]

#: round shapes a port keeps a plan for (a training loop repeats a few: its small calls', each
#: bucket's segments')
PLANS = 16
#: ``combine_arrays`` rounds of at most this many words copy through the plan's own arrays
SMALL_WORDS = 1 << 14
#: :meth:`~homagg.transport.SwitchPort.own_round` gives rounds of at most this many words own
#: arrays (the codec's mid-size steady calls write into them); a shape above ``SMALL_WORDS`` gets
#: two plans of its own taken in turn (``OwnRound.stable``): 2 MiB in and out each, at most
OWN_WORDS = 1 << 19
#: ``combine`` rounds of at most this many words take their result arrays from the plan's own
#: (:class:`homagg._buffers.KeptResults`, 2 per stream: at most ``PLANS * 2 * 4 * KEPT_WORDS``
#: bytes, 16 MiB, per port); larger ones share the port's spare arrays
KEPT_WORDS = 1 << 17
#: a placeholder array (a plan without own arrays binds the caller's before each round)
_NO_WORDS = np.zeros(0, dtype=np.int32)


class RoundPlan:
    """The set-up of ``port``'s rounds of streams of ``lengths`` words combined with ``ops``."""

    def __init__(self, port: Any, lengths: tuple[int, ...], ops: tuple[int, ...], twin: bool = False) -> None:
        job = port.job
        n = len(lengths)
        #: one of a large shape's two plans that the port hands out in turn: own arrays, and its own
        #: round's results stable (:attr:`~homagg.transport.OwnRound.stable`)
        self.twin = twin
        small = sum(lengths) <= SMALL_WORDS or twin
        #: the plan's own input and output arrays (small plans and own rounds' only), else None
        self.own_in = [np.zeros(k, dtype=np.int32) for k in lengths] if small else None
        self.own_out = [np.zeros(k, dtype=np.int32) for k in lengths] if small else None
        self._idle_in = self.own_in or [_NO_WORDS] * n  # what the round holds between rounds
        self._idle_out = self.own_out or [_NO_WORDS] * n
        #: ``combine``'s result arrays for rounds of this shape (small shapes only), else None
        self.kept = KeptResults(lengths) if sum(lengths) <= KEPT_WORDS else None
        #: stream names of ``combine_arrays`` rounds (errors name them)
        self.names = [f"words[{j}]" for j in range(n)]
        self.rnd = Round(job=job, rank=port.rank, seq0=port._seq, table=chunk_table(lengths, ops, job.words_per_packet),
                         srcs=self._idle_in, outs=self._idle_out, bufs=port._slotbuf, stride=port._stride)
        self.total = self.rnd.total
        self.dp: Any = (fastpath.NativeDatapath(self.rnd, port.sock.fileno(), port._scratch) if port.native
                        else PyDatapath(self.rnd, port._send_to_switch))
        self._own_bound = small  # the native datapath holds the addresses of the own arrays
        self._own_round: PlanRound | None = None

    def own_round(self, port: Any, ops: tuple[int, ...]) -> PlanRound | None:
        """The plan's own arrays as ``port``'s :class:`~homagg.transport.OwnRound` (a plan with own
        arrays of the native datapath whose streams all hold words), else None; made once."""
        if self._own_round is None and self.own_in is not None and port.native and all(a.size for a in self.own_in):
            self._own_round = PlanRound(port, self, ops)
        return self._own_round

    def run(self, port: Any, srcs: list[np.ndarray], outs: list[np.ndarray], names: Sequence[str],
            verify: Callable[[np.ndarray], None] | None, fills: list[tuple[int, int] | None] | None = None,
            at: tuple[list[int], list[int]] | None = None) -> None:
        """One round of ``port`` (from its ``_seq``) over these arrays; see the module docstring.
        ``at``: the addresses of ``srcs`` and ``outs``' words, where the caller has them (the
        native datapath binds them instead of asking numpy).  With the native datapath the round
        goes through :meth:`_run_native` (its start and its C loop in ``homagg_fp_round``) as
        :meth:`run_small`'s does; with the Python one, through :meth:`RoundLoop.run_python`."""
        rnd = self.rnd
        own = srcs is self.own_in and outs is self.own_out and fills is None
        try:
            if port.native:
                # what Round.start does in Python, less the slots and ``completed`` (C resets them)
                rnd.srcs, rnd.outs, rnd.fills = srcs, outs, rnd._no_fills if fills is None else fills
                rnd.ignored = rnd.probes = rnd.refused = 0
                self.dp.start(bind=not (own and self._own_bound), at=at)
                self._own_bound = own
                self._run_native(port, outs[0], names, verify)
            else:
                rnd.start(port._seq, srcs, outs, fills)
                loop = RoundLoop(port, rnd, self.dp, names, verify)
                try:
                    loop.run_python()
                finally:
                    loop.verify = None
        finally:
            rnd.srcs, rnd.outs, rnd.fills = self._idle_in, self._idle_out, rnd._no_fills

    def run_small(self, port: Any, verify: Callable[[np.ndarray], None] | None,
                  on_results: tuple[int, int] | None = None) -> None:
        """One round of ``port`` over the plan's own arrays (a small plan, the native datapath):
        :meth:`_run_native` with no address to bind (the own arrays stay bound); ``on_results``:
        the C loop's results hook for this round only (:meth:`OwnRound.run`)."""
        assert self.own_in is not None and self.own_out is not None
        if not self._own_bound:
            self.dp.start(bind=True)  # rnd.srcs/outs are the own arrays between rounds
            self._own_bound = True
        if on_results is None:
            self._run_native(port, self.own_out[0], self.names, verify)
            return
        self.dp.on_results(on_results)
        try:
            self._run_native(port, self.own_out[0], self.names, verify)
        finally:
            self.dp.on_results(None)

    def _run_native(self, port: Any, out0: np.ndarray, names: Sequence[str],
                    verify: Callable[[np.ndarray], None] | None) -> None:
        """One round of ``port`` whose arrays are bound (stream 0's output: ``out0``), the native
        datapath: the round's set-up and the first calls of the C loop in C (``homagg_fp_round``)
        and no Python per call beyond the RTT samples and two counts.  As soon as anything else
        happens (a retransmission, a late or foreign datagram, a window change, a timer scan, an
        error) the round goes on in :meth:`RoundLoop.run_native`, from the state the C loop left
        (the same decisions as the general loop from there on).  A ``verify`` that is an
        :class:`~homagg.transport.AgreementCheck` is judged in C: Python sees stream 0 only where
        the ranks disagree (:func:`_checked` otherwise)."""
        dp, rnd, est, stats = self.dp, self.rnd, port.rtt, port.stats
        run = dp.native_round(port, port.msock.fileno() if port.msock is not None else -1)
        seq0 = rnd.seq0 = dp._job.seq0 = port._seq
        st = run.st
        run.push(est)
        st.verify_left = rnd.n0 if verify is not None else 0
        agree = getattr(verify, "agree_words", 0)  # an AgreementCheck (or a VerifyOnce of one): C checks it
        st.agree_words = agree if 0 < 2 * agree <= out0.size else 0
        st.agreed = 0
        samples = st.samples  # a view of the C state's array (one ctypes object per round, not per sample)
        rc = run.call(1)
        while not st.rare:  # only packets, results and RTT samples so far: Python's part is these
            n = st.nsamples
            if n:
                est.take(samples[:n])
                st.nsamples = 0
            stats["packets"] += st.packets
            stats["results"] += st.results
            st.packets = st.results = 0
            if rc == run.VERIFY:
                try:
                    verify(out0.copy())  # type: ignore[misc]
                except BaseException:
                    port._seq = seq0 + self.total
                    port._sync_rtt_stats()
                    raise
                if st.done >= self.total:
                    rc = run.DONE
            if rc == run.DONE:
                if st.agreed:
                    _checked(verify, stats)
                port._seq = seq0 + self.total
                stats["gso"] = port._scratch.gso.value
                port._sync_rtt_stats()
                return
            if rc == run.SCAN:
                now = time.monotonic()
                if now >= st.next_scan or now - st.last_progress > port.timeout:
                    break  # the timer scan's turn: the general loop's
            elif rc != run.VERIFY:
                break  # an error: the general loop raises it
            st.rto = est.rto
            rc = run.call(0)
        loop = RoundLoop(port, rnd, dp, names, verify)  # the general loop takes the round over
        loop.next_scan = st.next_scan
        run.loop = loop
        try:
            loop.run_native(run, run.pull(est, rc))
        finally:
            loop.verify = None
        if st.agreed:
            _checked(verify, stats)


def _checked(verify: Any, stats: dict[str, int]) -> None:
    """The C loop found stream 0's words in agreement (``AgreementCheck``): that is the verifier's
    call of this round (a :class:`~homagg.transport.VerifyOnce` remembers it; the port's stats
    count it as ``agreements``)."""
    stats["agreements"] += 1
    if isinstance(verify, VerifyOnce):
        verify.called = True


class PlanRound(OwnRound):
    """A small :class:`RoundPlan`'s own arrays as its port's :class:`~homagg.transport.OwnRound`:
    :meth:`run` is ``combine_arrays`` less its copy in (the caller wrote :attr:`ins`), its checks
    (the plan's shape is the arrays') and its copies out."""

    def __init__(self, port: Any, plan: RoundPlan, ops: tuple[int, ...]) -> None:
        assert plan.own_in is not None and plan.own_out is not None
        self.port, self.plan, self.ops = port, plan, ops
        self.ins: list[np.ndarray] = plan.own_in
        self._outs: list[np.ndarray] = plan.own_out
        self.kept: dict[Any, Any] = {}
        self.stable = plan.twin

    def run(self, verify: Callable[[np.ndarray], None] | None = None,
            on_results: tuple[int, int] | None = None) -> list[np.ndarray]:
        port = self.port
        port.stats["rounds"] += 1
        self.plan.run_small(port, verify, on_results)
        return self._outs
