"""Checks of command-line values, shared by every ``homagg`` command.

Each check returns the value it was given when the value is acceptable and otherwise raises one
:class:`~homagg.ConfigError` whose message starts with the option and the value as the user gave
it, then says what the option accepts (``--repeats 0: need at least 1``, ``--density 2 outside
(0, 1]``, ``--timeout nan: need > 0 seconds``).  The command line prints it as ``homagg: error:
ConfigError: ...`` with exit status 2.  Commands run these checks before they start anything
(a switch, rank processes, a network), so a bad value costs nothing.

Invariant: NaN is never accepted (every comparison with it is false, and each check accepts only
what its comparisons admit), and neither is infinity where a finite number is needed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence

from ._errors import ConfigError

__all__ = ["count", "seconds", "positive", "within", "names", "memory", "shown"]


def shown(value: object) -> str:
    """``value`` as a message shows it (floats in ``:g`` form: ``2``, ``0.5``, ``nan``, ``1e+30``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def count(option: str, value: int, low: int = 1, high: int | None = None, *, why: str = "") -> int:
    """``value`` if ``low <= value`` (and ``value <= high`` when given); ``why`` is added in parentheses."""
    if low <= value and (high is None or value <= high):
        return value
    need = f"need at least {low}" if high is None else f"outside {low}..{high}"
    sep = ": " if high is None else " "
    raise ConfigError(f"{option} {value}{sep}{need}" + (f" ({why})" if why else ""))


def seconds(option: str, value: float) -> float:
    """``value`` if it is a finite number of seconds above 0 (a wait, a timeout, a period)."""
    if math.isfinite(value) and value > 0:
        return value
    raise ConfigError(f"{option} {shown(value)}: need > 0 seconds (a finite number)")


def positive(option: str, value: float, unit: str = "") -> float:
    """``value`` if it is finite and above 0 (a rate, a bandwidth, a learning rate)."""
    if math.isfinite(value) and value > 0:
        return value
    raise ConfigError(f"{option} {shown(value)}: need a finite number > 0" + (f" {unit}" if unit else ""))


def within(option: str, value: float, interval: str) -> float:
    """``value`` if it lies in ``interval``, written as the message shows it: ``"(0, 1]"``,
    ``"[0, 1)"``, ``"[0, 1]"`` (bounds: numbers, ``inf``)."""
    low_text, _, high_text = interval[1:-1].partition(",")
    low, high = float(low_text), float(high_text)
    above = value > low if interval[0] == "(" else value >= low
    below = value < high if interval[-1] == ")" else value <= high
    if above and below:
        return value
    raise ConfigError(f"{option} {shown(value)} outside {interval}")


def names(option: str, given: Sequence[str], known: Iterable[str], text: str | None = None) -> list[str]:
    """``given`` (a parsed comma list) if it holds at least one name and only names of ``known``;
    ``text`` is the option's value as typed (default: ``given`` joined by commas)."""
    choices = list(known)
    if given and not set(given) - set(choices):
        return list(given)
    typed = ",".join(given) if text is None else text
    raise ConfigError(f"{option} {typed!r}: choose one or more of {', '.join(choices)}")


def memory(option: str, value: int, need: int, who: str) -> int:
    """``value`` if ``need`` bytes (what ``who`` holds at once for it) fit in this host's memory;
    also when the memory is not known here."""
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return value
    if need <= have:
        return value
    raise ConfigError(f"{option} {value}: {who} need {need / 2**30:,.1f} GiB, more than this host's "
                      f"{have / 2**30:,.1f} GiB of memory")
