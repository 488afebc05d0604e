"""``homagg control``: drive BMv2 ``simple_switch_grpc`` switches running homagg.p4 from a job file.

The job file is the emulator's (JSON or TOML, :func:`homagg.jobs.load_jobs`) plus a ``bmv2``
section naming the switches (:mod:`homagg.p4._switches`).  Operations, each idempotent:
``push`` (pipeline, unless the device already runs the same build), ``configure`` (service
address, L2 entries, flood group), ``add`` / ``remove`` (jobs; ``--job`` selects), ``counters``
(drop reasons and packets per worker, as JSON), ``check`` (the device runs this build), ``setup``
(push + configure + add).  A switch with its own ``jobs`` (a tree: :mod:`homagg.p4._switches`)
adds and removes those instead of the file's.  The work is done by :class:`homagg.p4.Controller`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .._errors import ConfigError
from .._options import seconds
from ..jobs import load_jobs
from ._controller import Controller
from ._switches import load_switches

__all__ = ["OPS", "configure_parser", "run"]

#: the operations of ``homagg control``
OPS = ("push", "configure", "add", "remove", "counters", "check", "setup")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("op", choices=OPS, help="setup = push + configure + add every job of --config")
    parser.add_argument("--config", type=Path, required=True,
                        help="job description file (.json or .toml) with a bmv2 section")
    parser.add_argument("--switch", default=None, help="name of the switch in the file (default: all)")
    parser.add_argument("--job", type=int, action="append", default=None, help="job id (default: all jobs)")
    parser.add_argument("--p4info", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="BMv2 JSON (default p4/build/homagg.json)")
    parser.add_argument("--force", action="store_true", help="push even if the device runs the same build")
    parser.add_argument("--timeout", type=float, default=10.0)


def run(args: argparse.Namespace) -> int:
    seconds("--timeout", args.timeout)
    switches = [s for s in load_switches(args.config) if args.switch in (None, s.name)]
    if not switches:
        raise ConfigError(f"no switch named {args.switch!r} in {args.config}")
    in_file = load_jobs(args.config)
    ids = sorted({j.job_id for j in in_file} | {j.job_id for s in switches for j in s.jobs})
    unknown = sorted(set(args.job or ()) - set(ids))
    if unknown:
        raise ConfigError(f"--job {unknown[0]}: no job with this id in {args.config} (its jobs: "
                          f"{', '.join(str(i) for i in ids) or 'none'})")
    jobs = [j for j in in_file if args.job is None or j.job_id in args.job]
    report: dict[str, Any] = {}
    for sw in switches:
        with Controller(sw.grpc, sw.device_id, p4info=args.p4info, bmv2_json=args.json,
                        timeout=args.timeout) as ctl:
            if args.op in ("push", "setup"):
                report[sw.name] = {"pushed": ctl.push(force=args.force)}
            else:
                ctl.check_pipeline()
            if args.op in ("configure", "setup"):
                ctl.configure(sw)
            own = [j for j in sw.jobs if args.job is None or j.job_id in args.job] if sw.jobs else jobs
            if args.op in ("add", "setup") and sw.service_ip:
                for j in own:
                    ctl.add_job(sw, j)
            if args.op == "remove":
                for j in own:
                    ctl.remove_job(sw, j)
            if args.op == "counters":
                report[sw.name] = ctl.read_counters()
            if args.op == "check":
                report[sw.name] = "ok"
    print(json.dumps(report, indent=2))
    return 0
