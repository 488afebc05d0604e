"""The numeric options of ``homagg bench faults`` checked before any part starts (:mod:`homagg._options`).

Each bad value is a :class:`~homagg.ConfigError` naming the option and what it accepts, where it
used to start a switch that refused it (``--soak-loss 2``), end in a traceback (``--fuzz-rate
0``, ``--loss-iters 0``, ``--timeout nan``), hang (``--duration nan``) or measure nothing and
report success (``--fuzz -1``, ``--parts foo``, ``--crash-steps 0``).  The ``--chaos-*`` options
are the chaos soak's own (:mod:`homagg.bench._chaos`).
"""

from __future__ import annotations

import argparse

from .. import _options as opt
from .._errors import ConfigError
from ..wire import MAX_WORKERS

__all__ = ["PARTS", "check_faults_args"]

#: the parts ``--parts`` may name
PARTS = ("soak", "fuzz", "loss", "crash", "chaos")


def check_faults_args(args: argparse.Namespace) -> None:
    """:class:`~homagg.ConfigError` naming the first option of ``args`` out of range (values as given,
    before ``--quick`` shortens them)."""
    opt.names("--parts", [p.strip() for p in args.parts.split(",") if p.strip()], PARTS, args.parts)
    opt.count("--workers", args.workers, 1, MAX_WORKERS, why="homagg's worker bitmap")
    opt.seconds("--duration", args.duration)
    opt.within("--soak-loss", args.soak_loss, "[0, 1)")
    opt.within("--rss-bound-mib", args.rss_bound_mib, "[0, inf)")
    opt.count("--fuzz", args.fuzz)
    opt.positive("--fuzz-rate", args.fuzz_rate, "datagrams/s")
    try:
        rates = [float(r) for r in args.loss_rates.split(",") if r.strip()]
    except ValueError:
        rates = []
    if not rates:
        raise ConfigError(f"--loss-rates {args.loss_rates!r}: need loss rates in [0, 1), comma-separated")
    for rate in rates:
        opt.within("--loss-rates", rate, "[0, 1)")
    opt.count("--loss-iters", args.loss_iters)
    opt.count("--loss-numel", args.loss_numel)
    opt.seconds("--timeout", args.timeout)
    opt.count("--crash-world", args.crash_world, 1, MAX_WORKERS, why="homagg's worker bitmap")
    opt.count("--crash-steps", args.crash_steps)
    opt.count("--crash-at", args.crash_at, 0, args.crash_steps - 1, why="a step of --crash-steps")
    opt.seconds("--crash-probe", args.crash_probe)
    opt.count("--crash-width", args.crash_width)
    opt.within("--crash-step-s", args.crash_step_s, "[0, inf)")
