"""The control plane's shared secret: where a switch and its clients find it.

Every control request except ``ping`` is authenticated with it by challenge and response
(:mod:`._handshake`: HMAC over fresh nonces, then a MAC per request); the switch refuses the request
otherwise (:class:`~homagg.AuthenticationError` on the client).

Where the secret comes from, first match wins (:func:`resolve_secret`):

1. given explicitly (``ControlClient(addr, secret=...)``, ``UdpSwitchPort(..., secret=...)``,
   ``switch_emulator.start(secret=...)``, ``homagg switch --secret-file PATH``);
2. the secret of a switch this process started (:func:`switch_emulator.start` / :func:`spawn`
   call :func:`remember_secret` for its control address): tests and the embedded emulator need no
   configuration;
3. the environment: ``HOMAGG_SWITCH_SECRET`` (the secret itself) or ``HOMAGG_SWITCH_SECRET_FILE``
   (a file holding it; surrounding whitespace is stripped).

A secret is never logged, printed, put on a command line (other users can read ``/proc/*/cmdline``)
nor included in an error message, and it never travels: the control connection carries only
nonces and MACs (requests and answers themselves are not encrypted).
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
from collections.abc import Mapping
from pathlib import Path

from .._errors import ConfigError

__all__ = ["SECRET_ENV", "SECRET_FILE_ENV", "new_secret", "read_secret_file", "write_secret_file",
           "resolve_secret", "remember_secret", "forget_secret"]

SECRET_ENV = "HOMAGG_SWITCH_SECRET"
SECRET_FILE_ENV = "HOMAGG_SWITCH_SECRET_FILE"
_MIN_LEN = 16

_known: dict[tuple[str, int], str] = {}
_lock = threading.Lock()


def new_secret() -> str:
    """A fresh random secret (256 bits, hex)."""
    return secrets.token_hex(32)


def _check(secret: str, source: str) -> str:
    secret = secret.strip()
    if len(secret) < _MIN_LEN:
        raise ConfigError(f"the switch secret from {source} is shorter than {_MIN_LEN} characters")
    return secret


def read_secret_file(path: str | os.PathLike[str]) -> str:
    """The secret held in ``path`` (ConfigError if unreadable or too short; never echoes it)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the switch secret file {path}: {exc.strerror}") from None
    return _check(text, f"file {path}")


def write_secret_file(path: str | os.PathLike[str], secret: str) -> None:
    """Create ``path`` readable by its owner only, holding ``secret`` (fails if it exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


def resolve_secret(addr: tuple[str, int] | None = None, explicit: str | None = None,
                   env: Mapping[str, str] | None = None) -> str | None:
    """The secret to use for the switch whose control address is ``addr`` (None: none known)."""
    if explicit:
        return _check(explicit, "the caller")
    if addr is not None:
        with _lock:
            known = _known.get((addr[0], int(addr[1])))
        if known:
            return known
    env = os.environ if env is None else env
    if env.get(SECRET_ENV):
        return _check(env[SECRET_ENV], SECRET_ENV)
    if env.get(SECRET_FILE_ENV):
        return read_secret_file(env[SECRET_FILE_ENV])
    return None


def remember_secret(addr: tuple[str, int], secret: str) -> None:
    """Record the secret of a switch this process started (see the module docstring, rule 2)."""
    with _lock:
        _known[(addr[0], int(addr[1]))] = secret


def forget_secret(addr: tuple[str, int]) -> None:
    with _lock:
        _known.pop((addr[0], int(addr[1])), None)
