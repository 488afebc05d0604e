"""DDP through BMv2 in Mininet survives the switch crashing and coming back (issue 30, item 4).

A star of 2 Mininet hosts around ``simple_switch_grpc`` running homagg.p4; on each host one rank of
a ``homagg`` process group (``init_process_group("homagg")``, the rank script
``_dist_scripts/fallback_ddp.py``) whose switch is BMv2's service address.  BMv2 is configured
through :class:`homagg.p4.Controller` as ``homagg control`` does, and the ranks reach it through
the control protocol served by :class:`topologies.bmv2_agent.Bmv2ControlAgent` (admit, register,
remove as P4Runtime writes).  The rendezvous store, gloo (the host path) and the control port use
a management network (:mod:`topologies._mgmt`): the data network's hosts reach each other only
through BMv2, which is what fails.

The operator (a thread of the test) SIGKILLs ``simple_switch_grpc`` when rank 0 reports step
``KILL_AT`` and restarts it with the pipeline and entries pushed again at step ``RESTART_AT``.
Oracles: an undisturbed run on the same network (parameters and losses bit-identical: the host
path runs the same codec with gloo combining the words), the same parameters on every rank, and
the path changes switch -> host -> switch on every rank.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from topologies._mn import import_mininet

try:  # make Debian's mininet importable before conftest checks for it
    import_mininet()
except ImportError:
    pass

pytestmark = [pytest.mark.mininet, pytest.mark.bmv2, pytest.mark.slow]

WORLD = 2
STEPS = 60
KILL_AT, RESTART_AT = 12, 20
CONTROL_PORT = 18498
SCRIPT = Path(__file__).resolve().parent / "_dist_scripts" / "fallback_ddp.py"


class _Star:
    """The network, the switch node, its control agent, the management addresses."""

    def __init__(self, out: Path) -> None:
        from homagg.p4 import SwitchConfig
        from homagg.p4._build import build
        from topologies._deploy import LinkOpts
        from topologies._mgmt import ROOT_IP, add_management_network
        from topologies.bmv2 import configure_bmv2
        from topologies.bmv2_agent import Bmv2ControlAgent
        from topologies.runner import remove_leftovers
        from topologies.star import build_star

        self.out = out
        (out / "logs").mkdir(parents=True, exist_ok=True)
        remove_leftovers()
        self.dep = build_star(WORLD, "bmv2", LinkOpts())
        self.agent: Bmv2ControlAgent | None = None
        self.runs: list[str] = []
        try:
            for site in self.dep.workers:
                site.host.cmd(f"ethtool -K {site.intf} tx off rx off >/dev/null 2>&1")
            self.node = self.dep.switch_nodes[0]
            self.node.log_path = out / "logs" / "bmv2-0.log"
            self.node.start([])
            self.cfg = SwitchConfig.from_dict(self.dep.bmv2_config["bmv2"]["switches"][0])
            # compiled once, into the test's folder: every start and restart pushes this build
            self.built = build(out / "p4build")
            configure_bmv2(self.node, self.cfg, built=self.built)
            self.mgmt = add_management_network(self.dep)
            self.secret = os.urandom(16).hex()
            self.control = f"{ROOT_IP}:{CONTROL_PORT}"
            self.agent = Bmv2ControlAgent(self.node, self.cfg, (ROOT_IP, CONTROL_PORT), self.secret,
                                          self.dep.data_port, built=self.built).start()
        except BaseException:
            self.stop()
            raise

    def run(self, name: str, env: dict[str, str], timeout: float = 300.0, data_net: bool = False,
            operator: Callable[[Path, threading.Event], None] | None = None,
            script: Path = SCRIPT) -> tuple[list[dict[str, Any]], float]:
        """Run ``script`` (the DDP rank script) on every host; its per-rank results and the seconds it
        took.  ``operator(progress file, done)`` runs in a thread meanwhile; ``data_net``: the store and
        gloo use the data network (through BMv2) instead of the management network."""
        from topologies._deploy import REPO_ROOT, python_env
        from topologies._mgmt import IFACE

        res_dir = self.out / name
        res_dir.mkdir()
        self.runs.append(name)
        progress = res_dir / "progress"
        base = python_env()
        master = self.dep.workers[0].ip if data_net else self.mgmt[0]
        base.update(env, WORLD_SIZE=str(WORLD), MASTER_ADDR=master, MASTER_PORT=str(29500 + len(self.runs)),
                    HOMAGG_RESULT_DIR=str(res_dir), PYTHONUNBUFFERED="1",
                    HOMAGG_SWITCH=self.dep.switch_addr(0), HOMAGG_SWITCH_CONTROL=self.control,
                    HOMAGG_SWITCH_SECRET=self.secret, HOMAGG_UDP_GSO="0", STEPS=str(STEPS), PROGRESS=str(progress))
        procs, logs = [], []
        for r, site in enumerate(self.dep.workers):
            log = open(res_dir / f"rank{r}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            env_r = {**base, "RANK": str(r), "LOCAL_RANK": str(r),
                     "GLOO_SOCKET_IFNAME": site.intf if data_net else IFACE}
            procs.append(site.host.popen([sys.executable, str(script)], stdout=log, stderr=subprocess.STDOUT,
                                         cwd=str(REPO_ROOT), env=env_r))
        self.dep.procs.extend(procs)
        done = threading.Event()
        thread = None
        if operator is not None:
            thread = threading.Thread(target=operator, args=(progress, done), daemon=True)
            thread.start()
        t0 = time.monotonic()
        deadline = t0 + timeout
        try:
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            done.set()
            if thread is not None:
                thread.join(60)
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(10)
            seconds = time.monotonic() - t0
            for log in logs:
                log.close()
        tails = "\n".join(f"--- rank {r} ---\n{(res_dir / f'rank{r}.log').read_text(errors='replace')[-3000:]}"
                          for r in range(WORLD))
        assert all(p.returncode == 0 for p in procs), f"{name}: exit codes {[p.returncode for p in procs]}\n{tails}"
        results = []
        for r in range(WORLD):
            f = res_dir / f"rank{r}.json"
            assert f.exists(), f"{name}: rank {r} wrote no result\n{tails}"
            results.append(json.loads(f.read_text()))
        return results, seconds

    def stop(self) -> None:
        from topologies.runner import remove_leftovers

        if self.agent is not None:
            self.agent.stop()
        self.dep.stop()
        remove_leftovers()


@pytest.fixture(scope="module")
def star(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Star]:
    if shutil.which("simple_switch_grpc") is None:
        pytest.skip("simple_switch_grpc not on PATH")
    s = _Star(tmp_path_factory.mktemp("bmv2-fallback"))
    try:
        yield s
    finally:
        s.stop()


_ENV = {"HOMAGG_TIMEOUT": "10", "HOMAGG_PROBE_INTERVAL": "0.2", "STEP_S": "0.05"}


@pytest.fixture(scope="module")
def undisturbed(star: _Star) -> tuple[list[dict[str, Any]], float]:
    return star.run("undisturbed", {**_ENV, "CRASH": "none"})


@pytest.mark.parametrize("mode", ["gated", "open", "data-net"])
def test_ddp_survives_bmv2_killed_and_restarted(star: _Star, undisturbed: tuple[list[dict[str, Any]], float],
                                                mode: str, record_property: Callable[..., None]) -> None:
    """simple_switch_grpc SIGKILLed at step KILL_AT, restarted and reloaded at step RESTART_AT; the
    run finishes on BMv2, bit-identical to the undisturbed run.

    ``gated``: the control agent closes its port while BMv2 is down, so the ranks' liveness probe
    sees the crash within a second.  ``open``: the port stays open (as a controller elsewhere
    would), the crash is noticed at the progress timeout (``HOMAGG_TIMEOUT``), and re-admissions
    tried before the restart fail at the agent and are retried.  ``data-net``: gated, but the store
    and gloo run over the data network, through BMv2 (its ``l2_forward`` entries): the host path
    stalls (TCP retransmits) until BMv2 is back, so the restart comes after a fixed time instead
    of at a step."""
    from topologies.bmv2 import kill_bmv2, restart_bmv2

    agent = star.agent
    assert agent is not None
    gate = mode != "open"
    agent.gate = gate
    undisturbed_runs, undisturbed_s = undisturbed
    name = f"disturbed-{mode}"
    env = {**_ENV, "CRASH": "external"}
    restart_at, restart_after_s = RESTART_AT, 1e9
    if not gate:
        # detection waits for the progress timeout, and every failed re-admission doubles the
        # probe interval: restart at once (the step after the fallback) and give the host path
        # time, so that the run still ends on the switch
        env.update(HOMAGG_TIMEOUT="5", STEP_S="0.15")
        restart_at = KILL_AT + 1
    if mode == "data-net":
        restart_after_s = 3.0  # the run cannot reach RESTART_AT without BMv2

    log: list[str] = []

    def operator(progress: Path, done: threading.Event) -> None:
        killed, killed_at = False, 0.0
        while not done.is_set():
            text = progress.read_text() if progress.exists() else ""
            step = int(text) if text.strip() else -1
            if not killed and step >= KILL_AT:
                pid = kill_bmv2(star.node)
                killed, killed_at = True, time.monotonic()
                log.append(f"killed simple_switch_grpc (pid {pid}) at step {step}")
            if killed and (step >= restart_at or time.monotonic() - killed_at >= restart_after_s):
                with agent.exclusive():  # the agent's P4Runtime sessions wait for the reload
                    took = restart_bmv2(star.dep, star.node, star.out / "logs" / f"bmv2-{name}.log", star.built)
                agent.resume()
                log.append(f"restarted at step {step}: running with its pipeline and entries in {took:.2f}s")
                return
            time.sleep(0.005)

    results, seconds = star.run(name, env, operator=operator, data_net=mode == "data-net")
    assert len(log) == 2, log
    params = [_tensor(r["params"]) for r in results]
    reference = _tensor(undisturbed_runs[0]["params"])
    assert all(p.equal(params[0]) for p in params), "ranks ended with different parameters"
    assert params[0].equal(reference), "parameters differ from the undisturbed run"
    assert all(_tensor(r["params"]).equal(reference) for r in undisturbed_runs)
    for rank, (res, ref) in enumerate(zip(results, undisturbed_runs, strict=True)):
        assert len(res["losses"]) == STEPS >= 50
        assert res["losses"] == ref["losses"], f"rank {rank}: losses differ from the undisturbed run"
        moves = [(t["from"], t["to"]) for t in res["transitions"] if t["from"] != t["to"]]
        assert moves == [("switch", "host"), ("host", "switch")], (rank, res["transitions"])
        assert res["paths"][0] == "switch" and "host" in res["paths"] and res["paths"][-1] == "switch", res["paths"]
        assert res["stats_paths"]["host"] >= 1 and res["stats_paths"]["switch"] >= 1
        assert ref["transitions"] == [] and set(ref["paths"]) == {"switch"}
    down = next(t for t in results[0]["transitions"] if t["to"] == "host")
    back = next(t for t in results[0]["transitions"] if t["to"] == "switch")
    steps = {p: results[0]["paths"].count(p) for p in ("switch", "host")}
    retries = sum(1 for t in results[0]["transitions"] if t["from"] == t["to"] == "host")
    line = (f"BMv2 star, {WORLD} ranks, {STEPS} DDP steps, mode {mode}: "
            f"{log[0]}; {log[1]}; steps per path {steps}; detect_s {down['detect_s']}, agree_s {down['agree_s']}, "
            f"failed re-admissions {retries}, readmit_s {back['readmit_s']}, host_s {back['host_s']}; "
            f"run {seconds:.1f}s, undisturbed {undisturbed_s:.1f}s")
    record_property("homagg_report", line)
    print(json.dumps({"operator": log, "transitions": [r["transitions"] for r in results],
                      "agent": agent.events}, default=str))


def _tensor(d: dict[str, Any]) -> Any:
    from tests._dist_scripts._launch import tensor_from_json

    return tensor_from_json(d)


def test_a_dead_rank_is_named_across_bmv2(star: _Star, record_property: Callable[..., None]) -> None:
    """Rank 1's process exits after a barrier; rank 0's next barrier (a switch round that would wait
    up to the group's timeout for a late rank) raises RankTimeoutError naming rank 1 within seconds:
    its probes cross BMv2 (``l2_forward``) to rank 1's presence socket on the other Mininet host,
    whose kernel answers ICMP port unreachable back through BMv2."""
    assert star.agent is not None
    star.agent.gate = True
    results, seconds = star.run("dead-rank", {"HOMAGG_TIMEOUT": "30"},
                                script=Path(__file__).resolve().parent / "_dist_scripts" / "dead_rank_barrier.py")
    res = results[0]
    assert res["sum"] == results[1]["sum"] == [2.0] * 4, results
    error = res["error"]
    assert error is not None and error["type"] == "RankTimeoutError" and error["ranks"] == [1], res
    assert "rank(s) 1 of the group are gone" in error["message"] and res["seconds"] < 5.0, res
    assert res["probes"] >= 1 and res["path"] == "switch", res
    record_property("homagg_report", f"BMv2 star, {WORLD} ranks: a dead rank named by the barrier after "
                                     f"{res['seconds']:.2f}s ({res['probes']} presence probes)")
