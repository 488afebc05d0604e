"""Result multicast in the namespace star of ``homagg bench net`` (root; skipped otherwise).

With ``replication="multicast"`` the emulator sends each completed bank once, to the job's group
on the switch host's bridge, and the bridge floods it to every worker link; with ``"unicast"`` it
sends one datagram per worker.  A real ``dist.all_reduce`` through the emulator must be exact
either way (int64: equal to the exact sum, rebuilt here from the ranks' seeds; float32: within
the codec's bound of the float64 sum, checked in the rank), every worker port must report
whether it receives results from the group, and the emulator's own counters must show one send
per completed bank (multicast) or W (unicast).  Running this file as a script is one rank.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
import torch

ROOT_AND_TOOLS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
MARK = "@multicast-test@"
NUMEL = 300_000
WORLD = 3
needs_root = pytest.mark.skipif(not ROOT_AND_TOOLS, reason="needs root and iproute2 (ip, tc) for network namespaces")


def _inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s int64 and float32 tensors (deterministic; mostly zeros, some large values)."""
    g = torch.Generator().manual_seed(1000 + rank)
    ints = torch.randint(-(1 << 40), 1 << 40, (NUMEL,), generator=g, dtype=torch.int64)
    ints[torch.rand(NUMEL, generator=g) < 0.5] = 0
    floats = torch.randn(NUMEL, generator=g, dtype=torch.float32) * 1e3
    floats[torch.rand(NUMEL, generator=g) < 0.9] = 0.0
    return ints, floats


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _run_star(replication: str) -> list[dict[str, Any]]:
    from homagg.bench._netns import StarNet

    before = _namespaces()
    with StarNet(WORLD, 1000.0, replication=replication) as net:
        outs = net.launch([sys.executable, os.path.abspath(__file__)], WORLD, label=f"multicast test ({replication})",
                          stall_timeout=120)
    assert _namespaces() - before == set()  # every namespace deleted again
    reports = [[json.loads(ln.partition(MARK)[2]) for ln in lines if MARK in ln] for lines in outs]
    assert all(len(r) == 1 for r in reports), outs
    return [r[0] for r in reports]


@needs_root
@pytest.mark.parametrize("replication", ["multicast", "unicast"])
def test_all_reduce_through_the_star(replication: str) -> None:
    reports = _run_star(replication)
    from homagg.testing import exact_sum

    want = _digest(exact_sum([_inputs(r)[0] for r in range(WORLD)]))
    for rank, rep in enumerate(reports):
        assert rep["int_digest"] == want, f"rank {rank}: int64 result differs from the exact sum"
        assert rep["float_within_bound"] is True, f"rank {rank}: {rep['float_error']}"
        assert rep["port_stats"]["multicast"] == (replication == "multicast"), (rank, rep["port_stats"])
        assert rep["port_stats"]["results"] > 0
    c = reports[0]["switch_counters"]
    nonzero = {k: v for k, v in c.items() if v}
    # the only drops: copies of retransmissions (a loaded host can make a timer fire) or of the stall
    # probes a rank waiting 0.5 s for a late one at the barrier sends (loss_probes), never another reason
    resent = sum(rep["port_stats"]["retransmits"] + rep["port_stats"].get("loss_probes", 0) for rep in reports)
    assert c["completed"] > 0 and c["dropped"] == c["drop_duplicate"] + c["drop_stale"], f"switch counters: {nonzero}"
    assert c["dropped"] + c["retransmit_answered"] <= resent, f"switch counters: {nonzero}; retransmitted {resent}"
    copies = 1 if replication == "multicast" else WORLD
    # every completion is sent `copies` times; a retransmission of a completed bank adds one unicast answer
    assert c["tx"] - c["retransmit_answered"] == copies * c["completed"], c


def test_an_unknown_replication_is_refused() -> None:
    from homagg import ConfigError
    from homagg.bench._netns import StarNet

    with pytest.raises(ConfigError, match="replication"):
        StarNet(2, 1000.0, replication="broadcast")
    assert StarNet(2, 1000.0, replication="unicast").replication == "unicast"


@pytest.mark.parametrize("command", [["bench", "net"], ["bench", "models"]])
def test_the_replication_option_parses(command: list[str]) -> None:
    from homagg.cli import build_parser

    parser = build_parser(command)
    assert parser.parse_args(command).replication == "multicast"
    assert parser.parse_args([*command, "--replication", "unicast"]).replication == "unicast"
    with pytest.raises(SystemExit):
        parser.parse_args([*command, "--replication", "broadcast"])


def _rank_main() -> None:
    """One rank, inside its worker namespace: all_reduce both tensors, report on stdout."""
    from datetime import timedelta

    import torch.distributed as dist

    import homagg.torch  # noqa: F401 - registers the backend
    from homagg.bench._ranks import die_with_launcher
    from homagg.testing import check_within_bound
    from homagg.transport import ControlClient
    from homagg.transport._auth import SECRET_ENV

    die_with_launcher()
    torch.set_num_threads(1)
    dist.init_process_group("homagg", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        pg = dist.distributed_c10d._get_default_group()
        ints, floats = _inputs(rank)
        dist.all_reduce(ints)
        dist.all_reduce(floats)
        try:
            check_within_bound(floats, [_inputs(r)[1] for r in range(world)])
            within, error = True, ""
        except Exception as exc:  # noqa: BLE001 - reported to the test
            within, error = False, repr(exc)
        report: dict[str, Any] = {"int_digest": _digest(ints), "float_within_bound": within, "float_error": error}
        dist.barrier()  # a switch round: its datagrams (and a late rank's retransmissions) are in the stats
        report["port_stats"] = dict(pg.switch.port.stats)
        if rank == 0:
            import time

            time.sleep(0.3)  # every rank is done: no datagram in flight while the counters are read
            with ControlClient(pg.switch.control, secret=os.environ[SECRET_ENV]) as ctl:
                report["switch_counters"] = ctl.status()["counters"]
        print(f"\n{MARK}{json.dumps(report)}", flush=True)
        pg.monitored_barrier()  # over the store: no switch round (and no retransmission) while rank 0 reads
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main()
