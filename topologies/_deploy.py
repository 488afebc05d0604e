"""What a topology hands to the runner: hosts, addresses, and how to start/stop its switch.

Invariants: ``workers[r]`` is the host of rank ``r``; ``switch_addr(r)`` and ``control_addr(r)``
are the addresses rank ``r`` uses (reachable from its host); every process started through
:meth:`Deployment.popen` is recorded and terminated by :meth:`Deployment.stop`, which never raises.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["LinkOpts", "WorkerSite", "Deployment", "REPO_ROOT", "python_env"]

REPO_ROOT = Path(__file__).resolve().parents[1]


def python_env() -> dict[str, str]:
    """Environment for the project's Python inside Mininet hosts (repo on PYTHONPATH)."""
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


_NETEM: bool | None = None


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (TCLink's delay and loss need it); probed once."""
    global _NETEM
    if _NETEM is None:
        ns = f"hgprobe{os.getpid()}"
        subprocess.run(["ip", "netns", "add", ns], capture_output=True, check=False)
        try:
            r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                "loss", "0%"], capture_output=True, check=False)
            _NETEM = r.returncode == 0
        finally:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    return _NETEM


@dataclass(frozen=True)
class LinkOpts:
    """Parameters of every worker link: bandwidth (Mbit/s), delay ("1ms"), loss (percent, each direction).

    With netem (most kernels) all three are TCLink parameters.  Without netem (some container
    kernels), loss is applied by :meth:`apply_host_loss` with iptables' ``statistic`` match on the
    INPUT chain of the *receiving* namespace (an OUTPUT-chain drop would fail the sender's
    ``sendto`` with EPERM instead of losing the packet silently): worker hosts for the downlink,
    the emulator's switch host for the uplink.  A BMv2 switch reads its ports with raw sockets that
    netfilter cannot touch, so with BMv2 and no netem only the downlink loses packets.  A delay
    is refused without netem.
    """

    bw: float | None = None
    delay: str | None = None
    loss: float = 0.0

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.bw:
            out["bw"] = self.bw
        if self.delay:
            if not netem_available():
                raise RuntimeError("link delay needs the netem qdisc, which this kernel lacks")
            out["delay"] = self.delay
        if self.loss and netem_available():
            out["loss"] = self.loss
        return out

    def apply_host_loss(self, host: Any, intf: str) -> str | None:
        """Drop ``loss`` percent of what ``host`` receives on ``intf`` (iptables) when netem is missing."""
        if not self.loss or netem_available():
            return None
        p = self.loss / 100.0
        out = host.cmd(f"iptables -A INPUT -i {intf} -m statistic --mode random --probability {p} -j DROP; echo rc=$?")
        if "rc=0" not in out:
            raise RuntimeError(f"cannot emulate {self.loss}% loss on {host.name}:{intf} (no netem, iptables: {out!r})")
        return f"iptables INPUT statistic {p} on {host.name}:{intf}"


@dataclass
class WorkerSite:
    host: Any
    ip: str
    switch_ip: str
    intf: str
    #: (switch host, its interface towards this worker) when the switch is a Mininet host
    switch_side: tuple[Any, str] | None = None


@dataclass
class Deployment:
    """A built (and started) Mininet network with its homagg switch."""

    net: Any
    workers: list[WorkerSite]
    kind: str
    data_port: int
    control_port: int
    switch_nodes: list[Any] = field(default_factory=list)
    capture_intfs: list[tuple[Any, str]] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)
    extra_stop: list[Callable[[], None]] = field(default_factory=list)
    raw_ifaces: list[str] = field(default_factory=list)  # switch ports served by the raw backend
    #: two_tier: each leaf's uplink as (the node that owns it, its interface name), leaf order
    uplinks: list[tuple[Any, str]] = field(default_factory=list)
    #: two_tier with aggregating leaves (a tree): per leaf, (its data address as the spine sees it,
    #: the spine's data address as the leaf sees it)
    tree_links: list[tuple[tuple[str, int], tuple[str, int]]] = field(default_factory=list)

    def uplink_bytes(self) -> list[dict[str, int]]:
        """Bytes each uplink has sent up (``up``: the leaf's transmit counter) and down (``down``:
        its receive counter) so far, from the kernel's interface counters, leaf order."""
        out = []
        for node, intf in self.uplinks:
            text = node.cmd(f"cat /sys/class/net/{intf}/statistics/tx_bytes /sys/class/net/{intf}/statistics/rx_bytes")
            tx, rx = (int(v) for v in text.split()[:2])
            out.append({"up": tx, "down": rx})
        return out

    def apply_loss(self, link: LinkOpts) -> list[str]:
        """Per-worker-link loss where TCLink cannot (see :class:`LinkOpts`); returns what was done."""
        done = [link.apply_host_loss(s.host, s.intf) for s in self.workers]
        done += [link.apply_host_loss(*s.switch_side) for s in self.workers if s.switch_side is not None]
        return [d for d in done if d]

    def switch_addr(self, rank: int) -> str:
        return f"{self.workers[rank].switch_ip}:{self.data_port}"

    def control_addr(self, rank: int) -> str:
        return f"{self.workers[rank].switch_ip}:{self.control_port}"

    def popen(self, node: Any, cmd: list[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
        fh = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.logs.append(fh)
        proc = node.popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT), env=python_env(), **kw)
        self.procs.append(proc)
        return proc

    def python(self, node: Any, args: list[str], log: Path) -> subprocess.Popen[bytes]:
        return self.popen(node, [sys.executable, *args], log)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for fn in self.extra_stop:
            try:
                fn()
            except Exception:  # noqa: BLE001 - teardown must go on
                pass
        for fh in self.logs:
            fh.close()
        try:
            self.net.stop()
        except Exception:  # noqa: BLE001
            pass
