"""One demo-style worker, run inside a Mininet host: aggregate through the switch, check exactly.

Every worker builds the same deterministic inputs for *all* ranks (seeded), so each can compute
the oracle itself: the network result of every scheme must be bit-identical to
:func:`homagg.testing.local_allreduce` of the same inputs (the in-process switch), and schemes must
agree with each other.  Writes one JSON file with per-scheme timings, bytes and ``exact`` flags.
Exit status 0 iff every scheme was exact.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

__all__ = ["make_inputs", "main"]


def make_inputs(rank: int, numel: int, density: float, seed: int) -> list[torch.Tensor]:
    """Worker ``rank``'s gradients: a sparse embedding-like tensor and a small dense layer."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    sparse = torch.zeros(numel, dtype=torch.float32)
    nnz = max(1, int(numel * density))
    idx = torch.randperm(numel, generator=g)[:nnz]
    sparse[idx] = torch.randn(nnz, generator=g)
    dense = torch.randn(max(1, numel // 64), generator=g)
    return [sparse, dense]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--switch", required=True, help="switch data address HOST:PORT")
    p.add_argument("--control", default=None, help="switch control address HOST:PORT (registration)")
    p.add_argument("--bind", default=None, help="local IP to send from")
    p.add_argument("--bind-port", type=int, default=0, help="local UDP port (0: any)")
    p.add_argument("--rank", type=int, required=True, help="the rank (its inputs)")
    p.add_argument("--job", required=True, help="JobSpec JSON: the job at this worker's switch")
    p.add_argument("--worker-id", type=int, default=None,
                   help="the worker id at the switch (a tree's leaf: docs/trees.md; default: --rank)")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks of the whole job (a tree: more than the leaf's; default: the job's world_size)")
    p.add_argument("--schemes", default="dense,compact,sketch,auto")
    p.add_argument("--numel", type=int, default=20000)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--out", required=True)
    p.add_argument("--forge", type=int, default=0,
                   help="first send this many datagrams with a wrong job token (the switch must drop them)")
    args = p.parse_args(argv)

    from homagg import allreduce
    from homagg.jobs import JobSpec
    from homagg.testing import local_allreduce
    from homagg.transport import UdpSwitchPort
    from homagg.transport import parse_addr

    job = JobSpec.from_json(args.job)
    world = args.world_size or job.world_size
    report: dict[str, object] = {"rank": args.rank, "world_size": world, "schemes": {}, "ok": False}
    try:
        inputs = [make_inputs(r, args.numel, args.density, args.seed) for r in range(world)]
        mine = inputs[args.rank]
        wid = args.rank if args.worker_id is None else args.worker_id
        port = UdpSwitchPort(parse_addr(args.switch), rank=wid, job=job, control=args.control,
                             bind=(args.bind, args.bind_port) if args.bind else None, timeout=args.timeout,
                             total_world_size=world)
        if args.forge:
            report["forged"] = _send_forged(port, job, args.forge)
        ok = True
        first: list[torch.Tensor] | None = None
        for scheme in args.schemes.split(","):
            t0 = time.perf_counter()
            pkts0 = port.stats["packets"]
            got = [allreduce(t.clone(), port, scheme=scheme) for t in mine]
            dt = time.perf_counter() - t0
            want = [local_allreduce([inp[i] for inp in inputs], scheme=scheme)[args.rank]
                    for i in range(len(mine))]
            exact = all(torch.equal(a, b) for a, b in zip(got, want))
            agree = first is None or all(torch.equal(a, b) for a, b in zip(got, first))
            f64 = [torch.stack([inp[i].double() for inp in inputs]).sum(0) for i in range(len(mine))]
            err = max(float((a.double() - b).abs().max()) for a, b in zip(got, f64))
            first = first or got
            ok &= exact and agree
            report["schemes"][scheme] = {  # type: ignore[index]
                "exact": exact, "agrees_with_first_scheme": agree, "seconds": round(dt, 4),
                "packets": port.stats["packets"] - pkts0, "max_abs_err_vs_float64": err,
            }
        report["transport"] = dict(port.stats)
        port.close()
        report["ok"] = ok
    except Exception as exc:  # noqa: BLE001 - reported in the JSON and the exit status
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["traceback"] = traceback.format_exc()
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


def _send_forged(port: object, job: object, n: int) -> int:
    """``n`` datagrams from this worker's own address into the job's first cell, with a wrong token.

    Were the switch to accept them, the first round's slot would hold 1s and no scheme could be
    exact; it must drop them (counter ``drop_token``).  Returns how many were sent."""
    from homagg import wire

    buf = bytearray(wire.datagram_len(8))
    forged = (job.token + 1) & 0xFFFFFFFF  # type: ignore[attr-defined]
    wire.pack_header_into(buf, wire.OP_ADD, 0, job.job_id, port.rank, 8, 0, job.slot_base, 0, 0,  # type: ignore[attr-defined]
                          forged)
    wire.payload_view(buf, 8)[:] = 1
    for _ in range(n):
        port.sock.send(buf)  # type: ignore[attr-defined]
    time.sleep(0.2)  # let them reach the switch before the real first round
    return n


if __name__ == "__main__":
    sys.exit(main())
