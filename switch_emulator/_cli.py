"""``homagg switch`` / ``python -m switch_emulator``: run the emulator, or query a running one.

Addresses: ``--listen HOST:PORT`` is the data address (UDP); the control address (TCP) is
``--control HOST:PORT``, by default loopback (127.0.0.1, ``::1`` for an IPv6 listen address) and
the data port + 1 (port 0, "the OS picks", stays 0 for both): the control port is reachable from
other machines only when told so.  Only :mod:`homagg.jobs`, :mod:`homagg.wire` and the control
client are imported from homagg: the emulator starts without torch.

Security: the control port requires a shared secret (:mod:`homagg.transport._auth`):
``--secret-file PATH`` (read; created with a fresh secret, mode 0600, if missing), else
``HOMAGG_SWITCH_SECRET`` / ``HOMAGG_SWITCH_SECRET_FILE``, else a fresh secret written to a
private file in the temporary directory (removed at exit; its path, never the secret, is in the
banner and the ``--ready-json`` line).  Fault injection over the control port needs
``--allow-faults`` (or rates given here).  Admissions, removals and refusals are logged on stderr
(``--log-level``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from homagg._errors import ConfigError
from homagg.jobs import SWITCH_POOL_SLOTS, format_addr, parse_addr
from homagg.transport import ControlClient
from homagg.transport._auth import SECRET_ENV, SECRET_FILE_ENV, new_secret, read_secret_file, write_secret_file
from homagg.wire import HOMAGG_UDP_PORT, MAX_SLOTS

from .admission import check_pool_slots

if TYPE_CHECKING:
    from .faults import FaultConfig

__all__ = ["configure_parser", "run", "addresses"]


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default=f"127.0.0.1:{HOMAGG_UDP_PORT}", help="data address HOST:PORT (UDP backend)")
    p.add_argument("--control", default=None,
                   help="control address HOST:PORT (TCP; default: loopback, data port + 1)")
    p.add_argument("--secret-file", default=None,
                   help="file holding the control secret (created, mode 0600, if missing; default: "
                        f"${SECRET_ENV}, ${SECRET_FILE_ENV}, else a temporary file)")
    p.add_argument("--allow-faults", action="store_true",
                   help="let control clients change fault injection (implied by --drop/--duplicate/--reorder)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="stderr log of admissions, removals and refused requests (default info)")
    p.add_argument("--backend", choices=("udp", "raw"), default="udp", help="udp socket, or raw AF_PACKET ports")
    p.add_argument("--engine", choices=("auto", "python", "native"), default="auto",
                   help="udp backend: the pipeline in C with batched syscalls (native), or the Python "
                        "reference (python); auto: native where it was built, python with fault injection")
    p.add_argument("--iface", action="append", default=[], help="raw backend: interface to serve (repeatable)")
    p.add_argument("--slots", type=int, default=SWITCH_POOL_SLOTS,
                   help=f"slot pool size, 1..{MAX_SLOTS} (default {SWITCH_POOL_SLOTS})")
    mc = p.add_mutually_exclusive_group()
    mc.add_argument("--no-multicast", action="store_true",
                    help="udp backend: never send results to a job's multicast group (default: on loopback)")
    mc.add_argument("--multicast", action="store_true",
                    help="udp backend: send results to a job's multicast group (TTL 1, out of the interface "
                         "of the --listen address) on any IPv4 address, not only loopback; workers that do "
                         "not receive the group's probe still get unicast results")
    p.add_argument("--jobs", help="JSON/TOML file of jobs to admit at start")
    p.add_argument("--drop", type=float, default=0.0, help="fault injection: drop rate (ingress and egress)")
    p.add_argument("--duplicate", type=float, default=0.0, help="fault injection: duplicate rate")
    p.add_argument("--reorder", type=float, default=0.0, help="fault injection: reorder rate")
    p.add_argument("--seed", type=int, default=None, help="fault injection RNG seed")
    p.add_argument("--status", action="store_true", help="print the status of the switch at --control and exit")
    p.add_argument("--ready-json", action="store_true", help="print one JSON line with the bound addresses when ready")
    p.add_argument("--quiet", action="store_true", help="no banner")
    p.add_argument("--watch-stdin", action="store_true",
                   help="stop when stdin reaches EOF (the parent process that holds the pipe is gone)")


def addresses(listen: str, control: str | None) -> tuple[tuple[str, int], tuple[str, int]]:
    """``(data, control)`` addresses of ``--listen`` / ``--control``; see the module docstring."""
    data = parse_addr(listen, source="--listen")
    if control is not None:
        return data, parse_addr(control, source="--control")
    loop = "::1" if ":" in data[0] else "127.0.0.1"
    if data[1] == 0:
        return data, (loop, 0)
    return data, parse_addr((loop, data[1] + 1), source="--listen port + 1 (give --control)")


def _server_secret(args: argparse.Namespace) -> tuple[str, Path | None, bool]:
    """``(secret, file it is in or None, whether this process created that file)``."""
    if args.secret_file:
        path = Path(args.secret_file)
        if not path.exists():
            try:
                write_secret_file(path, new_secret())  # asked for: kept after exit
            except FileExistsError:
                pass  # another process created it meanwhile: read it
            except OSError as exc:
                raise ConfigError(f"--secret-file {path}: cannot create it ({exc.strerror}); give an existing "
                                  "secret file or a new one in an existing folder this user may write") from None
        return read_secret_file(path), path, False
    if os.environ.get(SECRET_ENV) or os.environ.get(SECRET_FILE_ENV):
        from homagg.transport._auth import resolve_secret

        f = os.environ.get(SECRET_FILE_ENV)
        return resolve_secret(None) or "", Path(f) if f and not os.environ.get(SECRET_ENV) else None, False
    fd, name = tempfile.mkstemp(prefix="homagg-switch-", suffix=".secret")  # mode 0600
    secret = new_secret()
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    return secret, Path(name), True


def run(args: argparse.Namespace) -> int:
    check_pool_slots(args.slots, source="--slots")
    faults = _faults(args)
    data, control = addresses(args.listen, args.control)
    if args.status:
        secret = read_secret_file(args.secret_file) if args.secret_file else None
        with ControlClient(control, secret=secret) as ctl:
            print(json.dumps(ctl.status(), indent=2))
        return 0
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s homagg switch %(levelname)s: %(message)s")
    secret, secret_path, own_file = _server_secret(args)
    try:
        return _serve(args, data, control, secret, secret_path, faults)
    finally:
        if own_file and secret_path is not None:
            secret_path.unlink(missing_ok=True)


def _faults(args: argparse.Namespace) -> FaultConfig:
    """The fault injection the options ask for; a rate out of range is named as its option."""
    from .faults import FaultConfig

    for option in ("drop", "duplicate", "reorder"):
        rate = getattr(args, option)
        try:
            FaultConfig(**{option: rate})
        except ConfigError as exc:
            raise ConfigError(f"--{option} {rate:g}: {exc}") from None
    return FaultConfig(args.drop, args.duplicate, args.reorder, args.seed)


def _serve(args: argparse.Namespace, data: tuple[str, int], control: tuple[str, int], secret: str,
           secret_path: Path | None, faults: FaultConfig) -> int:
    """Bind the data backend (``--listen``, or ``--iface`` for raw) and serve on it."""
    if args.backend == "udp":
        from .io_udp import UdpBackend

        try:
            backend: object = UdpBackend(data, multicast=not args.no_multicast,
                                         multicast_any_address=args.multicast, engine=args.engine)
        except OSError as exc:
            raise _unbound("--listen", args.listen, "data (UDP)", exc) from None
    else:
        from .io_raw import RawBackend

        try:
            backend = RawBackend(args.iface, udp_port=data[1])
        except OSError as exc:
            raise ConfigError(f"--iface {','.join(args.iface)}: cannot open a raw socket on it ({exc.strerror}); "
                              "give interfaces of this host (ip link), as root or with CAP_NET_RAW") from None
    try:
        return _serve_on(args, backend, control, secret, secret_path, faults)
    finally:
        backend.close()  # type: ignore[attr-defined]


def _unbound(option: str, value: str, what: str, exc: OSError) -> ConfigError:
    """The error for an address ``option`` = ``value`` whose socket could not be bound."""
    return ConfigError(f"{option} {value}: cannot bind the {what} socket ({exc.strerror}); HOST must be an IPv4 "
                       "address of this host (or 0.0.0.0), or a name that resolves to one, and PORT a free port "
                       "0..65535 (0: the OS picks one)")


def _serve_on(args: argparse.Namespace, backend: object, control: tuple[str, int], secret: str,
              secret_path: Path | None, faults: FaultConfig) -> int:
    """Serve on the bound ``backend`` until stopped (the control port bound here)."""
    from homagg.jobs import load_jobs

    from .control import ControlServer
    from .switch import Switch

    sw = Switch(backend.send, pool_slots=args.slots, faults=faults,  # type: ignore[attr-defined]
                allow_faults=args.allow_faults or faults.active)
    sw.data_addr = backend.addr  # type: ignore[attr-defined]
    if args.backend == "udp":
        backend.check_engine(sw)  # type: ignore[attr-defined]
    for spec in load_jobs(args.jobs) if args.jobs else []:
        sw.admit(spec, f"job file {args.jobs}")
    try:
        ctl = ControlServer(sw, control, secret=secret).start()
    except OSError as exc:
        given = ("--control", args.control) if args.control else ("--listen port + 1 (give --control)",
                                                                 format_addr(control))
        raise _unbound(*given, "control (TCP)", exc) from None
    stop = threading.Event()

    def _term(signum: int, frame: object) -> None:
        backend.stop()  # type: ignore[attr-defined]
        stop.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    if args.watch_stdin:  # the embedded default: no orphan emulator after its owner crashed
        threading.Thread(target=_stop_at_eof, args=(backend,), name="homagg-switch-parent", daemon=True).start()
    info = {"data": list(backend.addr), "control": list(ctl.addr), "backend": args.backend,  # type: ignore[attr-defined]
            "secret_file": None if secret_path is None else str(secret_path),
            "multicast": bool(getattr(backend, "multicast", False))}  # results to job groups (udp)
    if args.ready_json:
        print(json.dumps(info), flush=True)
    if not args.quiet:
        where = f"secret in {secret_path}" if secret_path else f"secret from ${SECRET_ENV}"
        print(f"homagg switch emulator: data {info['data']} control {info['control']} ({args.backend}; {where}; "
              f"fault injection {'allowed' if sw.allow_faults else 'off'})", file=sys.stderr, flush=True)
    profile_to = os.environ.get("HOMAGG_EMULATOR_PROFILE")  # cProfile the data loop into this file
    try:
        if profile_to:
            import cProfile

            cProfile.runctx("backend.serve(sw)", globals(), {"backend": backend, "sw": sw}, profile_to)
        else:
            backend.serve(sw)  # type: ignore[attr-defined]
    finally:
        ctl.stop()
    return 0


def _stop_at_eof(backend: object) -> None:
    """Block until stdin reaches EOF (its writer, the owning process, closed it or died); stop."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass
    backend.stop()  # type: ignore[attr-defined]
