"""``homagg bench gpu``: the codec on device tensors, per scheme, beside a plain ``torch.add``.

For each density and scheme: a job of ``--workers`` workers (threads, in-process switch, in place,
one history each) runs ``--repeats`` + 4 calls of the same inputs and worker 0's rounds are recorded;
worker 0 then replays them alone (:mod:`homagg.bench._gpu_replay`): the first call (exponents
agreed), one warm-up and ``--repeats`` timed steady-state calls (medians: encode = up to each
round's hand-over, device work included; decode = after the last round), one call counted and one
profiled.  Per steady call it reports:

* ``syncs``: synchronisations the CUDA runtime was asked for (``set_sync_debug_mode("warn")``)
  and ``host_reads``: torch calls that read a device tensor (``HostReads``), with the lines;
  on a CPU the host reads of the same call through the device path (``device_paths``);
* ``h2d_bytes``/``d2h_bytes`` (memcpy events of the profiler's trace), ``kernels`` launched,
  ``gpu_busy_s`` (their summed durations) and ``cpu_ops_s`` (the profiler's top-level torch ops);
* ``ratio_to_add``: (encode + decode) / the median of a ``torch.add`` of two tensors of the same
  size and dtype (device events), measured in the same run.

Worker 0's result of every replayed call is checked bit for bit against the job's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from .. import _options as opt
from .._errors import ConfigError
from ..testing import ResultMismatchError
from ..codec._config import SCHEMES
from ..codec._history import History
from ._gpu_replay import ReplayPort, record, replay_call, timed_call
from ._syncs import HostReads, cuda_syncs, device_paths
from ..wire import MAX_WORKERS

__all__ = ["configure_parser", "run", "measure"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--numel", type=int, default=25_000_000, help="elements per tensor (default 25M)")
    p.add_argument("--densities", default="0.01,1.0", help="nonzero fractions per worker (default 0.01,1.0)")
    p.add_argument("--workers", type=int, default=4, help="workers of the recorded job (default 4)")
    p.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated schemes")
    p.add_argument("--repeats", type=int, default=7, help="timed steady-state calls per scheme (medians)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    p.add_argument("--profile-table", type=Path, help="write the profiler's per-op tables to this file")
    p.add_argument("--json", type=Path, help="write the records to this file")
    p.add_argument("--option", action="append", default=[], metavar="NAME=INT",
                   help="codec option for every call (e.g. segment=8388608), repeatable")


def _inputs(numel: int, density: float, workers: int, device: str) -> list[torch.Tensor]:
    """Per-worker float32 inputs: ``density`` of the elements nonzero (half shared), or dense."""
    g = torch.Generator(device).manual_seed(0)
    if density >= 1.0:
        return [torch.randn(numel, device=device, generator=g) for _ in range(workers)]
    nnz = int(numel * density)
    shared = torch.randint(0, numel, (nnz // 2,), device=device, generator=g)
    out = []
    for _ in range(workers):
        pos = torch.cat([shared, torch.randint(0, numel, (nnz - nnz // 2,), device=device, generator=g)])
        x = torch.zeros(numel, device=device)
        x[pos] = torch.randn(pos.numel(), device=device, generator=g)
        out.append(x)
    return out


def _sync_for(device: str):  # noqa: ANN202 - a callable
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def time_add(numel: int, repeats: int, device: str) -> dict[str, float]:
    """Median seconds of ``torch.add`` of two float32 tensors of ``numel`` elements: device time
    (CUDA events) and wall time up to a synchronisation."""
    a, b = torch.randn(numel, device=device), torch.randn(numel, device=device)
    sync = _sync_for(device)
    for _ in range(3):
        torch.add(a, b)
    sync()
    walls, events = [], []
    for _ in range(max(5, 3 * repeats)):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.add(a, b)
            end.record()
            end.synchronize()
            events.append(start.elapsed_time(end) / 1e3)
        t0 = time.perf_counter()
        torch.add(a, b)
        sync()
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    return {"add_s": statistics.median(events) if events else wall, "add_wall_s": wall}


def launch_overhead(device: str, ops: int = 200) -> float:
    """Median seconds per small torch op (an in-place add on 1024 elements) issued back to back,
    up to a synchronisation: what each of the codec's torch calls costs at least on this host."""
    x = torch.zeros(1024, device=device)
    sync = _sync_for(device)
    runs = []
    for _ in range(7):
        sync()
        t0 = time.perf_counter()
        for _ in range(ops):
            x.add_(1.0)
        sync()
        runs.append((time.perf_counter() - t0) / ops)
    return statistics.median(runs)


def _profile(fn, device: str, table_sink: list[str], title: str) -> dict[str, Any]:  # noqa: ANN001
    """Run ``fn`` under the profiler; the trace's memcpy bytes, kernels and op times."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        fn()
        _sync_for(device)()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.loads(Path(f.name).read_text())
    out: dict[str, Any] = {"h2d_bytes": 0, "d2h_bytes": 0, "d2d_bytes": 0, "kernels": 0, "gpu_busy_s": 0.0,
                           "stream_syncs": 0, "cpu_ops": 0}
    for ev in trace.get("traceEvents", []):
        cat, name = ev.get("cat", ""), ev.get("name", "")
        if cat == "gpu_memcpy":
            kind = "h2d_bytes" if "HtoD" in name else "d2h_bytes" if "DtoH" in name else "d2d_bytes"
            out[kind] += int(ev.get("args", {}).get("bytes", 0))
        elif cat == "kernel":
            out["kernels"] += 1
            out["gpu_busy_s"] += ev.get("dur", 0) / 1e6
        elif cat == "cuda_runtime" and "Synchronize" in name:
            out["stream_syncs"] += 1
        elif cat == "cpu_op":
            out["cpu_ops"] += 1
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table_sink.append(f"## {title}\n{prof.key_averages().table(sort_by=sort, row_limit=25)}\n")
    return out


def measure(numel: int, density: float, schemes: list[str], workers: int, repeats: int, device: str,
            tables: list[str], **options: Any) -> list[dict[str, Any]]:
    tensors = _inputs(numel, density, workers, device)
    base = {**time_add(numel, repeats, device), "op_overhead_s": launch_overhead(device)}
    sync = _sync_for(device)
    records = []
    for scheme in schemes:
        calls = repeats + 4  # first, warm-up, timed..., counted, profiled
        rec = record(tensors, scheme, calls, **options)
        history = History()
        times = []
        for c in range(calls - 2):
            t, out = timed_call(tensors[0].clone(), rec.rounds[c], workers, history, scheme, sync, **options)
            if not torch.equal(out, rec.results[c]):
                raise ResultMismatchError(f"{scheme}: replayed call {c} differs from the job's result")
            times.append(t)
        steady = times[2:]
        x, port = tensors[0].clone(), ReplayPort(rec.rounds[calls - 2], workers, None)
        sync()
        reads = HostReads()
        others: list[str] = []
        if device.startswith("cuda"):
            with cuda_syncs() as found, reads:
                replay_call(x, port, history, scheme, **options)
            syncs: int = found.count
            sync_sites, others = dict(found.sites), found.others
        else:  # a CPU: the host reads of the same call through the code path of device tensors
            with device_paths(), reads:
                replay_call(x, port, history, scheme, **options)
            syncs, sync_sites = reads.total, dict(reads.sites)
        x, port = tensors[0].clone(), ReplayPort(rec.rounds[calls - 1], workers, None)
        sync()
        prof = _profile(lambda: replay_call(x, port, history, scheme, **options), device, tables,
                        f"{scheme}, density {density}")
        enc = statistics.median(t.encode_s for t in steady)
        dec = statistics.median(t.decode_s for t in steady)
        records.append({
            "scheme": scheme, "resolved": "+".join(sorted(rec.stats.schemes)), "numel": numel, "density": density,
            "workers": workers, "device": device, "repeats": repeats, "options": options,
            "first_call_s": times[0].encode_s + times[0].decode_s, "rounds_first": times[0].rounds,
            "encode_s": enc, "decode_s": dec, "rounds_steady": steady[-1].rounds,
            "syncs": syncs, "sync_sites": sync_sites, "other_warnings": others, "host_reads": reads.total,
            "host_read_sites": dict(reads.sites),
            "torch_calls": reads.calls, **prof, **base, "ratio_to_add": (enc + dec) / base["add_s"],
            "us_per_torch_call": (enc + dec) / max(1, reads.calls) * 1e6,
        })
    return records


def _options(pairs: list[str]) -> dict[str, int]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise ConfigError(f"--option takes NAME=INT, got {pair!r}") from None
        if not sep:
            raise ConfigError(f"--option takes NAME=INT, got {pair!r}")
    return out


def _versions(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "device": device, "date": time.strftime("%Y-%m-%d")}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["cuda"] = torch.version.cuda
    return info


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from ._report import print_table

    densities = [float(d) for d in args.densities.split(",") if d.strip()]
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    opt.count("--numel", args.numel)
    opt.count("--workers", args.workers, 1, MAX_WORKERS, why="homagg's worker bitmap")
    opt.count("--repeats", args.repeats)
    for density in densities or [float("nan")]:
        opt.within("--densities", density, "(0, 1]")
    opt.names("--schemes", schemes, SCHEMES, args.schemes)
    options = _options(args.option)
    tables: list[str] = []
    records = [r for d in densities for r in measure(args.numel, d, schemes, args.workers, args.repeats,
                                                      args.device, tables, **options)]
    info = _versions(args.device)
    title = (f"codec on {info.get('gpu', args.device)} (torch {info['torch']}): {args.numel:,} float32 elements, "
             f"{args.workers} workers, steady-state medians of {args.repeats}")
    table = Table(title=title)
    for col in ("density", "scheme", "first ms", "encode ms", "decode ms", "(enc+dec)/add", "syncs", "host reads",
                "H2D B", "D2H B", "kernels", "GPU busy ms", "torch calls"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in records:
        table.add_row(f"{r['density']:g}", f"{r['scheme']} ({r['resolved']})" if r["scheme"] == "auto" else r["scheme"],
                      f"{r['first_call_s'] * 1e3:.3f}", f"{r['encode_s'] * 1e3:.3f}", f"{r['decode_s'] * 1e3:.3f}",
                      f"{r['ratio_to_add']:.2f}", str(r["syncs"]), str(r["host_reads"]), f"{r['h2d_bytes']:,}",
                      f"{r['d2h_bytes']:,}", str(r["kernels"]), f"{r['gpu_busy_s'] * 1e3:.3f}", str(r["torch_calls"]))
    print_table(Console(), table)
    print(f"torch.add of two {args.numel:,}-element float32 tensors: {records[0]['add_s'] * 1e3:.3f} ms (device "
          f"events), {records[0]['add_wall_s'] * 1e3:.3f} ms to a synchronisation; a small torch op issued back to "
          f"back: {records[0]['op_overhead_s'] * 1e6:.1f} us")
    for r in records:
        print(f"{r['density']:g} {r['scheme']}: {r['torch_calls']} torch calls per steady call, "
              f"{r['us_per_torch_call']:.1f} us each on average; GPU busy {r['gpu_busy_s'] * 1e3:.3f} ms in "
              f"{r['kernels']} kernels; D2D {r['d2d_bytes']:,} B" + (f"; other warnings {r['other_warnings']}"
                                                                       if r["other_warnings"] else ""))
    for r in records:
        if r["sync_sites"]:
            print(f"{r['density']:g} {r['scheme']}: synchronisations at {r['sync_sites']}")
    if args.profile_table:
        args.profile_table.write_text("\n".join(tables))
    if args.json:
        args.json.write_text(json.dumps({"info": info, "records": records}, indent=2) + "\n")
    return 0
