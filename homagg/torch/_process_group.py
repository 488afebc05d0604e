"""``ProcessGroupHomagg``: the ``torch.distributed`` process group named ``homagg``.

A thin adapter.  Float SUM/AVG and int32/int64 SUM allreduces of dense and sparse COO tensors go
through the homagg codec (:func:`homagg.allreduce`) and the group's switch port (a sparse result
is a coalesced COO tensor copied into the input, as gloo does: DDP's ``sparse=True`` embedding
gradients take this path); a small synchronous MAX/MIN through the switch's MAX
(:mod:`homagg.codec._extremum`) and the barrier as one switch round (:mod:`homagg.codec._barrier`,
patient with a late rank, a dead one named by its closed presence socket: :mod:`._presence`;
these tasks: :mod:`._switch_calls`); broadcast, allgather, ``all_gather_single``
(``all_gather_into_tensor``) and every other allreduce (PRODUCT/BAND..., other dtypes, sizes and
layouts) run on a private gloo group.  All of
these run on the group's :class:`~homagg.torch._work.FifoWorker`, in call order on every rank;
a small synchronous codec allreduce issued outside backward runs in the caller's thread instead
when the worker is idle, holding the worker's order (:mod:`._routing`: the hand-off and wake-up
cost more than such a call).
Every other op (reduce, gather, scatter, all_to_all, send/recv, reduce_scatter, coalesced ops)
runs in the caller's thread on a *second* gloo group, the delegate (two gloo groups keep the
worker thread's calls and the caller thread's calls from interleaving differently on different
ranks); :meth:`monitored_barrier` is a store barrier that names the ranks that did not arrive.

GIL invariant (the deadlock of issue 13): no thread may hold the GIL while it waits for one of
gloo's locks, because gloo's threads free finished work under its queue lock, and freeing a
tensor that has a Python object takes the GIL.  torch's C++ trampoline for a Python
``ProcessGroup`` subclass holds the GIL while it calls an op the subclass does not define
(``allreduce_coalesced``, ``all_to_all_single``, ``reduce_scatter``...: gloo's ``enqueue`` then
blocks on that lock with the GIL held).  So this class defines *every* op in Python: delegated
ops call a plain C++ ``ProcessGroup`` that has the delegate as its only backend, whose bindings
release the GIL before entering gloo, as the calls of the private gloo group do (the worker's,
and :class:`~homagg.torch._fallback.PathPort`'s in a task run inline in the caller's thread:
``ProcessGroupGloo``'s ops and ``Work.wait`` are bound with the GIL released).

Creation is symmetric: a group exists only when every rank has registered with the switch (a
store barrier, bounded by the group timeout); both gloo groups connect within the group timeout
from the start of creation (:mod:`._creation`: gloo's own waits are 5x its timeout).  Any failure
while creating it (a peer died, the store or the switch went away) raises one
:class:`~homagg.GroupCreationError` naming the ranks that had not finished;
:class:`~homagg.ConfigError` (options differ) is raised unchanged.

Errors: the first failed collective makes the group unusable (ranks may be out of step): later
collectives raise that same typed error at once.  Collectives issued during backward (DDP) are
checked by a final autograd callback (:mod:`._backward_guard`) so that ``loss.backward()`` raises
the typed homagg error rather than the RuntimeError a C++ future would make of it.

Invariants: after :meth:`shutdown` no thread of this group is alive (bounded join), the switch port
and both gloo groups are released, and later collectives raise :class:`~homagg.TransportError`.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.distributed_c10d import AllgatherOptions  # not re-exported by torch.distributed

from .._errors import InputError, TransportError
from ..transport import transport_error
from ._backward_guard import BackwardGuard
from ._config import BackendConfig
from ._creation import READY_KEY, arrive, creation_error, gloo_group
from ._fallback import PathPort
from ._presence import Presence
from ._ops import DELEGATED_OPS, as_options, delegated, reduce_op
from ._routing import (CODEC_FLOAT_DTYPES, CODEC_INT_DTYPES, SmallCalls, codec_takes, extremum_call, runs_inline,
                       small_call, sync_outside_backward)
from ._switch_calls import SwitchCalls
from ._switch_setup import SwitchLink, await_ranks, open_switch, probe_switch, reopen_switch
from ._work import CompletedWork, FifoWorker, HomaggWork, TaskResult

__all__ = ["ProcessGroupHomagg", "CODEC_FLOAT_DTYPES", "CODEC_INT_DTYPES"]

_LIVE: weakref.WeakSet[ProcessGroupHomagg] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_GLOO = ProcessGroup.BackendType.GLOO
class ProcessGroupHomagg(SwitchCalls, ProcessGroup):
    """The ``homagg`` backend; created by ``init_process_group("homagg")`` / ``new_group``."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        config: BackendConfig,
        group_id: str = "",
    ) -> None:
        super().__init__(rank, size)
        from .. import codec  # imported here, not at module import (entry-point safety)
        from ..codec import _barrier, _extremum

        self._allreduce_fn = codec.allreduce
        self._extremum_fn, self._extremum_takes = _extremum.allreduce, _extremum.takes
        self._barrier_fn = _barrier.barrier
        self._codec = codec.CodecConfig.from_options(dict(config.codec))
        self._small = SmallCalls(config.scheme, self._codec, size)  # small calls' straight route
        #: what this rank's codec allreduces sent: bytes per stream, rounds, redos (accumulates)
        self.stats = codec.WorkerStats()
        #: what earlier allreduces agreed (exponents, union sizes), keyed by numel and dtype: a
        #: tensor of a size seen before (a DDP bucket) takes one round instead of two or three
        self.history = codec.History()
        #: gradient compression (``compress`` option / HOMAGG_COMPRESS; None: exact), applied to float
        #: allreduces issued during backward (DDP's gradient buckets); other allreduces stay exact
        from ..compress import from_spec

        self.compressor = from_spec(config.compress)
        self.config = config.capped(timeout.total_seconds())
        self._group_name = ""
        self._group_desc = ""
        self._closed = False
        self._store: dist.Store | None = store
        self._timeout = timeout
        self._barriers = 0  # monitored barriers so far (each uses its own store keys)
        self._delegate: dist.ProcessGroup | None = None  # gloo for ops in the caller's thread
        self._delegate_pg: dist.ProcessGroup | None = None  # plain C++ group over the delegate
        self._private: dist.ProcessGroup | None = None  # gloo for the worker thread
        self._link: SwitchLink | None = None
        self._path: PathPort | None = None  # switch or host path (udp switches; None for gloo)
        self._presence: Presence | None = None  # the peers' presence (udp switches; see _presence)
        self._wait_s = timeout.total_seconds() + 5.0
        self._broken: BaseException | None = None  # sticky: first failed collective
        self._backward = BackwardGuard(self._wait_s)  # works issued during each running backward
        self._worker = FifoWorker(f"homagg-pg{group_id or ''}-r{rank}", self._wait_s, on_error=self._note_failure)
        try:
            self._connect(store, rank, size, timeout, group_id)
        except BaseException as exc:
            self._release()
            error = creation_error(exc, store, rank, size, group_id)
            if error is exc:
                raise
            raise error from exc
        with _LIVE_LOCK:
            _LIVE.add(self)

    def _connect(self, store: dist.Store, rank: int, size: int, timeout: timedelta, group_id: str) -> None:
        """Both gloo groups (connected within the group timeout: see :mod:`._creation`), the switch
        port, then the creation barrier (every rank registered)."""
        self.config.check_world(size)  # every rank alone, before the barrier
        deadline = time.monotonic() + timeout.total_seconds()
        arrive(store, rank, size, deadline)
        self._delegate = gloo_group(store, "homagg/delegate/", rank, size, timeout, deadline, "delegate")
        self._delegate_pg = ProcessGroup(rank, size)  # exact C++ type: no trampoline, calls drop the GIL
        devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
        for device in devices:
            self._delegate_pg._register_backend(torch.device(device), _GLOO, self._delegate)
            self._register_backend(torch.device(device), _GLOO, self._delegate)  # C++-internal callers
        self._delegate_pg._set_default_backend(_GLOO)
        self._private = gloo_group(store, "homagg/private/", rank, size, timeout, deadline, "private")
        self._link = open_switch(self.config, store, rank, size, self._private, group_id, timeout.total_seconds())
        if self._link.kind != "gloo":
            self._presence = Presence(store, rank, self._link)
            self._path = self._path_port(store, rank, size, group_id, timeout.total_seconds())
        await_ranks(store, READY_KEY, rank, size, timeout.total_seconds(), "group creation (registration with the switch)")
        if self._presence is not None:
            self._presence.connect(store, rank, size)
            self._presence.watched(self._link)

    def _path_port(self, store: dist.Store, rank: int, size: int, group_id: str, timeout_s: float) -> PathPort:
        """The port every codec round goes through: the switch, or the host path after it failed."""
        assert self._link is not None and self._private is not None
        config, first = self.config, self._link
        return PathPort(
            first, self._private, rank, size, stats=self.stats, policy=config.fallback, timeout_s=timeout_s,
            probe_interval_s=config.probe_interval, switch_timeout_s=config.timeout, return_attempts=config.return_attempts,
            open_link=lambda epoch: self._watched(reopen_switch(config, store, rank, size, group_id, timeout_s, epoch)),
            probe=lambda: probe_switch(config, first))

    def _watched(self, link: SwitchLink) -> SwitchLink:
        return self._presence.watched(link) if self._presence is not None else link

    @property
    def path(self) -> str:
        """``switch`` or ``host``: the path this group's allreduces take now (``gloo`` for
        ``switch="gloo"``)."""
        return self._path.path if self._path is not None else "gloo"

    # ------------------------------------------------------------------ identity
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "homagg"

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    @property
    def switch(self) -> SwitchLink:
        """The link this group aggregates through (port, address, job; owned emulator if any); while
        :attr:`path` is ``host``, one of kind ``host`` (the gloo host path), never a failed, closed link."""
        if self._link is None:
            raise TransportError("homagg process group is shut down")
        return self._path.link if self._path is not None else self._link

    # ------------------------------------------------------------------ accelerated
    def allreduce(self, tensors: Sequence[torch.Tensor] | torch.Tensor, opts: Any = None) -> HomaggWork | CompletedWork:
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        avg = small_call(tensors, opts)
        if avg is not None and self._small.takes(tensors[0]):  # straight to the small-call path
            return self._submit_small("allreduce", lambda: self._codec_allreduce(tensors, avg, small=True))
        op = reduce_op(opts)
        if codec_takes(tensors, op):
            average = op == dist.ReduceOp.AVG
            if runs_inline(tensors, opts):  # small and synchronous: the caller's thread if the worker is idle
                return self._submit_small("allreduce", lambda: self._codec_allreduce(tensors, average))
            compress = self.compressor is not None and torch._C._current_graph_task_id() != -1
            return self._submit("allreduce", lambda: self._codec_allreduce(tensors, average, compress))
        if op == dist.ReduceOp.AVG:
            dtypes = sorted({str(t.dtype) for t in tensors})
            raise InputError(f"homagg: ReduceOp.AVG needs dense floating-point tensors, got {dtypes}")
        reduction = extremum_call(tensors, opts, self._extremum_takes)
        if reduction is not None:
            return self._submit_small("allreduce", lambda: self._extremum_allreduce(tensors, reduction, opts))
        gloo_opts = as_options(opts)
        return self._on_gloo("allreduce", lambda g: g.allreduce(tensors, gloo_opts), tensors, opts)

    # ------------------------------------------------------------------ delegated on the worker
    def broadcast(self, tensors: Sequence[torch.Tensor], opts: Any = None) -> HomaggWork | CompletedWork:
        tensors = list(tensors)
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._on_gloo("broadcast", lambda g: g.broadcast(tensors, opts), tensors, opts)

    def allgather(
        self, output_tensors: Sequence[Sequence[torch.Tensor]], input_tensors: Sequence[torch.Tensor], opts: Any = None
    ) -> HomaggWork:
        outs = [list(o) for o in output_tensors]
        ins = list(input_tensors)
        opts = opts if opts is not None else AllgatherOptions()
        flat = [t for o in outs for t in o]
        return self._on_gloo("allgather", lambda g: g.allgather(outs, ins, opts), flat, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> HomaggWork:  # noqa: A002
        opts = opts if opts is not None else AllgatherOptions()
        return self._on_gloo("all_gather_single", lambda g: g._allgather_base(output, input, opts), [output], opts)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> HomaggWork:  # noqa: A002
        return self.all_gather_single(output, input, opts)

    def barrier(self, opts: Any = None) -> HomaggWork | CompletedWork:
        """One switch round that every rank must enter before any leaves (:mod:`homagg.codec._barrier`;
        it waits up to the group timeout for a late rank; a dead rank or switch ends it within about
        a second); gloo's barrier where the group has no switch (``switch="gloo"``)."""
        opts = opts if opts is not None else dist.BarrierOptions()
        if self._path is None:
            return self._on_gloo("barrier", lambda g: g.barrier(opts), [], opts)
        if sync_outside_backward(opts):
            return self._submit_small("barrier", self._switch_barrier)
        return self._submit("barrier", self._switch_barrier)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """Barrier that names the ranks that did not arrive (gloo's ``monitored_barrier`` semantics).

        Blocks the caller (like gloo's, not ordered after this group's pending async work) until
        every rank arrived, at most ``timeout`` (default: the group timeout); then raises
        :class:`~homagg.RankTimeoutError` on every rank that arrived, naming the first rank that
        did not arrive, or all of them with ``wait_all_ranks=True`` (its ``ranks`` attribute).
        ``torch.distributed.monitored_barrier`` refuses every backend but gloo by name: call
        ``group.monitored_barrier(...)`` (``dist.group.WORLD`` for the default group) instead.
        """
        store = self._store
        if self._closed or store is None:
            raise TransportError("homagg monitored_barrier: the process group has been shut down")
        seconds = (timeout if timeout is not None else self._timeout).total_seconds()
        self._barriers += 1
        await_ranks(store, f"homagg/monitored/{self._barriers}", self.rank(), self.size(), seconds,
                    "monitored_barrier", all_ranks=wait_all_ranks)

    def _delegated_group(self, op: str) -> dist.ProcessGroup:
        """The plain group over the delegate gloo group that runs ``op`` (see the module docstring)."""
        pg = self._delegate_pg
        if self._closed or pg is None:
            raise TransportError(f"homagg {op}: the process group has been shut down")
        return pg

    # ------------------------------------------------------------------ plumbing
    def _submit_small(self, op: str, fn: Any) -> HomaggWork | CompletedWork:
        """``fn`` now, in the caller's thread, if the worker is idle (see :mod:`._routing`); else queued."""
        if not self._closed and self._broken is None:
            done = self._worker.run_inline(op, fn)
            if done is not None:
                return done
        return self._submit(op, fn)

    def _submit(self, op: str, fn: Any) -> HomaggWork:
        if self._closed:
            raise TransportError(f"homagg {op}: the process group has been shut down")
        self._raise_if_broken()
        on_worker = threading.current_thread() is self._worker.thread
        work = self._worker.submit(op, fn)
        if not on_worker and torch._C._current_graph_task_id() != -1:
            self._backward.add(work, self._raise_if_broken)  # DDP: typed errors from loss.backward()
        return work

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise self._broken

    def _note_failure(self, exc: BaseException) -> None:
        """Worker hook: the first failure makes the group unusable (ranks may be out of step)."""
        if self._broken is None:
            self._broken = exc

    def _on_gloo(self, op: str, call: Any, result: list[torch.Tensor], opts: Any = None) -> HomaggWork | CompletedWork:
        """Queue ``op``, run by ``call`` on the private gloo group in the worker thread (in the
        caller's when ``opts`` say synchronous and the worker is idle: :func:`._routing.sync_outside_backward`);
        gloo's failures (e.g. the plain ``RuntimeError`` of a peer that is gone) become the typed
        :func:`~homagg.transport.transport_error` of ``op``."""

        task = self._gloo_task(op, call, result)
        return self._submit_small(op, task) if sync_outside_backward(opts) else self._submit(op, task)

    def _gloo_task(self, op: str, call: Any, result: list[torch.Tensor]) -> Any:
        """The task of :meth:`_on_gloo` (see there), to run on the worker or inline."""

        def task() -> TaskResult:
            gloo = self._private
            if gloo is None:
                raise TransportError("homagg process group is shut down")
            # nobody may still wait for a switch round (see _fallback)
            if self._path is not None:
                self._path.before_gloo_op()
            t0 = time.monotonic()
            try:
                work = call(gloo)
                work.wait()
            except Exception as exc:
                raise transport_error(exc, f"homagg {op} (rank {self.rank()}, on the group's gloo side)",
                                      timeout_s=self._timeout.total_seconds(),
                                      waited_s=time.monotonic() - t0) from exc
            if result and result[0].layout != torch.strided:
                return list(work.result())  # sparse allreduce: gloo hands back new tensors
            return result

        return task

    def shutdown(self) -> None:
        """Stop the worker, close the switch link (and an owned emulator), release gloo groups."""
        if self._closed:
            return
        self._closed = True
        try:
            self._release()
        finally:
            super().shutdown()  # shuts down the registered gloo delegate
            with _LIVE_LOCK:
                _LIVE.discard(self)

    def abort(self) -> None:
        self.shutdown()

    def _release(self) -> None:
        self._worker.close()
        link, self._link = self._link, None
        path, self._path = self._path, None
        if path is not None:
            path.close()  # the link in use (the first one, or one opened after a fallback)
        elif link is not None:
            link.close()
        presence, self._presence = self._presence, None
        if presence is not None:  # after the path port's close: its agreement may wait for a peer
            presence.close()
        if self._private is not None or self._delegate is not None:
            # gloo's threads free finished work under their queue lock and may need the GIL for
            # it; dropping a gloo group joins them with the GIL held: let them finish first.
            time.sleep(0.02)
        self._private = None
        self._delegate_pg = None
        self._delegate = None  # the C++ group keeps the registered backend until it is freed
        self._store = None
        # pybind objects are invisible to the cycle collector: drop what can point back at us
        # (a failure's traceback holds our frames; the guards hold works).
        self._broken = TransportError("homagg process group is shut down") if self._broken is not None else None
        self._backward.clear()

    def __repr__(self) -> str:
        return f"ProcessGroupHomagg(rank={self.rank()}, size={self.size()}, switch={self.config.switch!r})"


for _name in DELEGATED_OPS:
    setattr(ProcessGroupHomagg, _name, delegated(_name))


def shutdown_all() -> None:
    """Shut down every live homagg group (used at interpreter exit; idempotent)."""
    with _LIVE_LOCK:
        groups = list(_LIVE)
    for pg in groups:
        pg.shutdown()

