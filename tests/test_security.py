"""Admission security: the control port wants the shared secret, fault injection is opt-in, the
control port listens on loopback by default, and a forged datagram from an admitted source with
the wrong job token is dropped and counted while the job's result stays exact (real sockets)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import switch_emulator
from homagg import wire
from homagg._errors import AuthenticationError, ConfigError
from homagg.transport import ControlClient, Stream, UdpSwitchPort
from homagg.transport._auth import SECRET_ENV, SECRET_FILE_ENV
from switch_emulator._cli import addresses

ROOT = Path(__file__).resolve().parents[1]


def _raw(addr: tuple[str, int], req: dict) -> dict:
    with socket.create_connection(addr, timeout=10) as s:
        s.sendall(json.dumps(req).encode() + b"\n")
        return json.loads(s.makefile("rb").readline())


def test_control_requests_without_or_with_a_wrong_secret_are_refused(caplog: pytest.LogCaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)
    caplog.set_level(logging.INFO, logger="homagg.switch")
    with switch_emulator.start() as sw:
        addr = sw.control_addr
        for req in ({"cmd": "admit", "job": {"world_size": 2}}, {"cmd": "status"}, {"cmd": "remove", "job_id": 1},
                    {"cmd": "admit", "job": {"world_size": 2}, "secret": "x" * 64}):
            r = _raw(addr, req)
            assert not r["ok"] and r["refused"] == "secret", r
        assert sw.switch.admission.jobs == {}  # nothing was admitted
        assert _raw(addr, {"cmd": "ping"})["ok"]  # liveness only: version and data address
        with pytest.raises(AuthenticationError, match="not the switch's"):
            ControlClient(addr, secret="y" * 32).admit(2)
        # the right secret (found automatically: this process started the switch)
        with ControlClient(addr) as ctl:
            job = ctl.admit(2)
            assert job.token != 0
            assert ctl.remove(job.job_id)
    text = caplog.text
    # the four raw requests, and the wrong-secret client's admit after its refused proof
    assert text.count("refused: not authenticated") == 5 and text.count("refused: wrong proof") == 1
    assert f"job {job.job_id} admitted by 127.0.0.1:" in text and f"job {job.job_id} removed by" in text
    assert sw.secret not in text and str(job.token) not in text  # never logged


def test_another_process_needs_the_secret_from_the_environment(tmp_path: Path) -> None:
    with switch_emulator.spawn() as sw:
        code = ("import sys; from homagg.transport import ControlClient\n"
                "from homagg._errors import AuthenticationError\n"
                f"c = ControlClient(({sw.control_addr[0]!r}, {sw.control_addr[1]}))\n"
                "try:\n    c.status(); print('ok')\nexcept AuthenticationError: print('refused')\n")
        env = {k: v for k, v in __import__("os").environ.items() if k not in (SECRET_ENV, SECRET_FILE_ENV)}
        env["PYTHONPATH"] = str(ROOT)
        run = lambda e: subprocess.run([sys.executable, "-c", code], env=e, capture_output=True,  # noqa: E731
                                       text=True, timeout=60).stdout.strip()
        assert run(env) == "refused"
        secret_file = tmp_path / "secret"
        secret_file.write_text(sw.secret + "\n")
        assert run({**env, SECRET_FILE_ENV: str(secret_file)}) == "ok"
        assert run({**env, SECRET_ENV: sw.secret}) == "ok"
        # the child got its secret through the environment, never its command line
        assert sw.process is not None
        cmdline = Path(f"/proc/{sw.process.pid}/cmdline").read_bytes()
        assert sw.secret.encode() not in cmdline


def test_fault_injection_is_refused_unless_enabled_at_start() -> None:
    with switch_emulator.start() as sw:
        with ControlClient(sw.control_addr) as ctl:
            with pytest.raises(ConfigError, match="--allow-faults"):
                ctl.set_faults(drop=0.5)
            assert ctl.status()["faults"]["drop"] == 0.0 and not ctl.status()["faults_allowed"]
    with switch_emulator.start(allow_faults=True) as sw:
        with ControlClient(sw.control_addr) as ctl:
            assert ctl.set_faults(drop=0.5)["drop"] == 0.5


def test_control_port_defaults_to_loopback() -> None:
    assert addresses("10.0.0.9:5000", None) == (("10.0.0.9", 5000), ("127.0.0.1", 5001))
    assert addresses("0.0.0.0:5000", None)[1] == ("127.0.0.1", 5001)
    assert addresses("[::]:5000", None)[1] == ("::1", 5001)
    assert addresses("10.0.0.9:5000", "10.0.0.9:7") == (("10.0.0.9", 5000), ("10.0.0.9", 7))  # told otherwise


def test_forged_datagram_with_right_source_wrong_token_is_dropped_and_counted() -> None:
    """An off-path attacker spoofs worker 1's source address and port (here: it shares the socket,
    which is what a spoofed source looks like to the switch) but guesses the token: the switch drops
    and counts each forged datagram and the job's sum stays exact."""
    with switch_emulator.start() as sw:
        with ControlClient(sw.control_addr) as ctl:
            job = ctl.admit(2, n_slots=4, words_per_packet=8)
        ports = [UdpSwitchPort(sw.data_addr, rank=r, job=job, control=sw.control_addr, timeout=20) for r in (0, 1)]
        try:
            victim = ports[1].sock  # its (ip, port) is admitted as worker 1
            forged = 0
            for g in range(4):  # the first uses of the job's slots, with guessed tokens
                for guess in (0, job.token ^ 1, job.token + 12345 & 0xFFFFFFFF):
                    h = wire.Header(wire.VERSION, wire.OP_ADD, 0, job.job_id, 1, 8, 0, job.slot_base + g, g, 0,
                                    token=guess)
                    victim.send(wire.pack_packet(h, [2**31 - 1] * 8))
                    forged += 1
            data = [np.arange(20, dtype=np.int32) * (r + 1) for r in (0, 1)]
            out: list = [None, None]

            def run(r: int) -> None:
                out[r] = ports[r].combine([Stream("x", wire.CombineOp.ADD, torch.from_numpy(data[r]))])

            ts = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            for r in (0, 1):
                assert out[r][0].numpy().tolist() == (data[0] + data[1]).tolist()
            c = ControlClient(sw.control_addr).status()["counters"]
            assert c["drop_token"] == forged, c
        finally:
            for p in ports:
                p.close()
