"""``homagg bench codec``: encode/decode cost of every scheme vs one dense ``torch.add``.

W workers' protocols run in lockstep in one thread; the switch is ``combine_words`` (not timed).
Worker 0's compute is timed: ``encode_s`` is the time spent producing streams (every span of the
protocol that ends in sending a round), ``decode_s`` the final span that turns combined words into
the result tensor, in place in the input as the torch backend does.  ``baseline_add_s`` is one dense fp32 ``torch.add`` of the same size, timed in
the same run.  Every figure is the median over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from .. import _options as opt
from ..codec._config import SCHEMES, CodecConfig
from ..codec._schemes import protocol
from ..codec._stats import WorkerStats
from ..transport import combine_words

__all__ = ["configure_parser", "run", "measure"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--numel", type=int, default=25_000_000, help="elements per tensor (default 25M)")
    p.add_argument("--density", type=float, default=0.01, help="nonzero fraction per worker (default 0.01)")
    p.add_argument("--workers", type=int, default=4, help="simulated workers (default 4)")
    p.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated schemes")
    p.add_argument("--repeats", type=int, default=5, help="runs per scheme; medians are reported")
    p.add_argument("--overlap", type=float, default=0.5, help="fraction of each worker's support shared by all")
    p.add_argument("--device", default="cpu", help="torch device of the tensors (cpu, cuda)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--json", type=Path, help="write the records to this file")


def _inputs(numel: int, density: float, workers: int, overlap: float, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    nnz = int(numel * density)
    shared = torch.randint(0, numel, (int(nnz * overlap),), generator=g)
    out = []
    for _ in range(workers):
        own = torch.randint(0, numel, (nnz - shared.numel(),), generator=g)
        x = torch.zeros(numel)
        pos = torch.cat([shared, own])
        x[pos] = torch.randn(pos.numel(), generator=g)
        out.append(x.to(device))
    return out


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _one_run(tensors: list[torch.Tensor], scheme: str, cfg: CodecConfig, device: str) -> tuple[float, float, WorkerStats]:
    world = len(tensors)
    stats = [WorkerStats() for _ in range(world)]
    # in place, as the torch backend decodes (the clones are made before any timing)
    gens = [protocol(t.clone(), world, scheme, cfg, s, inplace=True) for t, s in zip(tensors, stats, strict=True)]
    encode = decode = 0.0
    replies: list[Any] = [None] * world
    while True:
        rounds = []
        for r, gen in enumerate(gens):
            t0 = time.perf_counter()
            try:
                rounds.append(gen.send(replies[r]))
                finished = False
            except StopIteration:
                finished = True
            _sync(device)
            if r == 0:
                if finished:
                    decode += time.perf_counter() - t0
                else:
                    encode += time.perf_counter() - t0
        if len(rounds) < world:
            return encode, decode, stats[0]
        combined = [combine_words(s.op, [rd[i].materialize() for rd in rounds]) for i, s in enumerate(rounds[0])]
        replies = [[c.clone() for c in combined] for _ in range(world)]


def measure(numel: int, density: float, workers: int, schemes: list[str], repeats: int, overlap: float = 0.5, device: str = "cpu") -> list[dict[str, Any]]:
    tensors = _inputs(numel, density, workers, overlap, device)
    cfg = CodecConfig()
    a, b = torch.randn(numel, device=device), torch.randn(numel, device=device)
    records = []
    for scheme in schemes:
        enc, dec, add = [], [], []
        stats = WorkerStats()
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.add(a, b)
            _sync(device)
            add.append(time.perf_counter() - t0)
            e, d, stats = _one_run(tensors, scheme, cfg, device)
            enc.append(e)
            dec.append(d)
        base = statistics.median(add)
        rec = {
            "scheme": scheme,
            "resolved": "+".join(sorted(stats.schemes)),
            "numel": numel,
            "density": density,
            "workers": workers,
            "device": device,
            "repeats": repeats,
            "threads": torch.get_num_threads(),
            "encode_s": statistics.median(enc),
            "decode_s": statistics.median(dec),
            "bytes_per_worker": stats.bytes_sent,
            "dense_bytes": 4 * numel,
            "rounds": stats.rounds,
            "repaired": stats.repaired,
            "baseline_add_s": base,
        }
        rec["ratio_to_add"] = (rec["encode_s"] + rec["decode_s"]) / base
        records.append(rec)
    return records


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ._report import print_table

    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    opt.count("--numel", args.numel)
    opt.within("--density", args.density, "(0, 1]")
    opt.count("--workers", args.workers)
    opt.names("--schemes", schemes, SCHEMES, args.schemes)
    opt.count("--repeats", args.repeats, why="medians are reported")
    opt.within("--overlap", args.overlap, "[0, 1]")
    opt.count("--threads", args.threads, 0, why="0: torch's choice")
    if args.threads:
        torch.set_num_threads(args.threads)
    records = measure(args.numel, args.density, args.workers, schemes, args.repeats, args.overlap, args.device)
    table = Table(title=f"codec: {args.numel:,} elements, density {args.density}, {args.workers} workers (medians of {args.repeats})")
    for col in ("scheme", "encode ms", "decode ms", "bytes/worker", "x dense", "rounds", "(enc+dec)/add"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in records:
        table.add_row(
            f"{r['scheme']} ({r['resolved']})" if r["scheme"] == "auto" else r["scheme"],
            f"{r['encode_s'] * 1e3:.1f}",
            f"{r['decode_s'] * 1e3:.1f}",
            f"{r['bytes_per_worker']:,}",
            f"{r['bytes_per_worker'] / r['dense_bytes']:.3f}",
            str(r["rounds"]),
            f"{r['ratio_to_add']:.2f}",
        )
    print_table(Console(), table)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2))
    return 0
