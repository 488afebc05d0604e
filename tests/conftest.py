"""Shared pytest set-up: markers that skip, with a reason, where their tool is missing."""

from __future__ import annotations

import os
import shutil

import pytest


def _skip_reason(marker: str) -> str | None:
    if marker == "gpu":
        import torch

        return None if torch.cuda.is_available() else "no CUDA device on this machine"
    if marker == "bmv2":
        missing = [t for t in ("p4c-bm2-ss", "simple_switch_grpc") if shutil.which(t) is None]
        return f"BMv2 tools not on PATH: {', '.join(missing)}" if missing else None
    if marker == "mininet":
        if os.geteuid() != 0:
            return "Mininet needs root"
        if shutil.which("mn") is None:
            return "Mininet (Debian package 'mininet') is not installed"
        try:
            import mininet  # noqa: F401
        except ImportError:
            return "the mininet Python package is not importable"
        return None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache: dict[str, str | None] = {}
    for item in items:
        for marker in ("gpu", "bmv2", "mininet"):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in cache:
                cache[marker] = _skip_reason(marker)
            if cache[marker]:
                item.add_marker(pytest.mark.skip(reason=cache[marker]))
