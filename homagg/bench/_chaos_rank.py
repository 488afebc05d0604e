"""One rank of ``homagg bench faults --chaos``: DDP training on the embedded default while the
launcher injects faults (:mod:`._chaos`).

Run as ``python -m homagg.bench._chaos_rank CONFIG_JSON`` (one process per rank,
``init_process_group("homagg")`` from the environment, no ``HOMAGG_SWITCH``: the group's own
embedded emulator).  The model is the ``crash`` part's 3-layer MLP of ``width`` (float32, SGD:
:func:`._crash_rank.mlp`); each rank's batches are seeded by (seed, step, rank), so two runs with the same config and step count compute the same
thing.  Each step ends with one int32 allreduce of a stop flag (through the group, like the
gradients): the disturbed run stops when rank 0's clock passes ``duration`` seconds, the
undisturbed one after ``steps`` steps; both issue the same calls.

Talks to the launcher through its stdout (:data:`PROGRESS_MARK` lines, one per phase and step:
the watchdog's heartbeat) and files in ``out_dir``:

* ``emulator.json`` (rank 0 only, rewritten atomically when it changes): the pid, control address
  and control secret of the group's current embedded emulator and the group's path, so the
  launcher can inject faults into the emulator the group is using (``out_dir`` is private: 0700);
* ``rank{r}.stack``: every thread's stack, written by :mod:`faulthandler` on ``SIGUSR1`` (the
  watchdog sends it before it kills a hung rank);
* ``rank{r}.pt``: the final parameters (the launcher compares them exactly).

Ends with one :data:`~homagg.bench._ranks.RECORD_MARK` line: per step its wall time, path and loss,
the group's path statistics, every warning by category, and any exception raised in a thread.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ._crash_rank import batch, mlp, train_step
from ._ranks import RECORD_MARK, die_with_launcher

__all__ = ["PROGRESS_MARK", "main"]

#: prefix of a rank's progress line (JSON: ``phase``, ``step``, ``path``, ``pid``)
PROGRESS_MARK = "@homagg-chaos-progress@"


def _progress(**fields: Any) -> None:
    print(PROGRESS_MARK + json.dumps(fields), flush=True)


def _publish_emulator(pg: Any, out: Path, last: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """Rank 0: write ``emulator.json`` when the group's emulator or path changed; returns what was
    written last (the key to compare with next time)."""
    emulator = pg.switch.emulator if pg.path == "switch" else None
    process = getattr(emulator, "process", None)
    key = (pg.path, process.pid if process is not None else None)
    if key == last:
        return last
    info: dict[str, Any] = {"path": pg.path, "pid": key[1]}
    if emulator is not None:
        info.update(control=list(emulator.control_addr), secret=emulator.secret)
    tmp = out / "emulator.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, out / "emulator.json")
    return key


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    die_with_launcher()
    rank = int(os.environ["RANK"])
    out = Path(cfg["out_dir"])
    stack_file = open(out / f"rank{rank}.stack", "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    thread_errors: list[str] = []

    def on_thread_error(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else "?"
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        thread_errors.append(f"thread {name}: {text[-1500:]}")
        print(f"homagg chaos rank {rank}: exception in thread {name}:\n{text}", file=sys.stderr, flush=True)

    threading.excepthook = on_thread_error
    seen: dict[str, int] = {}
    other: list[str] = []

    def on_warning(message: Any, category: type[Warning], filename: str, lineno: int, *_: Any, **__: Any) -> None:
        seen[category.__name__] = seen.get(category.__name__, 0) + 1
        if category.__name__ != "PathWarning" and len(other) < 20:
            other.append(f"{category.__name__} ({os.path.basename(filename)}:{lineno}): {str(message)[:300]}")

    warnings.simplefilter("always")
    warnings.showwarning = on_warning
    _progress(phase="init", pid=os.getpid(), rank=rank)
    dist.init_process_group("homagg")
    pg = dist.distributed_c10d._get_default_group()
    width = cfg["width"]
    model, opt = mlp(cfg["seed"], width)
    published = _publish_emulator(pg, out, None) if rank == 0 else None
    _progress(phase="ready", pid=os.getpid(), rank=rank)
    steps_s: list[float] = []
    paths: list[str] = []
    losses: list[float] = []
    start = time.monotonic()
    step = 0
    while True:
        x, y = batch(cfg["seed"], step, rank, width)
        t0 = time.perf_counter()
        loss = train_step(model, opt, x, y)
        if cfg.get("steps") is not None:
            stop = int(step + 1 >= cfg["steps"])
        else:
            stop = int(rank == 0 and time.monotonic() - start >= cfg["duration"])
        flag = torch.tensor([stop], dtype=torch.int32)
        dist.all_reduce(flag)
        steps_s.append(time.perf_counter() - t0)
        paths.append(pg.path)
        losses.append(loss.item())
        step += 1
        if rank == 0:
            published = _publish_emulator(pg, out, published)
        _progress(phase="step", step=step, path=pg.path)
        if int(flag[0]):
            break
        time.sleep(cfg["step_s"])
    torch.save([p.detach().clone() for p in model.parameters()], out / f"rank{rank}.pt")
    stats = {"paths": dict(pg.stats.paths), "transitions": list(pg.stats.transitions)}
    _progress(phase="closing", step=step)
    dist.destroy_process_group()
    print(RECORD_MARK + json.dumps({
        "rank": rank, "step_s": steps_s, "paths": paths, "losses": losses,
        "params": sum(p.numel() for p in model.parameters()), "stats_paths": stats["paths"],
        "transitions": stats["transitions"], "warnings": seen, "other_warnings": other,
        "thread_errors": thread_errors, "run_s": time.monotonic() - start,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
