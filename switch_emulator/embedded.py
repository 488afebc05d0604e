"""Run the emulator inside this process (a background thread) or as a subprocess.

Both return a :class:`RunningSwitch` with ``data_addr`` (where workers send datagrams),
``control_addr`` (the JSON-lines control port) and ``stop()``; both are context managers::

    from switch_emulator import start, spawn
    with start() as sw:                      # thread; sw.switch is the live Switch object
        ctl = ControlClient(sw.control_addr)
    with spawn(drop=0.01) as sw:             # `python -m switch_emulator` child process
        ...

Use :func:`spawn` when the workers run in this process too (the emulator then has its own GIL);
the ``homagg`` process group's embedded default does.

Both generate the control secret unless given one (``secret=``), hand it to a child through its
environment (never its command line), and record it for this process's control clients
(:func:`homagg.transport._auth.remember_secret`); ``RunningSwitch.secret`` holds it for passing on
to workers in other processes.  Fault injection over the control port is off unless
``allow_faults`` (or fault rates given at start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import IO

from homagg._errors import TransportError
from homagg.jobs import SWITCH_POOL_SLOTS
from homagg.transport._auth import SECRET_ENV, SECRET_FILE_ENV, forget_secret, new_secret, remember_secret

from .control import ControlServer
from .faults import FaultConfig
from .io_udp import UdpBackend
from .switch import Switch

__all__ = ["RunningSwitch", "start", "spawn"]

Addr = tuple[str, int]


@dataclass
class RunningSwitch:
    data_addr: Addr
    control_addr: Addr
    switch: Switch | None = None  #: the live object (in-thread only)
    process: subprocess.Popen[str] | None = None  #: the child (subprocess only)
    secret: str = field(default="", repr=False)  #: the control secret (never print it)
    _stoppers: list = field(default_factory=list, repr=False)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and release the ports (idempotent; a child is waited for, bounded)."""
        forget_secret(self.control_addr)
        while self._stoppers:
            self._stoppers.pop()()
        if self.process is not None and self.process.stdin is not None:
            try:
                self.process.stdin.close()  # the child's --watch-stdin sees EOF and stops
            except OSError:
                pass
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        if self.process is not None and self.process.poll() is not None and self.process.stdout is not None:
            self.process.stdout.close()  # the ready line's pipe: no file left open per stopped child

    def __enter__(self) -> RunningSwitch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    listen: Addr = ("127.0.0.1", 0),
    control: Addr = ("127.0.0.1", 0),
    *,
    pool_slots: int = SWITCH_POOL_SLOTS,
    faults: FaultConfig | None = None,
    allow_faults: bool | None = None,
    secret: str | None = None,
    engine: str = "auto",
) -> RunningSwitch:
    """Serve an emulator (UDP backend) from daemon threads of this process.  ``engine``: ``auto``
    (native where built, python with fault injection), ``python`` or ``native`` (:mod:`.native`)."""
    secret = secret or new_secret()
    backend = UdpBackend(listen, engine=engine)
    sw = Switch(backend.send, pool_slots=pool_slots, faults=faults, allow_faults=allow_faults)
    try:
        backend.check_engine(sw)
    except BaseException:
        backend.close()
        raise
    sw.data_addr = backend.addr
    ctl = ControlServer(sw, control, secret=secret).start()
    remember_secret(ctl.addr, secret)
    t = threading.Thread(target=backend.serve, args=(sw,), name="homagg-switch-data", daemon=True)
    t.start()

    def _stop() -> None:
        backend.stop()
        t.join(5)
        backend.close()
        ctl.stop()

    return RunningSwitch(backend.addr, ctl.addr, switch=sw, secret=secret, _stoppers=[_stop])


def spawn(
    listen: Addr = ("127.0.0.1", 0),
    control: Addr = ("127.0.0.1", 0),
    *,
    pool_slots: int = SWITCH_POOL_SLOTS,
    drop: float = 0.0,
    duplicate: float = 0.0,
    reorder: float = 0.0,
    seed: int | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 30.0,
    allow_faults: bool = False,
    secret: str | None = None,
    log_level: str = "warning",
    engine: str = "auto",
) -> RunningSwitch:
    """Start ``python -m switch_emulator`` as a child; returns once it serves (bound addresses known).

    The child holds the read end of a pipe whose write end only this process holds: when this
    process exits for any reason (even SIGKILL) the child sees EOF on stdin and stops, so no
    emulator outlives its owner.  ``log_level``: the child's log (admissions, refusals) on stderr.
    """
    secret = secret or new_secret()
    cmd = [sys.executable, "-m", "switch_emulator", "--listen", f"{listen[0]}:{listen[1]}",
           "--control", f"{control[0]}:{control[1]}", "--slots", str(pool_slots), "--drop", str(drop),
           "--duplicate", str(duplicate), "--reorder", str(reorder), "--ready-json", "--quiet", "--watch-stdin", "--log-level", log_level, "--engine", engine]
    if allow_faults:
        cmd.append("--allow-faults")
    if seed is not None:
        cmd += ["--seed", str(seed)]
    cmd += extra_args or []
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[SECRET_ENV] = secret  # the environment, not argv: /proc/<pid>/cmdline is world-readable
    env.pop(SECRET_FILE_ENV, None)
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", env=env)
    stderr = _StderrRelay(proc.stderr)  # type: ignore[arg-type]
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(timeout)
    if not result or not result[0].strip():
        raise _not_started(proc, stderr, timeout, cmd, stdout_closed=bool(result))
    stderr.relay()
    info = json.loads(result[0])
    ctl = (str(info["control"][0]), int(info["control"][1]))
    remember_secret(ctl, secret)
    return RunningSwitch(tuple(info["data"]), ctl, process=proc, secret=secret)  # type: ignore[arg-type]


class _StderrRelay:
    """A child's stderr, read by a daemon thread: held back (the last lines) until :meth:`relay`,
    then copied to this process's stderr line by line, as the child's log was before it was read."""

    def __init__(self, stream: IO[str], keep: int = 20) -> None:
        self._held: deque[str] = deque(maxlen=keep)
        self._relaying = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(stream,), name="homagg-switch-stderr", daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                if not self._relaying:
                    self._held.append(line)
                    continue
            _write_stderr(line)

    def relay(self) -> None:
        """Copy the lines held so far, and every later one, to this process's stderr."""
        with self._lock:
            self._relaying = True
            held, self._held = "".join(self._held), deque()
        _write_stderr(held)

    def tail(self, timeout: float) -> str:
        """The last lines held, once the child closed its stderr (waits at most ``timeout`` s)."""
        self._thread.join(timeout)
        with self._lock:
            return " | ".join(line.strip() for line in self._held if line.strip())


def _write_stderr(text: str) -> None:
    if text:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):  # closed or gone (interpreter shutting down)
            pass


def _not_started(proc: subprocess.Popen[str], stderr: _StderrRelay, timeout: float, cmd: list[str], *,
                 stdout_closed: bool) -> TransportError:
    """The error for a child that printed no ready line: it exited (its status and stderr tail) or,
    still running after ``timeout`` s, is killed.  The child is reaped before this returns."""
    try:
        status: int | None = proc.wait(5.0 if stdout_closed else 0.0)  # stdout closed: it is exiting
    except subprocess.TimeoutExpired:
        status = None
        proc.kill()
        proc.wait()
    tail = stderr.tail(5.0)
    what = (f"exited with status {status} before it served" if status is not None
            else f"did not start within {timeout:g}s (killed)")
    return TransportError(f"switch emulator {what}" + (f"; its stderr ends: {tail}" if tail else "")
                          + f"; command: {' '.join(cmd)}")
