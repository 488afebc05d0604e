"""BMv2 tests: the P4 program compiles cleanly, the controller configures it, and BMv2 and the
emulator pipeline answer the same worker packet sequence with byte-identical results.

Marker ``bmv2`` (``p4c-bm2-ss`` and ``simple_switch_grpc`` on PATH).  BMv2 runs with
``--use-files``: it reads its ports' input from pcap files and writes their output to pcap files,
so no network interface is created.  The sequence (:func:`worker_sequence`) has two jobs with
interleaved rounds, slot reuse (bank flips), partial packets, wrapping ADD, OR, signed MAX,
duplicates, retransmissions into complete slots (unicast answers), stale copies, a key conflict,
invalid packets (unknown source, wrong version, slot out of range, result flag), and forged
datagrams from admitted sources with a wrong job token in the middle of rounds (dropped as
``drop_token``; the results stay those of the genuine packets).
The oracle for BMv2 is the emulator's :class:`switch_emulator.pipeline.Pipeline`.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import pytest

from homagg import wire
from homagg.jobs import JobSpec, WorkerAddr

SERVICE_IP, SERVICE_MAC = "10.0.0.254", "02:48:41:00:00:fe"
SWITCH_SRC = ("10.9.9.9", 5555)  # an unknown source


def _mac(i: int) -> str:
    return f"02:48:41:00:00:{i + 1:02x}"


def jobs() -> list[JobSpec]:
    j1 = JobSpec(1, 3, slot_base=0, n_slots=2, words_per_packet=32,
                 workers=tuple(WorkerAddr(w, f"10.0.0.{w + 1}", 40000 + w) for w in range(3)), token=0x11223344)
    j2 = JobSpec(7, 2, slot_base=8, n_slots=3, words_per_packet=20,
                 workers=tuple(WorkerAddr(w, f"10.0.0.{w + 11}", 18497) for w in range(2)), token=0xA5A5F00D)
    return [j1.validate(), j2.validate()]


def _hosts() -> list[dict[str, object]]:
    out = []
    for j in jobs():
        for w in j.workers:
            idx = int(w.ip.rsplit(".", 1)[1])
            out.append({"ip": w.ip, "mac": _mac(idx), "port": idx})
    return out


def worker_sequence(seed: int = 5, js: list[JobSpec] | None = None) -> list[tuple[tuple[str, int], bytes]]:
    """``[(source (ip, port), homagg datagram), ...]`` in arrival order (self-clocked per job)."""
    rng = random.Random(seed)
    out: list[tuple[tuple[str, int], bytes]] = []
    js = js or jobs()
    ops = {1: [wire.OP_ADD, wire.OP_ADD, wire.OP_MAX, wire.OP_ADD, wire.OP_OR, wire.OP_ADD],
           7: [wire.OP_OR, wire.OP_MAX, wire.OP_ADD, wire.OP_ADD, wire.OP_MAX, wire.OP_OR]}
    prev: dict[int, list[tuple[tuple[str, int], bytes]]] = {}
    for g in range(6):
        for j in js:
            k = j.words_per_packet if g % 3 else max(1, j.words_per_packet - 7)  # partial chunks too
            slot, bank = j.slot_base + g % j.n_slots, (g // j.n_slots) % 2
            op = ops[j.job_id][g]
            pkts = []
            for w in j.workers:
                if op == wire.OP_ADD:
                    words = [rng.choice([2**31 - 1, -(2**31), rng.randrange(-2**31, 2**31)]) for _ in range(k)]
                elif op == wire.OP_OR:
                    words = [rng.randrange(-2**31, 2**31) & rng.randrange(-2**31, 2**31) for _ in range(k)]
                else:
                    words = [rng.randrange(-2**31, 2**31) for _ in range(k)]
                h = wire.Header(wire.VERSION, op, 0, j.job_id, w.worker_id, k, bank, slot, g, 32 * g, token=j.token)
                pkts.append((w.addr, wire.pack_packet(h, words)))
                if rng.random() < 0.5:  # forged: right source and key, wrong token, hostile words
                    forged = h._replace(token=j.token ^ (1 << rng.randrange(32)))
                    out.append((w.addr, wire.pack_packet(forged, [2**31 - 1] * k)))
            rng.shuffle(pkts)
            for i, p in enumerate(pkts):
                out.append(p)
                if rng.random() < 0.3 and i < len(pkts) - 1:
                    out.append(p)  # duplicate before completion -> DUPLICATE
            # retransmission into the complete slot -> unicast ANSWER (flag set by the worker)
            src, dg = rng.choice(pkts)
            h = wire.parse_header(dg)
            out.append((src, wire.pack_header(h._replace(flags=wire.FLAG_RETRANSMIT)) + dg[wire.HEADER_LEN:]))
            if j.job_id in prev and g >= j.n_slots:
                # a late copy of the other bank's (older) use of a different slot: STALE or ANSWER
                out.append(rng.choice(prev[j.job_id]))
            prev[j.job_id] = pkts
    # conflicts and invalid packets, after everything (do not disturb later rounds)
    j1 = js[0]
    w0 = j1.workers[0]
    TOK = j1.token  # noqa: N806
    g = 6
    slot, bank = j1.slot_base + g % j1.n_slots, (g // j1.n_slots) % 2
    out.append((w0.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 0, 4, bank, slot, g, 0, token=TOK), [1, 2, 3, 4])))
    w1 = j1.workers[1]
    out.append((w1.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 1, 4, bank, slot, g + 1, 0, token=TOK), [5, 6, 7, 8])))  # conflict
    # the use's (tag, op, word_count) with another offset: marks worker 1 and poisons the use (conflict);
    # worker 2's ok packet then completes nothing (conflict), worker 0's retransmission gets no answer
    # (duplicate), and the bank's next use starts as usual
    w2 = j1.workers[2]
    out.append((w1.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 1, 4, bank, slot, g, 4, token=TOK), [5, 6, 7, 8])))
    out.append((w2.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 2, 4, bank, slot, g, 0, token=TOK), [9, 9, 9, 9])))
    out.append((w0.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, wire.FLAG_RETRANSMIT, 1, 0, 4, bank, slot, g, 0,
                                                      token=TOK), [1, 2, 3, 4])))
    for w in (w2, w0, w1):
        out.append((w.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, w.worker_id, 2, bank, slot, g + 2 * j1.n_slots,
                                                         64, token=TOK), [w.worker_id, 1])))
    out.append((SWITCH_SRC, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 0, 4, 0, 0, 0, 0, token=TOK), [1, 1, 1, 1])))  # unknown src
    out.append((w1.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 0, 4, 0, 0, 0, 0, token=TOK), [1, 1, 1, 1])))  # mismatch
    out.append((w1.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 1, 4, 0, 5, 0, 0, token=TOK), [1, 1, 1, 1])))  # slot range
    out.append((w1.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, wire.FLAG_RESULT, 1, 1, 4, 0, 0, 0, 0, token=TOK), [1, 1, 1, 1])))
    bad = bytearray(wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 1, 4, 0, 0, 0, 0, token=TOK), [1, 1, 1, 1]))
    bad[0] = 0x30 | (bad[0] & 0xF)  # version 3
    out.append((w1.addr, bytes(bad)))
    good = wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 1, 4, 0, 0, 0, 0, token=TOK), [1, 1, 1, 1])
    out.append((w1.addr, good[:8]))  # shorter than the header
    out.append((w1.addr, bytes([(wire.VERSION << 4) | 3]) + good[1:]))  # op 3
    out.append((w1.addr, good[:6] + b"\x00\x00" + good[8:wire.HEADER_LEN]))  # word_count 0, no words
    out.append((w1.addr, good[:-4]))  # 3 of its 4 words
    # more words than the job (and the P4 target) takes, consistent lengths
    out.append((w1.addr, wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, 1, 40, 0, 0, 0, 0, token=TOK), list(range(40)))))
    return out


def emulator_outputs(seq: list[tuple[tuple[str, int], bytes]],
                     js: list[JobSpec] | None = None) -> tuple[dict[tuple[str, int], list[bytes]], dict]:
    """Results per destination address, in order, from the emulator pipeline; and its counters."""
    from switch_emulator.admission import AdmissionTable
    from switch_emulator.pipeline import Pipeline

    got: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    adm = AdmissionTable(pool_slots=1024)
    for j in js or jobs():
        adm.admit(j)
    pipe = Pipeline(adm, lambda dg, addr: got[tuple(addr)].append(bytes(dg)))
    for src, dg in seq:
        pipe.process(dg, len(dg), src)
    return dict(got), dict(pipe.counters.items()) if hasattr(pipe.counters, "items") else {}


def test_sequence_exercises_every_verdict() -> None:
    """Runs everywhere: the sequence really contains what the differential test claims."""
    out, counters = emulator_outputs(worker_sequence())
    assert counters.get("completed", 0) == 13  # 12 rounds' uses and the use after the poisoned one
    assert counters.get("retransmit_answered", 0) >= 12
    for reason in ("duplicate", "conflict", "unknown_source", "admission_mismatch", "slot_range", "result_flag",
                   "version", "short", "op", "length", "word_count", "token"):
        assert counters.get(f"drop_{reason}", 0) >= 1, (reason, counters)
    assert counters.get("drop_stale", 0) + counters.get("retransmit_answered", 0) > 12
    assert set(out) == {w.addr for j in jobs() for w in j.workers}


# ----------------------------------------------------------------------------------------------
# BMv2
# ----------------------------------------------------------------------------------------------


def _frame(src: tuple[str, int], dg: bytes) -> bytes:
    from homagg.p4._pcap_switch import udp_frame

    idx = int(src[0].rsplit(".", 1)[1])
    return udp_frame(src, _mac(idx % 256), (SERVICE_IP, wire.HOMAGG_UDP_PORT), SERVICE_MAC, dg)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    from homagg.p4._build import build

    return build(tmp_path_factory.mktemp("p4build"), werror=True)


@pytest.mark.bmv2
def test_compiles_without_warnings(built) -> None:  # noqa: ANN001
    assert built.json.is_file() and built.p4info.is_file()
    assert built.warnings == ()


def _run_bmv2(tmp: Path, built, seq, expected: int, js: list[JobSpec] | None = None):  # noqa: ANN001, ANN202
    """Run ``seq`` into port 1 of a pcap-file BMv2 (a new ``simple_switch_grpc`` process) configured
    by the controller (checking that every controller operation is idempotent); the frames out per
    port, and the counters."""
    js = js or jobs()
    from homagg.p4 import Controller, SwitchConfig
    from homagg.p4._pcap_switch import PcapSwitch

    ports = sorted({h["port"] for h in _hosts()} | {1})
    with PcapSwitch(tmp, ports, {1: [_frame(s, d) for s, d in seq]}, grpc_port=50551) as sw:
        cfg = SwitchConfig.from_dict({"name": "s1", "grpc": sw.grpc_addr, "service_ip": SERVICE_IP,
                                      "service_mac": SERVICE_MAC, "ports": ports, "hosts": _hosts()})
        with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=10) as ctl:
            ctl.push()
            assert ctl.push() is False  # idempotent: same cookie, nothing pushed
            ctl.check_pipeline()
            ctl.configure(cfg)
            ctl.configure(cfg)  # idempotent
            for j in js:
                ctl.add_job(cfg, j)
                ctl.add_job(cfg, j)  # idempotent
            sw.wait_for(expected, timeout=60)
            time.sleep(1.0)
            counters = ctl.read_counters()
            for _ in range(2):  # removing a job is idempotent
                ctl.remove_job(cfg, js[1])
            left = {(s["ip"], s["port"]) for s in ctl.read_counters()["sources"]}
            assert left == {w.addr for w in js[0].workers}
    frames = {p: [raw for _, raw in sw.output(p)] for p in ports}  # read after the switch stopped
    return frames, counters


def _results_by_worker(frames: dict[int, list[bytes]]) -> dict[tuple[str, int], list[bytes]]:
    """The homagg payloads BMv2 sent, per destination (ip, udp port), after checking every frame's headers."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    got: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    port_of = {h["ip"]: h["port"] for h in _hosts()}
    for port, fl in frames.items():
        for raw in fl:
            e = Ether(raw)
            ip, udp = e[IP], e[UDP]
            assert port_of[ip.dst] == port
            assert e.src == SERVICE_MAC and e.dst == _mac(int(ip.dst.rsplit(".", 1)[1]))
            assert ip.src == SERVICE_IP and udp.sport == wire.HOMAGG_UDP_PORT and udp.chksum == 0
            fresh = IP(bytes(ip))
            del fresh.chksum
            assert IP(bytes(fresh)).chksum == ip.chksum, "IPv4 checksum"
            assert (ip.ttl, ip.id, ip.flags.value, ip.tos) == (64, 0, 2, 0)
            got[(ip.dst, udp.dport)].append(bytes(udp.payload))
    return got


@pytest.mark.bmv2
def test_differential_emulator_vs_bmv2(tmp_path: Path, built) -> None:  # noqa: ANN001
    seq = worker_sequence()
    want, emu_counters = emulator_outputs(seq)
    expected = sum(len(v) for v in want.values())
    frames, counters = _run_bmv2(tmp_path, built, seq, expected)
    got = _results_by_worker(frames)
    assert set(got) == set(want)
    for dst in want:
        assert got[dst] == want[dst], f"results to {dst} differ"
    # forged datagrams (admitted source, wrong token) are dropped and counted by both
    assert emu_counters.get("drop_token", 0) >= 5
    for name in ("duplicate", "conflict", "unknown_source", "admission_mismatch", "slot_range", "result_flag",
                 "version", "stale", "short", "op", "length", "word_count", "token"):
        assert counters.get(f"drop_{name}", 0) == emu_counters.get(f"drop_{name}", 0), name


@pytest.mark.bmv2
def test_restart_then_controller_again_new_job_exact(tmp_path: Path, built) -> None:  # noqa: ANN001
    """``simple_switch_grpc`` is restarted (the first process exits with the jobs half done: the
    sequence is cut in the middle of a round) and the controller run again (push, configure, add):
    new jobs, with new tokens, run exactly -- the same results as the emulator -- and packets with
    the old tokens are dropped as ``drop_token``."""
    from dataclasses import replace

    seq = worker_sequence()
    first = seq[: len(seq) // 2]
    want1, _ = emulator_outputs(first)
    _run_bmv2(tmp_path / "before", built, first, sum(len(v) for v in want1.values()))
    new_jobs = [replace(j, token=j.token ^ 0x0F0F0F0F) for j in jobs()]  # re-admitted: new tokens
    stale = first[:6]  # old-token packets from admitted sources, before the new jobs' traffic
    seq2 = stale + worker_sequence(seed=9, js=new_jobs)
    want2, emu2 = emulator_outputs(seq2, new_jobs)
    assert emu2.get("drop_token", 0) >= len(stale)
    frames, counters = _run_bmv2(tmp_path / "after", built, seq2, sum(len(v) for v in want2.values()), new_jobs)
    got = _results_by_worker(frames)
    assert set(got) == set(want2)
    for dst in want2:
        assert got[dst] == want2[dst], f"results to {dst} differ after the restart"
    assert counters.get("drop_token", 0) == emu2["drop_token"]


@pytest.mark.bmv2
def test_readmission_starts_from_zero(tmp_path: Path, built) -> None:  # noqa: ANN001
    """Admitting a job again resets its cells (the admission epoch; PI cannot write registers).

    Live traffic through a veth pair (root only): job 1 completes slot 0; worker 0 starts slot 1;
    the job is admitted again; workers 1 and 2 then send slot 1 (FIRST + ADD under the new epoch:
    nothing completes), worker 0's retransmission into slot 0 is a FIRST (no answer), and worker
    0's slot-1 packet completes slot 1 with the sum of the three contributions.  The emulator,
    given a freshly admitted job at the same point, gives the same results.
    """
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root (veth pair)")
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.sendrecv import AsyncSniffer, sendp

    from homagg.p4 import Controller, SwitchConfig
    from switch_emulator.admission import AdmissionTable
    from switch_emulator.pipeline import Pipeline

    a, b = "hgt1a", "hgt1b"
    subprocess.run(["ip", "link", "del", a], capture_output=True, check=False)
    subprocess.run(["ip", "link", "add", a, "type", "veth", "peer", "name", b], check=True)
    for i in (a, b):
        subprocess.run(["ip", "link", "set", i, "up"], check=True)
        subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{i}.disable_ipv6=1"], check=False)
    j = jobs()[0]
    hosts = [{"ip": w.ip, "mac": _mac(w.worker_id + 1), "port": 1} for w in j.workers]
    cfg = SwitchConfig.from_dict({"name": "s1", "grpc": "127.0.0.1:50581", "service_ip": SERVICE_IP,
                                  "service_mac": SERVICE_MAC, "ports": [1], "hosts": hosts})
    log = open(tmp_path / "bmv2.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([shutil.which("simple_switch_grpc"), "--device-id", "0", "-i", f"1@{a}", "--no-p4",
                             "--", "--grpc-server-addr", "127.0.0.1:50581"], stdout=log, stderr=subprocess.STDOUT)

    def pkt(w: int, g: int, words: list[int]) -> tuple[tuple[str, int], bytes]:
        slot, bank = j.slot_base + g % j.n_slots, (g // j.n_slots) % 2
        return j.workers[w].addr, wire.pack_packet(
            wire.Header(wire.VERSION, 0, 0, 1, w, 4, bank, slot, g, 4 * g, token=j.token), words)

    phase1 = [pkt(w, 0, [w + 1, 10, 100, -5]) for w in range(3)] + [pkt(0, 1, [7, 7, 7, 7])]
    phase2 = [pkt(1, 1, [1, 2, 3, 4]), pkt(2, 1, [5, 6, 7, 8]), pkt(0, 0, [1, 10, 100, -5]),
              pkt(0, 1, [7, 7, 7, 7])]
    want: list[bytes] = []
    for phase in (phase1, phase2):
        adm = AdmissionTable(pool_slots=1024)
        adm.admit(j)
        pipe = Pipeline(adm, lambda dg, addr: want.append(bytes(dg)) if addr == j.workers[0].addr else None)
        for src, dg in (phase1 if phase is phase1 else phase2):
            pipe.process(dg, len(dg), src)
    try:
        with Controller(cfg.grpc, 0, p4info=built.p4info, bmv2_json=built.json, timeout=10) as ctl:
            ctl.push()
            ctl.configure(cfg)
            ctl.add_job(cfg, j)
            sniffer = AsyncSniffer(iface=b, lfilter=lambda e: UDP in e and e[IP].src == SERVICE_IP
                                   and e[IP].dst == j.workers[0].ip)
            sniffer.start()
            time.sleep(0.5)

            def send(seq) -> None:  # noqa: ANN001
                for src, dg in seq:
                    sendp(Ether(bytes(Ether(src=_mac(1), dst=SERVICE_MAC) / IP(src=src[0], dst=SERVICE_IP)
                                      / UDP(sport=src[1], dport=wire.HOMAGG_UDP_PORT) / dg)), iface=b, verbose=False)
                    time.sleep(0.05)

            send(phase1)
            time.sleep(0.5)
            ctl.add_job(cfg, j)  # admitted again: fresh epoch
            send(phase2)
            time.sleep(1.0)
            got = [bytes(e[UDP].payload) for e in sniffer.stop()]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
        subprocess.run(["ip", "link", "del", a], capture_output=True, check=False)
    assert len(want) == 2  # slot 0 complete in phase 1; slot 1 complete at the end of phase 2
    assert got == want
