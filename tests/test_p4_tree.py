"""BMv2 in the child role of an aggregation tree (docs/trees.md, ``p4/tree.p4``): the same packet
sequence through ``simple_switch_grpc`` and through the emulator's pipeline, byte-identical.

One switch holds two jobs: job 3, for which it is a *child* (its parent's data address behind
port 9, child id 5), and job 7, a *root* (today's one-switch job), so both roles run side by
side.  The sequence (:func:`tree_sequence`): rounds of job 3 with slot reuse (bank flips), partial
packets, ADD (wrapping) / OR / signed MAX, duplicates; each completed use goes up to the parent
(checked against an independent oracle: the workers' words combined with numpy); a worker's
retransmission before the result came down (the use goes up again, ``FLAG_RETRANSMIT``); the
parent's result (written into the cell, multicast to the workers), sometimes lost (the next
retransmission sends the use up again), duplicated (``drop_stale_result``), preceded by results
for another use or a use not complete here (``drop_stale_result``) and by a forged one (wrong
token: ``drop_token``); a retransmission once the result is down (unicast of the tree's result);
and results from a source that is not the job's parent, for a root job, with a slot out of the
job's range or too many words.  Oracle: :class:`switch_emulator.pipeline.Pipeline` (the tree's
reference implementation) fed the same sequence: the datagrams to every destination (workers and
parent), in order, and the drop and tree counters (``up``, ``retransmit_up``, ``result_down``).
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from homagg import wire
from homagg.jobs import JobSpec, WorkerAddr
from homagg.p4 import SwitchConfig
from tests.test_p4_bmv2 import SERVICE_IP, SERVICE_MAC, _frame, _mac

PARENT, PARENT_MAC, PARENT_PORT = ("10.0.1.254", 18497), "02:48:41:00:01:fe", 9
STRANGER = ("10.0.1.77", 18497)  # sends results, but is no job's parent
Seq = list[tuple[tuple[str, int], bytes]]


def tree_jobs() -> tuple[JobSpec, JobSpec]:
    child = JobSpec(3, 3, slot_base=0, n_slots=2, words_per_packet=32,
                    workers=tuple(WorkerAddr(w, f"10.0.0.{w + 1}", 40000 + w) for w in range(3)),
                    token=0x0BADCAFE, parent=PARENT, child_id=5)
    root = JobSpec(7, 2, slot_base=8, n_slots=3, words_per_packet=20,
                   workers=tuple(WorkerAddr(w, f"10.0.0.{w + 11}", 18497) for w in range(2)), token=0xA5A5F00D)
    return child.validate(), root.validate()


def _hosts() -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"ip": PARENT[0], "mac": PARENT_MAC, "port": PARENT_PORT}]
    for j in tree_jobs():
        for w in j.workers:
            idx = int(w.ip.rsplit(".", 1)[1])
            out.append({"ip": w.ip, "mac": _mac(idx), "port": idx})
    return out


def _words(rng: random.Random, op: int, k: int) -> list[int]:
    if op == wire.OP_ADD:
        return [rng.choice([2**31 - 1, -(2**31), rng.randrange(-2**31, 2**31)]) for _ in range(k)]
    if op == wire.OP_OR:
        return [rng.randrange(-2**31, 2**31) & rng.randrange(-2**31, 2**31) for _ in range(k)]
    return [rng.randrange(-2**31, 2**31) for _ in range(k)]


def _combined(op: int, contributions: list[list[int]]) -> list[int]:
    """The independent oracle of a use's combined words: numpy over the workers' words."""
    a = np.array(contributions, dtype=np.int64)
    if op == wire.OP_ADD:
        out = a.sum(axis=0) & 0xFFFFFFFF
        return [int(v) - (1 << 32) if v >= 1 << 31 else int(v) for v in out]
    if op == wire.OP_OR:
        return [int(v) for v in np.bitwise_or.reduce(a.astype(np.int32), axis=0)]
    return [int(v) for v in a.max(axis=0)]


def tree_sequence(seed: int = 11) -> tuple[Seq, list[list[int]]]:
    """``([(source, datagram), ...], [the combined words of each of job 3's uses, in order])``."""
    rng = random.Random(seed)
    child, root = tree_jobs()
    out: Seq = []
    ups: list[list[int]] = []
    child_ops = [wire.OP_ADD, wire.OP_OR, wire.OP_MAX, wire.OP_ADD, wire.OP_ADD, wire.OP_MAX, wire.OP_OR, wire.OP_ADD]
    for g, op in enumerate(child_ops):
        k = child.words_per_packet if g % 3 else max(1, child.words_per_packet - 9)
        slot, bank = child.slot_base + g % child.n_slots, (g // child.n_slots) % 2
        head = wire.Header(wire.VERSION, op, 0, child.job_id, 0, k, bank, slot, g, 32 * g, token=child.token)
        pkts, contributions = [], []
        for w in child.workers:
            words = _words(rng, op, k)
            contributions.append(words)
            pkts.append((w.addr, wire.pack_packet(head._replace(worker_id=w.worker_id), words)))
        ups.append(_combined(op, contributions))
        result = _words(rng, op, k)  # the tree's result: whatever the parent combined
        down = wire.Header(wire.VERSION, op, wire.FLAG_RESULT, child.job_id, child.child_id, k, bank, slot, g, 32 * g,
                           token=child.token)

        def retransmit(i: int, pkts: list = pkts) -> tuple[tuple[str, int], bytes]:
            src, dg = pkts[i]
            return src, wire.pack_header(wire.parse_header(dg)._replace(flags=wire.FLAG_RETRANSMIT)) + dg[wire.HEADER_LEN:]

        rng.shuffle(pkts)
        for i, p in enumerate(pkts):
            out.append(p)
            if i == 0 and g % 2:  # the parent's result of a use not complete here: stale
                out.append((PARENT, wire.pack_packet(down, result)))
            if rng.random() < 0.3 and i < len(pkts) - 1:
                out.append(p)  # duplicate before completion
        # complete here: the use went up.  Results for another use (tag, offset) or forged: dropped
        out.append((PARENT, wire.pack_packet(down._replace(tag=g + 1), result)))
        if g % 3 == 1:
            out.append((PARENT, wire.pack_packet(down._replace(offset=32 * g + 1), result)))
        if g % 2 == 0:
            out.append((PARENT, wire.pack_packet(down._replace(token=child.token ^ 0x100), [2**31 - 1] * k)))
        if g % 4 == 1:
            out.append(retransmit(0))  # the result has not come down: up again, flagged
        if g % 4 == 2:
            out.append(retransmit(1))  # the parent's first result is lost (never sent) ...
            out.append(retransmit(2))  # ... both asked again
        out.append((PARENT, wire.pack_packet(down, result)))  # written, multicast to the workers
        if g % 2 == 1:
            out.append((PARENT, wire.pack_packet(down, result)))  # a second copy: stale_result
        out.append(retransmit(rng.randrange(3)))  # down: the tree's result, unicast
        if g < 6:  # the root job alongside: a use, a duplicate, a retransmission answered
            rk = root.words_per_packet if g % 2 else 7
            rslot, rbank = root.slot_base + g % root.n_slots, (g // root.n_slots) % 2
            rop = child_ops[(g + 3) % len(child_ops)]
            rpkts = [(w.addr, wire.pack_packet(wire.Header(wire.VERSION, rop, 0, root.job_id, w.worker_id, rk, rbank,
                                                           rslot, g, 20 * g, token=root.token), _words(rng, rop, rk)))
                     for w in root.workers]
            out += [rpkts[0], rpkts[0], rpkts[1]]
            src, dg = rpkts[1]
            out.append((src, wire.pack_header(wire.parse_header(dg)._replace(flags=wire.FLAG_RETRANSMIT))
                        + dg[wire.HEADER_LEN:]))
    # results that no child takes, after everything
    last = wire.Header(wire.VERSION, 0, wire.FLAG_RESULT, child.job_id, child.child_id, 4, 0, 0, 0, 0, token=child.token)
    out.append((STRANGER, wire.pack_packet(last, [1, 2, 3, 4])))  # not the parent: result_flag
    out.append(((PARENT[0], PARENT[1] + 1), wire.pack_packet(last, [1, 2, 3, 4])))  # the parent's IP, not its port
    out.append((PARENT, wire.pack_packet(last._replace(job_id=root.job_id, token=root.token), [1, 2, 3, 4])))  # root
    out.append((PARENT, wire.pack_packet(last._replace(slot=5), [1, 2, 3, 4])))  # slot range
    out.append((PARENT, wire.pack_packet(last._replace(word_count=40), list(range(40)))))  # word count
    return out, ups


def emulator_outputs(seq: Seq) -> tuple[dict[tuple[str, int], list[bytes]], dict[str, int]]:
    """Datagrams per destination (workers and the parent), in order, from the emulator's pipeline
    with both jobs admitted (job 3 as a child); and its counters."""
    from switch_emulator.admission import AdmissionTable
    from switch_emulator.pipeline import Pipeline

    got: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    adm = AdmissionTable(pool_slots=1024)
    for j in tree_jobs():
        adm.admit(j)
    pipe = Pipeline(adm, lambda dg, addr: got[tuple(addr)].append(bytes(dg)))
    for src, dg in seq:
        pipe.process(dg, len(dg), src)
    return dict(got), pipe.counters.snapshot()


def test_sequence_exercises_the_child_role() -> None:
    """Runs everywhere: the sequence holds what the BMv2 test claims, and the emulator's up
    packets carry the combined words (numpy) of each use, from worker id ``child_id``."""
    seq, ups = tree_sequence()
    out, c = emulator_outputs(seq)
    child, root = tree_jobs()
    assert c["up"] == len(ups) == 8 and c["result_down"] == 8
    assert c["retransmit_up"] == 6  # uses 1 and 5: one worker asks; uses 2 and 6: two
    assert c["drop_stale_result"] == 8 + 3 + 4 + 4  # other tag; other offset; a use in progress; second copies
    assert c["drop_result_flag"] == 3 and c["drop_token"] == 4 and c["drop_slot_range"] == 1
    assert c["drop_word_count"] == 1 and c["drop_duplicate"] >= 6 and c["retransmit_answered"] >= 14
    first_ups = [wire.parse_header(d) for d in out[PARENT]]
    assert [h.flags for h in first_ups].count(wire.FLAG_RETRANSMIT) == 6
    sent_up = [d for d in out[PARENT] if not wire.parse_header(d).flags]
    assert [list(wire.payload_view(d, wire.parse_header(d).word_count)) for d in sent_up] == ups
    assert all(wire.parse_header(d).worker_id == child.child_id for d in out[PARENT])
    assert set(out) == {PARENT} | {w.addr for j in (child, root) for w in j.workers}


# ----------------------------------------------------------------------------------------------
# BMv2
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from homagg.p4._build import build

    return build(tmp_path_factory.mktemp("p4build"), werror=True)


def _outputs_by_destination(frames: dict[int, list[bytes]]) -> dict[tuple[str, int], list[bytes]]:
    """The homagg datagrams BMv2 sent, per destination (ip, udp port), after checking every frame's
    addresses (up packets: from this switch's data address to the parent's) and IPv4 header."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    port_of = {h["ip"]: h["port"] for h in _hosts()}
    mac_of = {h["ip"]: h["mac"] for h in _hosts()}
    got: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    for port, fl in frames.items():
        for raw in fl:
            e = Ether(raw)
            ip, udp = e[IP], e[UDP]
            assert port_of[ip.dst] == port and e.dst == mac_of[ip.dst]
            assert e.src == SERVICE_MAC and ip.src == SERVICE_IP and udp.sport == wire.HOMAGG_UDP_PORT
            assert udp.chksum == 0 and (ip.ttl, ip.id, ip.flags.value, ip.tos) == (64, 0, 2, 0)
            fresh = IP(bytes(ip))
            del fresh.chksum
            assert IP(bytes(fresh)).chksum == ip.chksum, "IPv4 checksum"
            got[(ip.dst, udp.dport)].append(bytes(udp.payload))
    return got


@pytest.mark.bmv2
def test_child_role_bmv2_vs_emulator(tmp_path: Path, built) -> None:  # noqa: ANN001
    from homagg.p4 import Controller
    from homagg.p4._pcap_switch import PcapSwitch

    seq, ups = tree_sequence()
    want, emu = emulator_outputs(seq)
    ports = sorted({int(h["port"]) for h in _hosts()} | {1})
    child, root = tree_jobs()
    frames_in = [_parent_frame(s, d) if s[0] in (PARENT[0], STRANGER[0]) else _frame(s, d) for s, d in seq]
    with PcapSwitch(tmp_path, ports, {1: frames_in}, grpc_port=50561) as sw:
        cfg = SwitchConfig.from_dict({"name": "leaf", "grpc": sw.grpc_addr, "service_ip": SERVICE_IP,
                                      "service_mac": SERVICE_MAC, "ports": ports, "hosts": _hosts()})
        with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=10) as ctl:
            ctl.push()
            ctl.configure(cfg)
            for j in (child, root):
                ctl.add_job(cfg, j, epoch=0x1234)
                ctl.add_job(cfg, j, epoch=0x1234)  # idempotent
            sw.wait_for(sum(len(v) for v in want.values()), timeout=60)
            time.sleep(1.0)
            counters = ctl.read_counters()
            for _ in range(2):  # idempotent; the child's parent and uplink entries go too
                ctl.remove_job(cfg, child)
            assert {(s["ip"], s["port"]) for s in ctl.read_counters()["sources"]} == {w.addr for w in root.workers}
            for table in ("parent_result", "uplink"):
                assert not [e for e in ctl.read(lambda ent, t=table: _table(ent, ctl, t)) if e.table_entry.match]
    got = _outputs_by_destination({p: [raw for _, raw in sw.output(p)] for p in ports})
    assert set(got) == set(want)
    for dst in want:
        assert got[dst] == want[dst], f"datagrams to {dst} differ"
    sent_up = [d for d in got[PARENT] if not wire.parse_header(d).flags]
    assert [list(wire.payload_view(d, wire.parse_header(d).word_count)) for d in sent_up] == ups
    for name in ("up", "retransmit_up", "result_down", "drop_stale_result", "drop_result_flag", "drop_token",
                 "drop_slot_range", "drop_word_count", "drop_duplicate", "drop_stale", "drop_conflict"):
        assert counters.get(name, 0) == emu[name], name


def _parent_frame(src: tuple[str, int], dg: bytes) -> bytes:
    from homagg.p4._pcap_switch import udp_frame

    return udp_frame(src, PARENT_MAC, (SERVICE_IP, wire.HOMAGG_UDP_PORT), SERVICE_MAC, dg)


def _table(ent, ctl, name: str) -> None:  # noqa: ANN001
    ent.table_entry.table_id = ctl.info.get("tables", name).preamble.id


# ----------------------------------------------------------------------------------------------
# the BMv2 control agent: a child job admitted over the control protocol
# ----------------------------------------------------------------------------------------------


def _agent_cfg(grpc: str, with_parent: bool) -> SwitchConfig:
    hosts = [{"ip": "10.0.0.1", "mac": _mac(1), "port": 1}]
    if with_parent:
        hosts.append({"ip": PARENT[0], "mac": PARENT_MAC, "port": 2})
    return SwitchConfig.from_dict({"name": "leaf", "grpc": grpc, "service_ip": SERVICE_IP, "service_mac": SERVICE_MAC,
                                   "ports": [1, 2], "hosts": hosts})


def test_agent_refuses_a_child_job_it_cannot_send_up() -> None:
    """No host entry for the parent: ``admit`` answers a ConfigError naming it before any P4Runtime
    session (nothing listens at the gRPC address: the old agent went on and failed there)."""
    from types import SimpleNamespace

    from homagg import ConfigError
    from homagg.transport import ControlClient
    from tests._dist_scripts._launch import free_port
    from tests.test_p4_agent import _agent

    agent, addr, secret = _agent(SimpleNamespace(proc=None), _agent_cfg(f"127.0.0.1:{free_port()}", False),
                                 gate=False)
    agent.start()
    try:
        with ControlClient(addr, timeout=10, secret=secret) as ctl:
            with pytest.raises(ConfigError, match=r"no host entry for 10\.0\.1\.254"):
                ctl.admit(world_size=2, n_slots=4, words_per_packet=8, parent=PARENT, child_id=3)
        assert agent.p4runtime_sessions == 0 and agent.jobs == {}
    finally:
        agent.stop()


@pytest.mark.bmv2
def test_agent_admits_a_child_job(tmp_path: Path, built) -> None:  # noqa: ANN001
    """``admit`` with a parent, ``register``: the switch holds the job's uplink (child id, its own
    data address, the parent's, the port towards it) and the parent's results entry, with the
    admission's epoch and the job's token; ``remove`` deletes both."""
    from functools import partial

    from homagg.p4 import Controller
    from homagg.p4._switches import ipv4_int, mac_int
    from homagg.transport import ControlClient
    from tests.test_p4_agent import _bmv2_with_agent

    with _bmv2_with_agent(tmp_path, built, partial(_agent_cfg, with_parent=True), (1, 2)) as (agent, addr, secret):
        cfg = agent.cfg
        with ControlClient(addr, timeout=10, secret=secret) as client:
            job = client.admit(world_size=1, n_slots=4, words_per_packet=8, parent=PARENT, child_id=3,
                               job_id=9, slot_base=16, token=0x5151)
            assert job.parent == PARENT and job.child_id == 3
            client.register(job.job_id, 0, ("10.0.0.1", 40000))
            with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=10,
                            election_id=2) as ctl:
                up = _entries(ctl, "uplink")
                down = _entries(ctl, "parent_result")
            assert up == [({"meta.job_id": 9}, {"child_id": 3, "switch_mac": mac_int(SERVICE_MAC),
                                                "switch_ip": ipv4_int(SERVICE_IP), "parent_mac": mac_int(PARENT_MAC),
                                                "parent_ip": ipv4_int(PARENT[0]), "parent_port": PARENT[1],
                                                "uplink_port": 2})]
            assert down == [({"hdr.ipv4.src_addr": ipv4_int(PARENT[0]), "hdr.udp.src_port": PARENT[1],
                              "hdr.homagg.job_id": 9},
                             {"slot_base": 16, "n_slots": 4, "world_size": 1, "words_per_packet": 8,
                              "mcast_grp": Controller.mcast_group(9), "epoch": agent.jobs[9].epoch,
                              "token": 0x5151})]
            client.remove(job.job_id)
            with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=10,
                            election_id=2) as ctl:
                assert _entries(ctl, "uplink") == [] and _entries(ctl, "parent_result") == []


def _entries(ctl, table: str) -> list[tuple[dict[str, int], dict[str, int]]]:  # noqa: ANN001
    """``[(match field -> value, action parameter -> value), ...]`` of ``table``'s entries."""
    t = ctl.info.get("tables", table)
    fields = {m.id: m.name for m in t.match_fields}
    out = []
    for e in ctl.read(lambda ent: _table(ent, ctl, table)):
        te = e.table_entry
        if not te.match:
            continue
        a = next(a for a in ctl.info.msg.actions if a.preamble.id == te.action.action.action_id)
        params = {p.id: p.name for p in a.params}
        out.append(({fields[m.field_id]: int.from_bytes(m.exact.value, "big") for m in te.match},
                    {params[p.param_id]: int.from_bytes(p.value, "big") for p in te.action.action.params}))
    return out


def test_job_file_per_switch_jobs(tmp_path: Path) -> None:
    """A tree's job file: each ``bmv2.switches`` entry has its own ``jobs`` (one job id, a child with
    its parent); ``homagg control --job`` knows their ids (before: per-switch jobs were ignored)."""
    import argparse
    import json

    from homagg import ConfigError
    from homagg.p4 import SwitchUnreachableError, _control, load_switches

    child, root = tree_jobs()
    leaf = {"name": "leaf", "grpc": "127.0.0.1:1", "service_ip": SERVICE_IP, "service_mac": SERVICE_MAC,
            "hosts": _hosts(), "jobs": [child.to_dict()]}
    (tmp_path / "tree.json").write_text(json.dumps({"jobs": [root.to_dict()], "bmv2": {"switches": [leaf]}}))
    (sw,) = load_switches(tmp_path / "tree.json")
    assert sw.jobs == (child,)
    parser = argparse.ArgumentParser()
    _control.configure_parser(parser)
    args = parser.parse_args(["add", "--config", str(tmp_path / "tree.json"), "--job", str(child.job_id),
                              "--timeout", "0.3"])
    with pytest.raises(SwitchUnreachableError):  # the job is known: the controller tries the switch
        _control.run(args)
    args.job = [99]
    with pytest.raises(ConfigError, match=r"--job 99: no job with this id .* \(its jobs: 3, 7\)"):
        _control.run(args)
