"""``homagg demo``: a real aggregation — emulator on loopback, W worker processes, every scheme.

Each worker holds realistic gradients (:func:`make_tensors`: a row-sparse embedding gradient at
``--density``, an element-sparse layer, a dense layer, a bias, an int64 counter), runs
``homagg.allreduce`` over UDP through the switch for every scheme, and reports digests.  The
parent checks every worker's result: bit-identical across workers and schemes, within the
fixed-point bound of the float64 oracle (integers: exactly equal), then prints a table.  Exit
status 0 only if everything is exact.
"""

from __future__ import annotations

import argparse
import hashlib
import threading
import time
from typing import Any

import torch

from ._errors import ConfigError
from .wire import P4_WORDS

__all__ = ["configure_parser", "run", "make_tensors", "worker", "check_result", "run_job"]

SCHEMES = ("auto", "sketch", "compact", "dense")


def make_tensors(rank: int, numel: int, density: float, seed: int = 0) -> list[torch.Tensor]:
    """Worker ``rank``'s gradients, about ``numel`` elements in all (deterministic in the arguments)."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    dim = 64
    rows = max(1, int(numel * 0.6) // dim)
    emb = torch.zeros(rows, dim)
    k = max(1, int(rows * density))
    hot = torch.randperm(rows, generator=g)[:k]
    emb[hot] = torch.randn(k, dim, generator=g) * 1e-2
    n_sp = max(1, int(numel * 0.1))
    sparse = torch.zeros(n_sp)
    m = max(1, int(n_sp * min(1.0, density * 5)))
    sparse[torch.randperm(n_sp, generator=g)[:m]] = torch.randn(m, generator=g)
    dense = torch.randn(max(1, int(numel * 0.3)) // 16, 16, generator=g) * 0.1
    bias = torch.randn(16, generator=g)
    counts = torch.randint(0, 1000, (64,), generator=g, dtype=torch.int64)
    return [emb, sparse, dense, bias, counts]


TENSOR_NAMES = ("embedding", "sparse_fc", "dense_fc", "bias", "counts")


def _digest(ts: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in ts:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank: int, cfg: dict[str, Any], barrier: Any = None, progress: Any = None) -> dict[str, Any]:
    """One worker process: allreduce every tensor with every scheme in ``cfg['schemes']``."""
    from . import WorkerStats, allreduce
    from .jobs import JobSpec
    from .transport import UdpSwitchPort

    torch.set_num_threads(1)
    tensors = make_tensors(rank, cfg["numel"], cfg["density"], cfg["seed"])
    port = UdpSwitchPort(tuple(cfg["data"]), job=JobSpec.from_dict(cfg["job"]), rank=rank,
                         control=tuple(cfg["control"]), timeout=cfg["timeout"])
    out: dict[str, Any] = {}
    try:
        for scheme in cfg["schemes"]:
            if barrier is not None:
                barrier.wait(cfg["timeout"])
            st = WorkerStats()
            t0 = time.perf_counter()
            res = [allreduce(t, port, scheme=scheme, stats=st) for t in tensors]
            dt = time.perf_counter() - t0
            out[scheme] = {"time": dt, "bytes": st.bytes_sent, "digest": _digest(res), "schemes": dict(st.schemes),
                           "results": [r.numpy() for r in res] if rank == 0 or cfg.get("return_all") else None}
            if progress is not None:
                progress.put((rank, scheme))
        out["port_stats"] = dict(port.stats)
    finally:
        port.close()
    return out


def check_result(result: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    """Exactness against the float64 oracle: integers equal, floats within the fixed-point bound."""
    from ._fixedpoint import precision_bits

    exact = torch.stack([t.reshape(-1).to(torch.float64) for t in inputs]).sum(0)
    if not result.dtype.is_floating_point:
        return bool(torch.equal(result.reshape(-1).to(torch.float64), exact))
    w = len(inputs)
    flat = torch.stack([t.reshape(-1).abs().to(torch.float64) for t in inputs]).amax(0)
    n, bs = flat.numel(), 1024
    blocks = torch.nn.functional.pad(flat, (0, (-n) % bs)).reshape(-1, bs).amax(1).repeat_interleave(bs)[:n]
    p = precision_bits(w)
    bound = w * 2.0**-22 * blocks if p >= 24 else w * (2.0 ** (1 - p) + 2.0**-24) * blocks
    return bool(((result.reshape(-1).to(torch.float64) - exact).abs() <= bound).all())


def run_job(cfg: dict[str, Any], world: int, on_progress: Any = None, timeout: float = 600.0) -> list[Any]:
    """Run :func:`worker` on ``world`` processes; progress events go to ``on_progress(rank, scheme)``."""
    from .transport._procs import Workers, context

    ctx = context()
    barrier = ctx.Barrier(world)
    progress = ctx.Queue()
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            try:
                ev = progress.get(timeout=0.1)
            except Exception:  # noqa: BLE001 - queue.Empty
                continue
            if on_progress is not None:
                on_progress(*ev)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        return Workers(worker, world, cfg, barrier, progress).join(timeout)
    finally:
        time.sleep(0.15)
        stop.set()
        t.join(1)


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    p.add_argument("--numel", type=int, default=1_000_000, help="elements per worker, all tensors together")
    p.add_argument("--density", type=float, default=0.01, help="fraction of embedding rows with a gradient")
    p.add_argument("--drop", type=float, default=0.0, help="loss rate injected at the emulator")
    p.add_argument("--switch", help="HOST:PORT of an external switch instead of the embedded emulator")
    p.add_argument("--control", help="HOST:PORT of the external switch's control port (default: port + 1)")
    p.add_argument("--words-per-packet", type=int, help="K (default 2048 with the emulator, 32 external)")
    p.add_argument("--slots", type=int, default=64, help="slots (window) of the job")
    p.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated schemes to run")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds without progress before a worker fails")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    import switch_emulator

    from .transport import ControlClient, parse_addr
    from .transport._procs import RankFailure

    console = Console()
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    if not 1 <= args.workers <= 32 or args.numel < 1 or not 0 < args.density <= 1 or set(schemes) - set(SCHEMES):
        raise ConfigError("need 1 <= --workers <= 32, --numel >= 1, 0 < --density <= 1, known --schemes")
    sw = None
    if args.switch:
        data = parse_addr(args.switch)
        ctl_addr = parse_addr(args.control) if args.control else (data[0], data[1] + 1)
        k = args.words_per_packet or P4_WORDS
    else:
        with console.status("starting the switch emulator on loopback"):
            sw = switch_emulator.spawn(drop=args.drop, seed=args.seed)
        data, ctl_addr = sw.data_addr, sw.control_addr
        k = args.words_per_packet or 2048
    try:
        ctl = ControlClient(ctl_addr)
        job = ctl.admit(args.workers, n_slots=args.slots, words_per_packet=k)
        console.print(f"switch {data[0]}:{data[1]} (control {ctl_addr[0]}:{ctl_addr[1]}), job {job.job_id}: "
                      f"{args.workers} workers, slots {job.slot_base}..{job.slot_base + job.n_slots - 1}, K={k}"
                      + (f", injected loss {args.drop:.1%}" if args.drop else ""))
        cfg = {"numel": args.numel, "density": args.density, "seed": args.seed, "data": list(data),
               "control": list(ctl_addr), "job": job.to_dict(), "timeout": args.timeout, "schemes": schemes}
        with Progress(console=console, transient=True) as prog:
            task = prog.add_task("allreduce (workers x schemes)", total=args.workers * len(schemes))
            results = run_job(cfg, args.workers, lambda r, s: prog.advance(task),
                              timeout=args.timeout * 4 * len(schemes) + 60)
        status = ctl.status()["counters"]
        ctl.remove(job.job_id)
        ctl.close()
    finally:
        if sw is not None:
            sw.stop()
    failed = [r for r in results if isinstance(r, RankFailure)]
    if failed:
        for f in failed:
            console.print(f"[red]worker {f.rank}: {f.type}: {f.message}[/red]")
        return 1
    inputs = [make_tensors(r, args.numel, args.density, args.seed) for r in range(args.workers)]
    logical = sum(t.numel() * t.element_size() for t in inputs[0])
    table = Table(title=f"homagg demo: {args.workers} workers, {logical / 1e6:.2f} MB of gradients per worker")
    for col in ("scheme", "bytes/worker", "time (s)", "goodput (Gbit/s)", "exact"):
        table.add_column(col, justify="right" if col != "scheme" else "left")
    all_ok = True
    ref_digest = None
    for scheme in schemes:
        per = [r[scheme] for r in results]
        same = len({p["digest"] for p in per}) == 1
        res = [torch.from_numpy(a) for a in per[0]["results"]]
        oracle_ok = all(check_result(res[i], [inp[i] for inp in inputs]) for i in range(len(res)))
        cross = ref_digest is None or per[0]["digest"] == ref_digest
        ref_digest = ref_digest or per[0]["digest"]
        ok = same and oracle_ok and cross
        all_ok &= ok
        t = max(p["time"] for p in per)
        b = max(p["bytes"] for p in per)
        table.add_row(scheme, f"{b:,}", f"{t:.3f}", f"{logical * 8 / t / 1e9:.3f}",
                      "[green]yes[/green]" if ok else f"[red]NO[/red] (workers agree={same}, oracle={oracle_ok}, "
                      f"schemes agree={cross})")
    console.print(table)
    retx = sum(r["port_stats"]["retransmits"] for r in results)
    console.print(f"switch: {status['rx']} packets in, {status['tx']} out, {status['dropped']} dropped "
                  f"({status.get('drop_injected', 0) + status.get('drop_injected_egress', 0)} injected); "
                  f"workers retransmitted {retx}")
    console.print("[green]all results exact[/green]" if all_ok else "[red]results NOT exact[/red]")
    return 0 if all_ok else 1
