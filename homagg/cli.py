"""The ``homagg`` command line: one argparse tree, each command implemented in its own module.

Every command module exposes ``configure_parser(parser)`` (adds its options) and
``run(args) -> int`` (the exit status).  Modules are imported only when their command is built,
so ``homagg --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser"]

# (command path, implementing module, one-line help)
COMMANDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("demo",), "homagg._demo", "run a real aggregation: emulator on loopback + worker processes"),
    (("switch",), "switch_emulator._cli", "run the Python switch emulator"),
    (("bench", "codec"), "homagg.bench._codec", "encode/decode throughput of every scheme"),
    (("bench", "switch"), "homagg.bench._switch", "emulator goodput vs gloo allreduce"),
    (("bench", "ddp"), "homagg.bench._ddp", "DDP step time, homagg vs gloo"),
    (("bench", "allreduce"), "homagg.bench._allreduce", "dist.all_reduce, homagg vs gloo: density x size x world x scheme"),
    (("bench", "p4rate"), "homagg.bench._p4rate", "BMv2 packet rate on homagg.p4 (needs the BMv2 tools)"),
    (("p4", "build"), "homagg.p4._build", "compile p4/homagg.p4 with p4c-bm2-ss"),
    (("control",), "homagg.p4._control", "P4Runtime controller for a BMv2 switch"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="homagg", description="Lossless in-network gradient aggregation.")
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): parser.add_subparsers(dest="command", required=True)}
    parents: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for path, module_name, help_text in COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # command not part of this installation
            raise
        for depth in range(1, len(path)):
            prefix = path[:depth]
            if prefix not in groups:
                sub = groups[path[: depth - 1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                parents[prefix] = sub
                groups[prefix] = sub.add_subparsers(dest=f"{'_'.join(prefix)}_command", required=True)
        cmd = groups[path[:-1]].add_parser(path[-1], help=help_text, description=help_text)
        module.configure_parser(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ._errors import HomAggError

    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except HomAggError as exc:
        print(f"homagg: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
