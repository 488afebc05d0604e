"""The ``homagg`` command line: one argparse tree, each command implemented in its own module.

Every command module exposes ``configure_parser(parser)`` (adds its options) and
``run(args) -> int`` (the exit status).  The tree is built lazily: every command of
:data:`COMMANDS` is listed (``homagg --help``, ``homagg bench --help``) from its one-line help,
but only the module of the command named on the command line is imported and configured, so
``homagg --help`` imports neither torch nor the emulator.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["COMMANDS", "main", "build_parser"]

# (command path, implementing module, one-line help)
COMMANDS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("demo",), "homagg._demo", "run a real aggregation: emulator on loopback + worker processes"),
    (("switch",), "switch_emulator._cli", "run the Python switch emulator"),
    (("bench", "codec"), "homagg.bench._codec", "encode/decode throughput of every scheme"),
    (("bench", "gpu"), "homagg.bench._gpu", "the codec on device tensors: encode/decode, syncs, host<->device bytes vs torch.add"),
    (("bench", "precision"), "homagg.bench._precision", "error on real gradients at W = 64..1024 vs float64, beside an fp32 ring sum"),
    (("bench", "switch"), "homagg.bench._switch", "emulator goodput vs gloo allreduce"),
    (("bench", "ddp"), "homagg.bench._ddp", "DDP step time, homagg vs gloo"),
    (("bench", "allreduce"), "homagg.bench._allreduce", "dist.all_reduce, homagg vs gloo: density x size x world x scheme"),
    (("bench", "latency"), "homagg.bench._latency", "small all_reduce calls: p50/p90/p99 per call, homagg vs gloo, and one emulator round trip"),
    (("bench", "net"), "homagg.bench._net", "all_reduce on rate-shaped links (netns + tc, root): homagg vs gloo ring"),
    (("bench", "models"), "homagg.bench._models", "DDP iteration time of NCF, LSTM, VGG19, BERT on shaped links (root): homagg vs gloo, PowerSGD, fp16"),
    (("bench", "compress"), "homagg.bench._convergence", "convergence of compressed DDP training (top-k, DGC, 1-bit, TernGrad, QSGD, PowerSGD) vs exact"),
    (("bench", "faults"), "homagg.bench._faults", "reliability figures: soak under loss, fuzzed datagrams, loss-rate sweep"),
    (("bench", "p4rate"), "homagg.bench._p4rate", "BMv2 packet rate on homagg.p4 (needs the BMv2 tools)"),
    (("torchsuite",), "homagg.torch._suite", "run PyTorch's distributed test suite against homagg and gloo; fail on regressions"),
    (("p4", "build"), "homagg.p4._build", "compile p4/homagg.p4 with p4c-bm2-ss (--target tofino|tofino2: p4/tofino with bf-p4c)"),
    (("control",), "homagg.p4._control", "P4Runtime controller for a BMv2 switch"),
    (("mininet",), "topologies.runner", "an experiment on a Mininet topology (star, two_tier; emulator or BMv2; root)"),
)


def selected_command(argv: Sequence[str]) -> tuple[str, ...] | None:
    """The path of :data:`COMMANDS` that ``argv`` names (its leading words), or None."""
    words = [a for a in argv if not a.startswith("-")]
    for path, _, _ in COMMANDS:
        if tuple(words[: len(path)]) == path:
            return path
    return None


def _installed(module_name: str) -> bool:
    """Whether the command's top-level package exists (found without importing anything)."""
    return importlib.util.find_spec(module_name.partition(".")[0]) is not None


def build_parser(argv: Sequence[str] | None = None, *, configure: Sequence[tuple[str, ...]] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; the commands in ``configure`` (default: the one ``argv``
    selects, see :func:`selected_command`) import their module and get their options."""
    if configure is None:
        chosen = selected_command(sys.argv[1:] if argv is None else argv)
        configure = () if chosen is None else (chosen,)
    parser = argparse.ArgumentParser(prog="homagg", description="Lossless in-network gradient aggregation.")
    groups: dict[tuple[str, ...], Any] = {(): parser.add_subparsers(dest="command", required=True)}
    for path, module_name, help_text in COMMANDS:
        if not _installed(module_name):
            continue  # command not part of this installation
        for depth in range(1, len(path)):
            prefix = path[:depth]
            if prefix not in groups:
                sub = groups[path[: depth - 1]].add_parser(prefix[-1], help=f"{prefix[-1]} commands")
                groups[prefix] = sub.add_subparsers(dest=f"{'_'.join(prefix)}_command", required=True)
        cmd = groups[path[:-1]].add_parser(path[-1], help=help_text, description=help_text)
        cmd.set_defaults(_path=path)
        if path in configure:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name and module_name.startswith(exc.name):
                    parser.error(f"command '{' '.join(path)}' is not part of this installation ({exc.name})")
                raise
            module.configure_parser(cmd)
            cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from ._errors import HomAggError

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    if not hasattr(args, "_run"):  # argv named the command in a way selected_command did not see
        args = build_parser(argv, configure=(args._path,)).parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except HomAggError as exc:
        print(f"homagg: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
