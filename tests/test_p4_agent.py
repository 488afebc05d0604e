"""BMv2's control agent (:class:`topologies.bmv2_agent.Bmv2ControlAgent`) answering the liveness
probe's question "does the switch still hold this job?" from its own job list.

A worker whose round stalls asks, once a second after 2 s, ``status`` with ``jobs_only``
(:func:`homagg.transport._liveness.job_sighting`).  The agent answers it without a P4Runtime
session (before, every probe opened one and read every counter of the switch).  Oracles: the
agent's count of P4Runtime sessions; the answer while the switch's P4Runtime server cannot be
reached; and, with a real ``simple_switch_grpc`` (marker ``bmv2``), a job removed while a worker's
round stalls: the worker is told within the probe's few seconds, having opened no session.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import homagg
from homagg import ConfigError, SwitchTimeoutError
from homagg.p4 import SwitchConfig
from homagg.transport import ControlClient, UdpSwitchPort
from homagg.transport._liveness import job_sighting
from tests._dist_scripts._launch import free_port
from topologies.bmv2_agent import Bmv2ControlAgent

SERVICE_IP, SERVICE_MAC = "10.0.0.254", "02:48:41:00:00:fe"
WORKER_MAC = "02:48:41:00:00:01"


def _cfg(grpc: str) -> SwitchConfig:
    return SwitchConfig.from_dict({"name": "s1", "grpc": grpc, "service_ip": SERVICE_IP, "service_mac": SERVICE_MAC,
                                   "ports": [1], "hosts": [{"ip": "127.0.0.1", "mac": WORKER_MAC, "port": 1}]})


def _agent(node: Any, cfg: SwitchConfig, built: Any = None, gate: bool = True) -> tuple[Bmv2ControlAgent, str, str]:
    secret = os.urandom(16).hex()
    listen = ("127.0.0.1", free_port())
    agent = Bmv2ControlAgent(node, cfg, listen, secret, data_port=18497, gate=gate, built=built)
    return agent, f"{listen[0]}:{listen[1]}", secret


def test_status_jobs_only_needs_no_p4runtime() -> None:
    """No switch behind the agent (its P4Runtime address refuses): ``jobs_only`` is answered from
    the agent's list; the full status tries the switch and answers an error."""
    agent, addr, secret = _agent(SimpleNamespace(proc=None), _cfg(f"127.0.0.1:{free_port()}"), gate=False)
    agent.start()
    try:
        with ControlClient(addr, timeout=10, secret=secret) as ctl:
            for _ in range(3):
                assert ctl.request("status", jobs_only=True) == {"ok": True, "jobs": []}
            assert agent.p4runtime_sessions == 0
            with pytest.raises(ConfigError, match="refused status"):
                ctl.status()
            assert agent.p4runtime_sessions == 1
    finally:
        agent.stop()


# ---------------------------------------------------------------------------------------------
# with simple_switch_grpc


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from homagg.p4._build import build

    return build(tmp_path_factory.mktemp("p4build"), werror=True)


@contextlib.contextmanager
def _bmv2_with_agent(folder: Path, built: Any, cfg_of: Any = _cfg,
                     ports: tuple[int, ...] = (1,)) -> Iterator[tuple[Bmv2ControlAgent, str, str]]:
    """A ``simple_switch_grpc`` (pcap ports) with the build pushed and configured, and its control
    agent started: (agent, its control address, its secret); ``cfg_of(grpc address)`` is its
    :class:`SwitchConfig`."""
    from homagg.p4 import Controller
    from homagg.p4._pcap_switch import PcapSwitch

    with PcapSwitch(folder, ports, {}, grpc_port=free_port(), bmv2_args=("--log-level", "off")) as sw:
        cfg = cfg_of(sw.grpc_addr)
        with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=10) as ctl:
            ctl.push()
            ctl.configure(cfg)
        agent, addr, secret = _agent(sw, cfg, built=built)
        agent.start()
        try:
            yield agent, addr, secret
        finally:
            agent.stop()


@pytest.mark.bmv2
def test_stalled_round_learns_its_job_was_removed_without_p4runtime(tmp_path: Path, built: Any) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink, \
            _bmv2_with_agent(tmp_path / "bmv2", built) as (agent, addr, secret):
        sink.bind(("127.0.0.1", 0))  # the data address: takes datagrams, answers none
        with ControlClient(addr, timeout=10, secret=secret) as client:
            job = client.admit(world_size=1, n_slots=4, words_per_packet=8)
            port = UdpSwitchPort(sink.getsockname(), job=job, rank=0, control=addr, secret=secret, timeout=30)
            try:
                assert job_sighting(port._ctl, port.job).held is True
                sessions = agent.p4runtime_sessions  # admit and register wrote the switch
                remove_at = 4.5  # meanwhile the probe asks several times (the job is still there)

                def remove() -> None:
                    time.sleep(remove_at)
                    client.remove(job.job_id)

                remover = threading.Thread(target=remove, daemon=True)
                t0 = time.monotonic()
                remover.start()
                with pytest.raises(SwitchTimeoutError, match="no longer holds this job"):
                    homagg.allreduce(torch.ones(64), port)
                took = time.monotonic() - t0
                remover.join(10)
                assert remove_at < took < remove_at + 3.0, took
                assert port._liveness.job_probes >= 3
                assert agent.p4runtime_sessions == sessions + 1  # the remove, no probe
                assert job_sighting(port._ctl, port.job).held is False
            finally:
                port.close()


@pytest.mark.bmv2
def test_worker_registered_again_counts_from_its_new_address_only(tmp_path: Path, built: Any) -> None:
    """The agent writes a job's entries in steps with the epoch of its admission (``add_job(epoch=)``)
    and drops a worker's old source (``forget_source``): BMv2's admission table, read back over
    P4Runtime, holds the new address only."""
    with _bmv2_with_agent(tmp_path / "bmv2", built) as (agent, addr, secret):
        with ControlClient(addr, timeout=10, secret=secret) as client:
            job = client.admit(world_size=2, n_slots=4, words_per_packet=8)
            for wid, port in ((0, 41000), (1, 41001), (0, 41002)):
                client.register(job.job_id, wid, ("127.0.0.1", port))
            sources = client.status()["counters"]["sources"]
            assert [(s["port"], s["job_id"], s["worker_id"]) for s in sources] == [
                (41002, job.job_id, 0), (41001, job.job_id, 1)]
            assert [j["job_id"] for j in client.request("status", jobs_only=True)["jobs"]] == [job.job_id]
