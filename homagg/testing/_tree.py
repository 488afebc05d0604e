"""In-process aggregation trees (part of :mod:`homagg.testing`): real switch pipelines, no sockets.

:class:`TreeNetwork` builds one :class:`switch_emulator.pipeline.Pipeline` per switch of a
:class:`~homagg.tree.TreePlan`, each with the job admitted in its role (root, or child with its
parent's address and its child id), and moves datagrams between them and the ranks in memory.  A
round's streams are cut into chunks exactly as the wire format carries them (one use of a
(slot, bank) cell per chunk, ``words_per_packet`` words each); every rank sends every chunk of a
window of ``n_slots`` uses, the network delivers (optionally losing, duplicating and reordering
datagrams on each kind of hop, seeded, or by a script), and ranks still missing a result resend
that chunk flagged ``FLAG_RETRANSMIT`` -- the worker-clocked recovery of the UDP transport, with
the same verdicts at every switch.  The next window starts when every rank holds every result of
this one (the self-clocking the transport keeps).

:func:`local_tree_allreduce` runs the codec on threads (one per rank, as
:func:`~homagg.testing.local_allreduce` does) with its rounds combined by such a network.

Invariants checked on every round: each rank decodes its own result datagrams; all ranks' words
are equal; the round finishes within ``max_resends`` retransmissions per chunk (else
:class:`~homagg.ResultMismatchError` naming the rank and chunk, nothing waits unbounded).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._errors import InputError
from ..jobs import JobSpec, WorkerAddr
from ..transport import InProcessSwitch, Stream
from ..tree import TreePlan, plan_tree
from ..wire import FLAG_RESULT, FLAG_RETRANSMIT, HOMAGG_UDP_PORT, pack_header_into, payload_view, unpack_header
from ._oracle import ResultMismatchError

__all__ = ["HOPS", "HopFaults", "TreeNetwork", "local_tree_allreduce", "run_tree_local"]

#: the kinds of hop a datagram takes: worker -> leaf, child -> parent, parent -> child, leaf -> worker
HOPS = ("worker_leaf", "child_parent", "parent_child", "leaf_worker")

Addr = tuple[str, int]
#: ``script(hop, n, header) -> "drop" | "dup" | "late" | None``: the n-th datagram of that hop kind
Script = Callable[[str, int, tuple[int, ...]], str | None]


@dataclass(frozen=True)
class HopFaults:
    """Seeded per-hop fault rates: ``drop`` (lost), ``duplicate`` (delivered twice), ``late``
    (delivered after the datagrams queued behind it); ``hops`` limits them to some hop kinds."""

    drop: float = 0.0
    duplicate: float = 0.0
    late: float = 0.0
    seed: int = 0
    hops: tuple[str, ...] = HOPS


def _switch_addr(index: int) -> Addr:
    return (f"10.254.{index >> 8}.{index & 0xFF}", HOMAGG_UDP_PORT)


def _rank_addr(rank: int) -> Addr:
    return (f"10.{rank >> 16 & 0xFF}.{rank >> 8 & 0xFF}.{rank & 0xFF}", HOMAGG_UDP_PORT)


class TreeNetwork:
    """The switches of ``plan`` as real pipelines, and the network between them and the ranks."""

    def __init__(self, plan: TreePlan, *, words_per_packet: int = 32, n_slots: int = 4, job_id: int = 7,
                 token: int = 0x5EED1234, faults: HopFaults | None = None, script: Script | None = None,
                 max_resends: int = 200) -> None:
        from switch_emulator.admission import AdmissionTable
        from switch_emulator.pipeline import Pipeline

        self.plan, self.k, self.n_slots, self.max_resends = plan, words_per_packet, n_slots, max_resends
        self.faults, self.script = faults or HopFaults(), script
        self._rand = random.Random(self.faults.seed).random
        self._seen = dict.fromkeys(HOPS, 0)
        self._queue: deque[tuple[str, Addr, bytes, Addr]] = deque()
        self._late: list[tuple[str, Addr, bytes, Addr]] = []
        self.pipelines: list[Pipeline] = []
        self._by_addr: dict[Addr, Any] = {}
        for s in plan.switches:
            if s.ranks is not None:
                workers = tuple(WorkerAddr(w, *_rank_addr(r)) for w, r in enumerate(s.ranks))
            else:
                workers = tuple(WorkerAddr(c.child_id, *_switch_addr(c.index)) for c in plan.children(s.index))
            spec = JobSpec(job_id, s.members, 0, n_slots, words_per_packet, workers, token=token,
                           parent=None if s.parent is None else _switch_addr(s.parent), child_id=s.child_id)
            table = AdmissionTable(max(64, n_slots))
            table.admit(spec)
            me = _switch_addr(s.index)
            pipe = Pipeline(table, lambda d, dst, me=me: self._send(me, bytes(d), dst))
            self.pipelines.append(pipe)
            self._by_addr[me] = pipe
        self._switch_at = {_switch_addr(s.index): s for s in plan.switches}
        self._rank_of = {_rank_addr(r): r for r in range(plan.world_size)}
        self._leaf_addr = [_switch_addr(plan.place(r)[0]) for r in range(plan.world_size)]
        self._wid = [plan.place(r)[1] for r in range(plan.world_size)]
        self.job_id, self.token = job_id, token
        self._use = 0  # uses started so far (the tag of the next one, mod 2**16)
        self._inbox: list[dict[tuple[int, int, int], np.ndarray]] = [{} for _ in range(plan.world_size)]

    # -- the network ------------------------------------------------------------------------------
    def _hop(self, src: Addr, dst: Addr) -> str:
        if src in self._rank_of:
            return "worker_leaf"
        if dst in self._rank_of:
            return "leaf_worker"
        return "parent_child" if self._switch_at[dst].parent == self._switch_at[src].index else "child_parent"

    def _send(self, src: Addr, data: bytes, dst: Addr) -> None:
        hop = self._hop(src, dst)
        n = self._seen[hop]
        self._seen[hop] = n + 1
        action = self.script(hop, n, unpack_header(data)) if self.script is not None else None
        f = self.faults
        if action is None and hop in f.hops:
            r = self._rand
            action = ("drop" if f.drop and r() < f.drop else "dup" if f.duplicate and r() < f.duplicate
                      else "late" if f.late and r() < f.late else None)
        if action == "drop":
            return
        item = (hop, src, data, dst)
        if action == "late":
            self._late.append(item)
            return
        self._queue.append(item)
        if action == "dup":
            self._queue.append(item)

    def _deliver(self) -> None:
        while self._queue or self._late:
            if not self._queue:
                self._queue.extend(self._late)
                self._late.clear()
            _hop, src, data, dst = self._queue.popleft()
            pipe = self._by_addr.get(dst)
            if pipe is not None:
                pipe.process(data, len(data), src)
                continue
            rank = self._rank_of[dst]
            h = unpack_header(data)
            if h[2] & FLAG_RESULT and h[3] == self.job_id and h[11] == self.token:
                key = (h[7] << 1 | h[6], h[8], h[9])  # (cell, tag, offset)
                self._inbox[rank].setdefault(key, np.array(payload_view(data, h[5]), dtype=np.int32))

    # -- rounds ----------------------------------------------------------------------------------
    def combine(self, rounds: list[Sequence[Stream]]) -> list[torch.Tensor]:
        """Every rank's streams of one round through the tree; the combined streams (checked equal
        on every rank)."""
        world = self.plan.world_size
        words = [[s.materialize().cpu().numpy().astype(np.int32) for s in streams] for streams in rounds]
        chunks = [(i, off, min(self.k, s.length - off), int(s.op))
                  for i, s in enumerate(rounds[0]) for off in range(0, s.length, self.k)]
        outs = [[np.empty(s.length, dtype=np.int32) for s in rounds[0]] for _ in range(world)]
        for w0 in range(0, len(chunks), self.n_slots):
            window = chunks[w0:w0 + self.n_slots]
            bank = (self._use // self.n_slots) & 1  # successive windows alternate the banks of the slots
            heads = [(j, bank, (self._use + j) & 0xFFFF, off, wc, op, stream)
                     for j, (stream, off, wc, op) in enumerate(window)]
            self._run_window(words, heads, outs)
            self._use += len(window)
        results = [torch.from_numpy(o) for o in outs[0]]
        for r in range(1, world):
            for i, o in enumerate(outs[r]):
                if not np.array_equal(o, outs[0][i]):
                    raise ResultMismatchError(f"tree: rank {r}'s stream {i} differs from rank 0's")
        return results

    def _run_window(self, words: list[list[np.ndarray]], heads: list[tuple[int, ...]],
                    outs: list[list[np.ndarray]]) -> None:
        world = self.plan.world_size
        buf = bytearray(20 + 4 * self.k)
        order = [(r, h) for h in heads for r in range(world)]
        random.Random(self._use).shuffle(order)
        missing = {(r, h[0]) for r, h in order}
        for attempt in range(self.max_resends + 1):
            for r, h in order:
                if (r, h[0]) not in missing:
                    continue
                slot, bank, tag, off, wc, op, stream = h
                pack_header_into(buf, op, FLAG_RETRANSMIT if attempt else 0, self.job_id, self._wid[r], wc, bank,
                                 slot, tag, off & 0xFFFFFFFF, self.token)
                payload_view(buf, wc)[:] = words[r][stream][off:off + wc]
                self._send(_rank_addr(r), bytes(buf[:20 + 4 * wc]), self._leaf_addr[r])
            self._deliver()
            for r, j in list(missing):
                slot, bank, tag, off, wc, op, stream = heads[j]
                got = self._inbox[r].pop(((slot << 1) | bank, tag, off & 0xFFFFFFFF), None)
                if got is not None:
                    outs[r][stream][off:off + wc] = got
                    missing.discard((r, j))
            for box in self._inbox:
                box.clear()  # results of other uses: late copies, dropped as the worker drops them
            if not missing:
                return
        r, j = min(missing)
        raise ResultMismatchError(f"tree: rank {r} has no result for chunk {j} of use {self._use} after "
                                  f"{self.max_resends} retransmissions")

    def counters(self) -> list[dict[str, int]]:
        """Each switch's counters (root first)."""
        return [p.counters.snapshot() for p in self.pipelines]


def run_tree_local(tensors: Sequence[torch.Tensor], scheme: str = "auto", *, plan: TreePlan | None = None,
                   per_switch: int = 32, max_levels: int = 2, network: dict[str, Any] | None = None,
                   timeout: float = 300.0, **options: Any) -> tuple[list[torch.Tensor], TreeNetwork]:
    """Each rank's result of the SUM allreduce of ``tensors`` through an in-process tree, and the tree."""
    from ._local import run_local

    world = len(tensors)
    if world == 0:
        raise InputError("need at least one tensor (one per worker)")
    plan = plan or plan_tree(world, per_switch=per_switch, max_levels=max_levels)
    net = TreeNetwork(plan, **(network or {}))
    switch = InProcessSwitch(world, timeout=timeout, combiner=net.combine)
    return run_local(tensors, scheme, timeout=timeout, switch=switch, **options).results, net


def local_tree_allreduce(tensors: Sequence[torch.Tensor], scheme: str = "auto", **kwargs: Any) -> list[torch.Tensor]:
    """Like :func:`~homagg.testing.local_allreduce`, with the rounds combined by a tree of switch
    pipelines (:class:`TreeNetwork`; keywords of :func:`run_tree_local`)."""
    return run_tree_local(tensors, scheme, **kwargs)[0]
