"""BMv2 with pcap files for ports: ``simple_switch_grpc --use-files`` (no interfaces, no root).

Port ``p`` reads its input from ``p<p>_in.pcap`` and writes what it sends to ``p<p>_out.pcap``
in the switch's folder.  BMv2 waits ``start_delay_s`` seconds before it reads the inputs, which
leaves time to push the pipeline and the entries (:class:`homagg.p4.Controller`).  Used by the
differential test (``tests/test_p4_bmv2.py``) and ``homagg bench p4rate``.

Invariants: every port has an input file (empty when nothing is sent on it) before the switch
starts; :meth:`PcapSwitch.output` returns the complete records of a file that may still be
being written (a cut-off last record is left out); the process is always stopped on exit.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from .._errors import ConfigError

__all__ = ["SIMPLE_SWITCH", "P4C", "missing_tools", "udp_frame", "write_pcap", "read_pcap", "PcapSwitch"]

SIMPLE_SWITCH = "simple_switch_grpc"
P4C = "p4c-bm2-ss"
_PCAP_US, _PCAP_NS = 0xA1B2C3D4, 0xA1B23C4D  # pcap magic numbers: microsecond / nanosecond stamps
_LINKTYPE_ETHERNET = 1


def missing_tools() -> list[str]:
    """The BMv2 tools (``p4c-bm2-ss``, ``simple_switch_grpc``) that are not on PATH."""
    return [t for t in (P4C, SIMPLE_SWITCH) if shutil.which(t) is None]


def udp_frame(src: tuple[str, int], src_mac: str, dst: tuple[str, int], dst_mac: str, payload: bytes) -> bytes:
    """An Ethernet / IPv4 (TTL 64, checksum set) / UDP frame carrying ``payload`` (needs scapy)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    return bytes(Ether(src=src_mac, dst=dst_mac) / IP(src=src[0], dst=dst[0], ttl=64)
                 / UDP(sport=src[1], dport=dst[1]) / payload)


def write_pcap(path: Path, frames: Iterable[bytes], stamps: Iterable[float] | None = None) -> None:
    """Ethernet ``frames`` as a pcap file, microsecond stamps: ``stamps`` (seconds), else all zero.

    BMv2's ``--use-files`` reader replays an input file with its recorded timing (a frame leaves
    ``stamp - first stamp`` seconds after the reader started); all-zero stamps mean "at once"."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", _PCAP_US, 2, 4, 0, 0, 65535, _LINKTYPE_ETHERNET))
        for fr, t in zip(frames, stamps if stamps is not None else iter(float, 1)):
            us = round(t * 1e6)
            f.write(struct.pack("<IIII", us // 1_000_000, us % 1_000_000, len(fr), len(fr)))
            f.write(fr)


def read_pcap(path: Path) -> list[tuple[float, bytes]]:
    """``[(timestamp in seconds, frame), ...]`` of a pcap file; [] if it has no complete header."""
    data = path.read_bytes() if path.exists() else b""
    if len(data) < 24:
        return []
    for order in ("<", ">"):
        (magic,) = struct.unpack(order + "I", data[:4])
        if magic in (_PCAP_US, _PCAP_NS):
            break
    else:
        raise ConfigError(f"{path} is not a pcap file")
    scale = 1e-9 if magic == _PCAP_NS else 1e-6
    out, pos = [], 24
    while pos + 16 <= len(data):
        sec, frac, incl, _orig = struct.unpack(order + "IIII", data[pos:pos + 16])
        if pos + 16 + incl > len(data):
            break  # the record is still being written
        out.append((sec + frac * scale, data[pos + 16:pos + 16 + incl]))
        pos += 16 + incl
    return out


class PcapSwitch:
    """``simple_switch_grpc --use-files`` in ``folder`` with ``ports``; a context manager.

    ``inputs`` maps a port to the frames it receives (in order).  gRPC listens on
    ``127.0.0.1:<grpc_port>`` (thrift on ``grpc_port + 1``); ``bmv2_args`` go before ``--no-p4``
    (e.g. ``("--log-level", "off")``).  The switch's output goes to ``folder/bmv2.log``.
    """

    def __init__(self, folder: Path, ports: Iterable[int], inputs: Mapping[int, list[bytes]], *,
                 stamps: Mapping[int, list[float]] | None = None,
                 grpc_port: int = 50551, bmv2_args: tuple[str, ...] = (), start_delay_s: int = 12,
                 device_id: int = 0) -> None:
        self.folder, self.ports = Path(folder), sorted(set(ports) | set(inputs))
        self.stamps = dict(stamps or {})
        self.inputs, self.grpc_port, self.bmv2_args = inputs, grpc_port, bmv2_args
        self.start_delay_s, self.device_id = start_delay_s, device_id
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_addr(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> PcapSwitch:
        exe = shutil.which(SIMPLE_SWITCH)
        if exe is None:
            raise ConfigError(f"{SIMPLE_SWITCH} not on PATH; see README.md, section 'Getting p4c and BMv2'")
        self.folder.mkdir(parents=True, exist_ok=True)
        for p in self.ports:
            write_pcap(self.folder / f"p{p}_in.pcap", self.inputs.get(p, []), self.stamps.get(p))
        args = [exe, "--use-files", str(self.start_delay_s), "--device-id", str(self.device_id),
                "--thrift-port", str(self.grpc_port + 1)]
        for p in self.ports:
            args += ["-i", f"{p}@p{p}"]
        args += [*self.bmv2_args, "--no-p4", "--", "--grpc-server-addr", self.grpc_addr]
        with open(self.folder / "bmv2.log", "wb") as log:
            self.proc = subprocess.Popen(args, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def output(self, port: int) -> list[tuple[float, bytes]]:
        """``[(timestamp, frame), ...]`` the switch has sent on ``port`` so far."""
        return read_pcap(self.folder / f"p{port}_out.pcap")

    def count(self) -> int:
        """Frames sent so far, all ports."""
        return sum(len(self.output(p)) for p in self.ports)

    def wait_for(self, expected: int, timeout: float) -> int:
        """Wait until ``expected`` frames went out (or ``timeout`` seconds); the count reached."""
        deadline = time.monotonic() + timeout
        n = self.count()
        while n < expected and time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ConfigError(f"{SIMPLE_SWITCH} exited ({self.proc.returncode}); see {self.folder / 'bmv2.log'}")
            time.sleep(0.5)
            n = self.count()
        return n
