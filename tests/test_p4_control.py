"""The P4 controller's pieces that need no BMv2: job files, the ``homagg control`` command's error
path, the pcap files BMv2 runs use, and ``homagg bench p4rate``'s sequence and check.

Oracles: the same description written as JSON and TOML; scapy's pcap reader/writer; the emulator
pipeline (:class:`switch_emulator.pipeline.Pipeline`) for the benchmark's expected results.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from homagg import wire

SERVICE_IP, SERVICE_MAC = "10.0.0.254", "02:48:41:00:00:fe"


def _mac(i: int) -> str:
    return f"02:48:41:00:00:{i:02x}"


_SWITCH = {"name": "s1", "grpc": "127.0.0.1:1", "service_ip": SERVICE_IP, "service_mac": SERVICE_MAC,
           "ports": [1, 2], "hosts": [{"ip": "10.0.0.1", "mac": _mac(1), "port": 1},
                                      {"ip": "10.0.0.2", "mac": _mac(2), "port": 2}]}
_JOB = {"job_id": 3, "world_size": 2, "n_slots": 4,
        "workers": [{"worker_id": 0, "ip": "10.0.0.1", "port": 18500}, {"worker_id": 1, "ip": "10.0.0.2", "port": 18500}]}
_TOML = f"""
[[jobs]]
job_id = 3
world_size = 2
n_slots = 4
workers = [{{worker_id = 0, ip = "10.0.0.1", port = 18500}}, {{worker_id = 1, ip = "10.0.0.2", port = 18500}}]

[[bmv2.switches]]
name = "s1"
grpc = "127.0.0.1:1"
service_ip = "{SERVICE_IP}"
service_mac = "{SERVICE_MAC}"
ports = [1, 2]
hosts = [{{ip = "10.0.0.1", mac = "{_mac(1)}", port = 1}}, {{ip = "10.0.0.2", mac = "{_mac(2)}", port = 2}}]

[[bmv2.switches]]
name = "leaf"
grpc = "127.0.0.1:2"
ports = [1]
"""


def test_job_file_json_and_toml_read_alike(tmp_path: Path) -> None:
    """The controller reads the job file through homagg.jobs (JSON and TOML); both give the same."""
    from homagg.jobs import JobSpec, load_jobs
    from homagg.p4 import HostPort, SwitchConfig, load_switches

    leaf = {"name": "leaf", "grpc": "127.0.0.1:2", "ports": [1]}
    (tmp_path / "job.json").write_text(json.dumps({"jobs": [_JOB], "bmv2": {"switches": [_SWITCH, leaf]}}))
    (tmp_path / "job.toml").write_text(_TOML)
    want = [SwitchConfig("s1", "127.0.0.1:1", 0, SERVICE_IP, SERVICE_MAC, (1, 2),
                         (HostPort("10.0.0.1", _mac(1), 1), HostPort("10.0.0.2", _mac(2), 2))),
            SwitchConfig("leaf", "127.0.0.1:2", ports=(1,))]
    for name in ("job.json", "job.toml"):
        assert load_switches(tmp_path / name) == want, name
        assert load_jobs(tmp_path / name) == [JobSpec.from_dict(_JOB)], name
    assert want[0].host("10.0.0.2").port == 2


def test_job_file_errors(tmp_path: Path) -> None:
    from homagg import ConfigError
    from homagg.p4 import SwitchConfig, load_switches

    (tmp_path / "nobmv2.json").write_text('{"jobs": []}')
    with pytest.raises(ConfigError, match="no bmv2.switches"):
        load_switches(tmp_path / "nobmv2.json")
    (tmp_path / "bad.toml").write_text("[[bmv2.switches]]\nname = ")
    with pytest.raises(ConfigError, match="cannot read"):
        load_switches(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="bad bmv2 switch"):
        SwitchConfig.from_dict({"name": "s1"})  # no grpc address
    with pytest.raises(ConfigError, match="no host entry"):
        SwitchConfig.from_dict(_SWITCH).host("10.0.0.9")


def test_control_command_unreachable_switch(tmp_path: Path) -> None:
    """``homagg control`` on a TOML job file: nothing listens at the gRPC address -> typed error."""
    import argparse

    from homagg import HomAggError
    from homagg.p4 import SwitchUnreachableError
    from homagg.p4 import _control

    pytest.importorskip("grpc")
    pytest.importorskip("p4.v1.p4runtime_pb2")
    (tmp_path / "job.toml").write_text(_TOML)
    (tmp_path / "empty.p4info.txtpb").write_text("")  # a valid, empty P4Info
    parser = argparse.ArgumentParser()
    _control.configure_parser(parser)
    args = parser.parse_args(["check", "--config", str(tmp_path / "job.toml"), "--switch", "s1",
                              "--p4info", str(tmp_path / "empty.p4info.txtpb"), "--timeout", "0.3"])
    with pytest.raises(SwitchUnreachableError, match="no P4Runtime server at 127.0.0.1:1") as info:
        _control.run(args)
    assert isinstance(info.value, HomAggError)
    args.switch = "s9"
    with pytest.raises(HomAggError, match="no switch named 's9'"):
        _control.run(args)


def test_pcap_files_agree_with_scapy(tmp_path: Path) -> None:
    """The pcap writer/reader BMv2 runs use: scapy (the oracle) reads what we write and vice versa,
    and a record cut short (a file being written) is left out."""
    from scapy.layers.l2 import Ether
    from scapy.utils import rdpcap, wrpcap

    from homagg.p4._pcap_switch import read_pcap, udp_frame, write_pcap

    frames = [udp_frame((f"10.0.0.{i + 1}", 40000 + i), _mac(i + 1), (SERVICE_IP, wire.HOMAGG_UDP_PORT), SERVICE_MAC,
                        wire.pack_packet(wire.Header(wire.VERSION, 0, 0, 1, i, 2, 0, i, i, 0), [i, -i])) for i in range(5)]
    write_pcap(tmp_path / "ours.pcap", frames)
    assert [bytes(p) for p in rdpcap(str(tmp_path / "ours.pcap"))] == frames
    pkts = [Ether(f) for f in frames]
    for i, p in enumerate(pkts):
        p.time = 1000 + i / 8
    wrpcap(str(tmp_path / "scapy.pcap"), pkts)
    got = read_pcap(tmp_path / "scapy.pcap")
    assert [f for _, f in got] == frames and [t for t, _ in got] == [1000 + i / 8 for i in range(5)]
    data = (tmp_path / "scapy.pcap").read_bytes()
    (tmp_path / "cut.pcap").write_bytes(data[:-3])
    assert [f for _, f in read_pcap(tmp_path / "cut.pcap")] == frames[:4]
    (tmp_path / "empty.pcap").write_bytes(b"")
    assert read_pcap(tmp_path / "empty.pcap") == [] and read_pcap(tmp_path / "absent.pcap") == []


def test_p4rate_sequence_and_check_against_the_emulator() -> None:
    """``homagg bench p4rate``'s packets, through the emulator pipeline, give what its check expects;
    the check rejects a wrong word and counts a missing result as lost in its step."""
    from homagg import ProtocolError
    from homagg.bench import _p4rate
    from homagg.p4._pcap_switch import udp_frame
    from switch_emulator.admission import AdmissionTable
    from switch_emulator.pipeline import Pipeline

    rounds = 7
    job = _p4rate.rate_job()
    port_of = {w.addr: w.worker_id + 1 for w in job.workers}
    out: dict[int, list[tuple[float, bytes]]] = defaultdict(list)
    adm = AdmissionTable(pool_slots=1024)
    adm.admit(job)

    def deliver(dg: bytes, addr: tuple[str, int]) -> None:
        frame = udp_frame((SERVICE_IP, wire.HOMAGG_UDP_PORT), SERVICE_MAC, tuple(addr), _mac(1), bytes(dg))
        out[port_of[tuple(addr)]].append((0.0, frame))

    pipe = Pipeline(adm, deliver)
    for src, dg in _p4rate.rate_sequence(rounds):
        pipe.process(dg, len(dg), src)
    assert sorted(out) == [1, 2, 3]
    steps = _p4rate._steps(dict(out), 4, (100, 200))  # 7 rounds as steps of 4: the second lacks one round
    assert [st["received"] for st in steps] == [12, 9] and [st["lost"] for st in steps] == [0, 3]
    steps = _p4rate._steps({**out, 2: out[2][:6]}, 7, (100,))
    assert steps[0]["received"] == 20 and steps[0]["lost"] == 1
    bad = bytearray(out[2][3][1])
    bad[-1] ^= 1
    out[2][3] = (0.0, bytes(bad))
    with pytest.raises(ProtocolError, match="differs"):
        _p4rate._steps(dict(out), 7, (100,))
    assert _p4rate.staircase(2, (300, 600)) == pytest.approx([0.0, 0.01, 0.02 + _p4rate.GAP_S, 0.025 + _p4rate.GAP_S])


def test_p4rate_without_bmv2_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the BMv2 tools the benchmark exits non-zero naming what is missing."""
    import argparse

    from homagg import ConfigError
    from homagg.bench import _p4rate

    monkeypatch.setenv("PATH", "")
    parser = argparse.ArgumentParser()
    _p4rate.configure_parser(parser)
    with pytest.raises(ConfigError, match="p4c-bm2-ss \\(not on PATH\\), simple_switch_grpc \\(not on PATH\\)"):
        _p4rate.run(parser.parse_args([]))


def test_address_converters_one_definition() -> None:
    """Table keys and parameters of the P4Runtime controller and the BF Runtime writes come from
    one pair of converters (``homagg.p4._switches``); oracles: ipaddress and the bytes of the MAC."""
    import ipaddress

    from homagg import ConfigError
    from homagg.p4 import _controller, _switches, bfrt

    assert _switches.ipv4_int("10.0.0.254") == int(ipaddress.IPv4Address("10.0.0.254")) == 0x0A0000FE
    assert _switches.mac_int("02:48:41:00:00:Fe") == int.from_bytes(bytes([2, 0x48, 0x41, 0, 0, 0xFE]), "big")
    for bad in ("10.0.0.256", "10.0.0", "", "::1"):
        with pytest.raises(ConfigError, match="IPv4"):
            _switches.ipv4_int(bad)
    for bad in ("02:48:41:00:00", "0248410000fe", "02-48-41-00-00-fe", "02:48:41:00:00:fg"):
        with pytest.raises(ConfigError, match="MAC"):
            _switches.mac_int(bad)
    for mod in (_controller, bfrt):
        assert not hasattr(mod, "_ip") and not hasattr(mod, "_mac")
        assert mod.ipv4_int is _switches.ipv4_int and mod.mac_int is _switches.mac_int


def test_controller_check_job_needs_no_switch() -> None:
    from homagg import ConfigError
    from homagg.jobs import JobSpec
    from homagg.p4 import Controller, p4_constants

    pool = p4_constants()["SLOT_POOL_SIZE"].value
    Controller.check_job(JobSpec(1, 2, slot_base=pool - 4, n_slots=4, words_per_packet=wire.P4_WORDS))
    with pytest.raises(ConfigError, match="exceed the P4 pool"):
        Controller.check_job(JobSpec(1, 2, slot_base=pool - 4, n_slots=5, words_per_packet=8))
    with pytest.raises(ConfigError, match="words_per_packet"):
        Controller.check_job(JobSpec(1, 2, slot_base=0, n_slots=4, words_per_packet=wire.P4_WORDS + 1))
