"""What one rank of ``homagg bench net --racks`` does (started by :mod:`homagg.bench._net_racks`
inside its worker namespace of a :class:`~homagg.bench._racknet.RackNet`).

``python -m homagg.bench._racks_rank '<json>'``; the JSON names the ``method`` (``gloo``: gloo's
ring all_reduce; ``homagg``: the codec through switch ports), for homagg the ``topology``
(``star``: every rank a member of the spine's emulator; ``tree``: every rank a member of its
rack's leaf, each leaf a member of the spine's root, docs/trees.md), the scheme and codec options,
the sweep (numels, densities, repeats, seed, timeout), the switches' addresses
(:class:`~homagg.bench._racknet.Switches`), the emulators' pids and the uplinks to count.

Every rank joins a gloo group (the barriers around each call, and gloo's all_reduce itself).  For
homagg, group rank 0 admits the job over the control ports (:meth:`ControlClient.admit`: at the star
with ``W`` members; for the tree the root with the R leaves' data addresses as its members, ``child_id
= k``, then every leaf with ``parent`` = the root's data address and its ``child_id``, the same job
id, token, slot range and words per packet everywhere) and hands the admitted specs to the others
(``broadcast_object_list``); each rank opens one :class:`~homagg.transport.UdpSwitchPort` at its
switch (``rank`` = its worker id there, ``total_world_size = W``: the codec's headroom follows the
whole job) and calls :func:`homagg.allreduce` on it.  Timing, checks and the record line are
:mod:`homagg.bench._allreduce_rank`'s (same inputs, same oracle, same digests); rank 0 reads each
uplink's interface counters (``ip -s -j link`` in the leaf's namespace) just before the first timed
call and after the last, and the engines the emulators ran (their ``status``) at the end.  Rank 0
removes the job from every switch before the group ends.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from typing import Any

import torch

from .._errors import HomAggError
from ._allreduce_rank import Counters, _one_config
from ._ranks import RECORD_MARK, die_with_launcher
from ._report import RETX_KEYS

__all__ = ["uplink_bytes", "rank_main"]


def uplink_bytes(uplinks: list[list[str]]) -> dict[str, int]:
    """Kernel byte counters of each ``(namespace, interface)``: ``"<k>.up"`` (sent towards the spine)
    and ``"<k>.down"`` (received from it), ``k`` the uplink's index."""
    out: dict[str, int] = {}
    for k, (ns, dev) in enumerate(uplinks):
        res = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", "dev", dev], capture_output=True,
                             text=True, timeout=30)
        if res.returncode:
            raise HomAggError(f"bench net: cannot read the counters of {dev} in {ns}: {res.stderr.strip()}")
        stats = json.loads(res.stdout)[0]["stats64"]
        out[f"{k}.up"], out[f"{k}.down"] = int(stats["tx"]["bytes"]), int(stats["rx"]["bytes"])
    return out


def _control(addr: list[Any]) -> tuple[str, int]:
    return str(addr[0]), int(addr[1]) + 1


def _admit(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Rank 0: admit the job at every switch of the arrangement; the specs (``to_dict``), the star's
    or the root's first, then leaf k's at index ``1 + k``."""
    from ..transport import ControlClient

    sw, world, racks = cfg["switches"], cfg["world"], cfg["racks"]
    shape = {"n_slots": cfg["n_slots"], "words_per_packet": cfg["words_per_packet"]}
    if cfg["topology"] == "star":
        with ControlClient(_control(sw["star"])) as ctl:
            return [ctl.admit(world, **shape).to_dict()]
    members = [{"worker_id": k, "ip": ip, "port": port} for k, (ip, port) in enumerate(sw["leaves"])]
    with ControlClient(_control(sw["root"])) as ctl:
        root = ctl.admit(racks, workers=members, **shape)
    specs = [root.to_dict()]
    for k, leaf in enumerate(sw["leaves"]):
        with ControlClient(_control(leaf)) as ctl:
            spec = ctl.admit(world // racks, job_id=root.job_id, token=root.token, slot_base=root.slot_base,
                             parent=tuple(sw["root"]), child_id=k, **shape)
        specs.append(spec.to_dict())
    return specs


def _switch_addrs(cfg: dict[str, Any]) -> list[list[Any]]:
    """The data addresses of the arrangement's switches, in :func:`_admit`'s order."""
    sw = cfg["switches"]
    return [sw["star"]] if cfg["topology"] == "star" else [sw["root"], *sw["leaves"]]


def _release(cfg: dict[str, Any], specs: list[dict[str, Any]]) -> list[str]:
    """Rank 0: the engine each switch ran (its status), then the job removed there."""
    from ..transport import ControlClient

    engines = []
    for addr, spec in zip(_switch_addrs(cfg), specs):
        with ControlClient(_control(addr)) as ctl:
            engines.append(str(ctl.status().get("engine")))
            ctl.remove(int(spec["job_id"]))
    return engines


def _homagg_path(cfg: dict[str, Any], rank: int, specs: list[dict[str, Any]]) -> tuple[Any, Any, Any]:
    """(port, reduce, counters) of rank ``rank``: its port at its switch and the calls through it."""
    from .. import codec
    from ..jobs import JobSpec
    from ..transport import UdpSwitchPort

    if cfg["topology"] == "star":
        addr, spec, wid = cfg["switches"]["star"], specs[0], rank
    else:
        per = cfg["world"] // cfg["racks"]
        addr, spec, wid = cfg["switches"]["leaves"][rank // per], specs[1 + rank // per], rank % per
    port = UdpSwitchPort(tuple(addr), rank=wid, job=JobSpec.from_dict(spec), control=_control(addr),
                         timeout=cfg["timeout"], total_world_size=cfg["world"])
    config = codec.CodecConfig.from_options(dict(cfg["codec"]))
    stats, history = codec.WorkerStats(), codec.History()

    def reduce(buf: torch.Tensor) -> torch.Tensor:
        return codec.allreduce(buf, port, scheme=cfg["scheme"], config=config, inplace=True, stats=stats,
                               history=history)

    def counters() -> Counters:
        retrans = {k: int(port.stats.get(k, 0)) for k in RETX_KEYS}
        return int(stats.rounds), int(stats.bytes_sent), retrans, int(stats.segments)

    return port, reduce, counters


def rank_main(cfg: dict[str, Any]) -> int:
    """One JSON record line per (numel, density) on stdout (:data:`RECORD_MARK`), as
    :func:`homagg.bench._allreduce_rank.rank_main`'s, with ``traffic`` (rank 0: bytes per uplink
    per call) and ``engines`` (rank 0, homagg: each switch's engine, :func:`_admit`'s order)."""
    die_with_launcher()
    import torch.distributed as dist

    import homagg

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=cfg["timeout"]))
    try:
        pg = dist.distributed_c10d._get_default_group()
        rank = dist.get_rank()
        block = homagg.CodecConfig().block_size
        homagg_run = cfg["method"] == "homagg"
        specs: list[Any] = [_admit(cfg) if rank == 0 and homagg_run else None]
        if homagg_run:
            dist.broadcast_object_list(specs, src=0)
        port, reduce, counters = _homagg_path(cfg, rank, specs[0]) if homagg_run else (None, None, None)
        traffic = (lambda: uplink_bytes(cfg["uplinks"])) if rank == 0 else None
        try:
            lines = [_one_config(pg, numel, density, cfg["repeats"], cfg["seed"], block, reduce=reduce,
                                 counters=counters or (lambda: None), switch_pids=cfg["switch_pids"] if homagg_run
                                 else [], traffic=traffic)
                     for numel in cfg["numels"] for density in cfg["densities"]]
        finally:
            if port is not None:
                port.close()
        dist.barrier()  # every port closed before the job goes
        engines = _release(cfg, specs[0]) if rank == 0 and homagg_run else None
        for line in lines:
            print(f"\n{RECORD_MARK}{json.dumps({**line, 'engines': engines})}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(json.loads(sys.argv[1])))
