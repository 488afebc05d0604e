"""Aggregation trees over UDP (part of :mod:`homagg.testing`): one emulator process per switch.

:class:`UdpTree` spawns one ``python -m switch_emulator`` per switch of a
:class:`~homagg.tree.TreePlan` and admits the job at each in its role (docs/trees.md) over the
control port: the root with its children's data addresses as its members (worker id = the
child's ``child_id``: a child sends its up packets from its data socket), every child with
``parent`` = its parent's data address and its ``child_id`` there, the leaves with no worker
addresses (each rank's :class:`~homagg.transport.UdpSwitchPort` registers its own).  Every switch
holds the same job id, token, slot range and words per packet.  :meth:`UdpTree.port` opens rank
``r``'s port at its leaf (``rank`` = its worker id there, ``total_world_size`` = the whole job's
ranks); :func:`run_tree_udp` runs the codec on one thread per rank through such a tree.

Invariants: every emulator this object started is stopped by :meth:`UdpTree.stop` (also on a
failed start); the ports :func:`run_tree_udp` opens are closed before it returns; nothing waits
unbounded (the ports' ``timeout``, :func:`~homagg.testing.on_threads`' bound).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .._errors import InputError
from ..jobs import JobSpec
from ..transport import ControlClient, UdpSwitchPort
from ..tree import TreePlan
from ._local import on_threads

__all__ = ["UdpTree", "run_tree_udp"]


class UdpTree:
    """The switches of ``plan`` as emulator processes, the job admitted at each in its role.

    ``engine``: the emulators' engine (``auto``, ``python``, ``native``); ``drop`` and ``seed``:
    fault injection at every switch (ingress and each egress copy, up packets included; the
    python engine; switch ``i`` seeds ``seed + i``).
    """

    def __init__(self, plan: TreePlan, *, words_per_packet: int = 64, n_slots: int = 16, job_id: int = 11,
                 token: int = 0x7EE50001, engine: str = "auto", drop: float = 0.0, seed: int = 0,
                 spawn_timeout: float = 60.0) -> None:
        import switch_emulator

        self.plan, self.job_id, self.token = plan, job_id, token
        started: dict[int, Any] = {}
        self.switches: list[Any] = []
        self.specs: list[JobSpec] = []

        def start(i: int) -> None:
            started[i] = switch_emulator.spawn(engine=engine, drop=drop, seed=seed + i, allow_faults=drop > 0,
                                               timeout=spawn_timeout)

        try:
            try:
                on_threads(start, len(plan.switches), spawn_timeout + 10)
            finally:
                self.switches = [started[i] for i in sorted(started)]
            for s in plan.switches:
                members = [] if s.is_leaf else [
                    {"worker_id": c.child_id, "ip": self.switches[c.index].data_addr[0],
                     "port": self.switches[c.index].data_addr[1]} for c in plan.children(s.index)]
                parent = None if s.parent is None else tuple(self.switches[s.parent].data_addr)
                with ControlClient(self.switches[s.index].control_addr) as ctl:
                    self.specs.append(ctl.admit(s.members, job_id=job_id, token=token, slot_base=0, n_slots=n_slots,
                                                words_per_packet=words_per_packet, workers=members, parent=parent,
                                                child_id=s.child_id))
        except BaseException:
            self.stop()
            raise

    def port(self, rank: int, **options: Any) -> UdpSwitchPort:
        """Rank ``rank``'s port at its leaf (registered there); ``options``: UdpSwitchPort's."""
        leaf, wid = self.plan.place(rank)
        sw = self.switches[leaf]
        return UdpSwitchPort(sw.data_addr, rank=wid, job=self.specs[leaf], control=sw.control_addr,
                             total_world_size=self.plan.world_size, **options)

    def status(self) -> list[dict[str, Any]]:
        """Each switch's control ``status`` (counters, engine, jobs), root first."""
        out = []
        for sw in self.switches:
            with ControlClient(sw.control_addr) as ctl:
                out.append(ctl.status())
        return out

    def counters(self) -> list[dict[str, int]]:
        """Each switch's counters (root first)."""
        return [st["counters"] for st in self.status()]

    def stop(self) -> None:
        """Stop every emulator (idempotent)."""
        while self.switches:
            self.switches.pop().stop()

    def __enter__(self) -> UdpTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_tree_udp(tree: UdpTree, tensors: Sequence[torch.Tensor], schemes: Sequence[str] = ("auto",), *,
                 timeout: float = 60.0, **port_options: Any) -> dict[str, list[torch.Tensor]]:
    """Rank ``r`` allreduces ``tensors[r]`` through ``tree`` with each scheme in turn (one thread per
    rank, one port each); each scheme's results, indexed by rank."""
    from ..codec import allreduce

    if len(tensors) != tree.plan.world_size:
        raise InputError(f"{len(tensors)} tensors for a tree of {tree.plan.world_size} ranks")

    def rank_work(r: int) -> dict[str, torch.Tensor]:
        port = tree.port(r, timeout=timeout, **port_options)
        try:
            return {s: allreduce(tensors[r], port, scheme=s) for s in schemes}
        finally:
            port.close()

    per_rank = on_threads(rank_work, tree.plan.world_size, timeout * max(1, len(schemes)) + 30)
    return {s: [res[s] for res in per_rank] for s in schemes}
