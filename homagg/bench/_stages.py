"""Where a small all_reduce spends its time, stage by stage (issue 39's profile): a developer's tool,
``python -m homagg.bench._stages --world 2 --numel 1,16384``.

Timers are put around the functions of one call's path (wrapped in place, in this process only;
nothing in the package changes): each records its *exclusive* wall and thread-CPU time (its own,
less that of the wrapped functions it called), per thread, and the stages group them
(:data:`STAGES`).  Three hand-offs are measured as gaps between two timestamps: ``submit``'s
return to the worker thread's start of the task (``FifoWorker._run``), the caller's
``dist.all_reduce`` entry to the group's ``allreduce`` (torch's dispatch), and ``Work._complete``
to the caller's ``wait`` returning (the wake-up).  What no wrapper covers is ``other``.

Two forms: ``--mode pg`` (default) -- ``world`` rank processes on loopback (the launcher of
``bench allreduce``), each with ``init_process_group("homagg")``, ``--calls`` timed calls of
``dist.all_reduce`` on a fresh fp32 tensor after ``--warmup``; ``--mode local`` -- the in-process
harness :func:`homagg.testing.run_local` (workers on threads of this process, the in-process
switch, threads started per call).  Per stage: the median over calls of its per-call time, per
rank, then the median over ranks (``pg``) or the mean over workers (``local``).  The timers cost
about a microsecond each; ``instrumented_s`` and ``plain_s`` are the median call without and
with them (``pg``: measured in the same ranks, plain first).
"""

from __future__ import annotations

import argparse
import json
import sys

from ._stage_timers import GAPS, STAGES, TOTAL, WAIT

__all__ = ["STAGES", "GAPS", "WAIT", "TOTAL", "main"]


def main(argv: list[str] | None = None) -> int:
    from ._stages_run import run_local_mode, run_pg_mode, run_rank

    p = argparse.ArgumentParser(prog="python -m homagg.bench._stages", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("pg", "local"), default="pg")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--numel", default="1,16384", help="fp32 elements, comma list (16384: 64 KB)")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--json", default=None)
    p.add_argument("--barrier", action="store_true", help="pg: a dist.barrier() before every call (untimed), as in bench allreduce")
    p.add_argument("--_rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not 1 <= args.world <= 32 or args.calls < 1 or args.warmup < 0:
        p.error("--world 1..32, --calls >= 1, --warmup >= 0")
    numels = [int(n) for n in args.numel.split(",") if n.strip()]
    if args._rank:
        return run_rank(numels, args.calls, args.warmup, args.barrier)
    if args.mode == "local":
        result = run_local_mode(args.world, numels, args.calls, args.warmup)
    else:
        result = run_pg_mode(args.world, numels, args.calls, args.warmup, args.barrier)
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    for numel, table in result["tables"].items():
        print(f"\n{args.mode}, world {args.world}, {numel} fp32 elements: plain median {result['plain_us'][numel]:.0f} us, "
              f"instrumented {table[TOTAL]['wall_us']:.0f} us")
        for stage, v in table.items():
            print(f"  {stage:<62} wall {v['wall_us']:8.1f} us  cpu {v['cpu_us']:8.1f} us  (mean {v['wall_mean_us']:.1f})")
    if result.get("missing"):
        print(f"not wrapped (not found): {result['missing']}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
