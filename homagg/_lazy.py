"""Lazy package attributes: a package lists ``name -> module`` and imports a module on first use.

Used by ``homagg`` and ``homagg.transport`` so that importing them (e.g. for the CLI's ``--help``
or by the switch emulator) does not import torch.  Invariant: a resolved name is cached in the
package's globals, so ``__getattr__`` runs at most once per name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(package: str, namespace: dict[str, Any], names: dict[str, str],
                    public: list[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose globals are ``namespace``; ``names`` maps
    each lazy name to the (relative) module defining it, ``public`` is the package's ``__all__``."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(public))

    return __getattr__, __dir__
