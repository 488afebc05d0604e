"""Shared pytest set-up: markers that skip, with a reason, where their tool is missing.

``HOMAGG_REQUIRE=bmv2,mininet,tofino`` (CI sets it where it installed the tools) turns such a skip into
a failure for the markers named, so a tool that silently went missing cannot pass as a skip.
"""

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
    if marker == "tofino":
        return None if shutil.which("bf-p4c") else "bf-p4c not on PATH (Tofino compiler; docs/p4-tofino.md)"
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


def _required() -> set[str]:
    return {m.strip() for m in os.environ.get("HOMAGG_REQUIRE", "").split(",") if m.strip()}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache: dict[str, str | None] = {}
    required = _required()
    for item in items:
        for marker in ("gpu", "bmv2", "mininet", "tofino"):
            if item.get_closest_marker(marker) is None:
                continue
            if marker not in cache:
                cache[marker] = _skip_reason(marker)
            if cache[marker] and marker in required:
                item.add_marker(pytest.mark.usefixtures("_homagg_required_tool_missing"))
                item.user_properties.append(("homagg_missing", f"{marker}: {cache[marker]}"))
            elif cache[marker]:
                item.add_marker(pytest.mark.skip(reason=cache[marker]))


@pytest.fixture
def _homagg_required_tool_missing(request: pytest.FixtureRequest) -> None:
    """Fails a test whose tool is missing although ``HOMAGG_REQUIRE`` names its marker."""
    why = dict(request.node.user_properties)["homagg_missing"]
    pytest.fail(f"HOMAGG_REQUIRE names this test's marker, but its tool is missing ({why})")


_TOOL_MARKERS = ("bmv2", "mininet", "gpu", "tofino")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember each test's outcome per tool marker, and the figures tests reported with
    ``record_property("homagg_report", line)`` (both for the summary below)."""
    if report.when == "call":
        _figures.extend(f"{report.nodeid}: {v}" for k, v in report.user_properties if k == "homagg_report")
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        for m in _TOOL_MARKERS:
            if m in report.keywords:
                _by_marker.setdefault(m, {}).setdefault(report.outcome, 0)
                _by_marker[m][report.outcome] += 1


_by_marker: dict[str, dict[str, int]] = {}
_figures: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per tool marker: how many of its tests passed, failed, were skipped; then the
    figures tests reported (e.g. the retransmissions of a lossless BMv2 run)."""
    if _figures:
        terminalreporter.section("figures reported by tests")
        for line in _figures:
            terminalreporter.write_line(line)
    if not _by_marker:
        return
    terminalreporter.section("tests that need tools")
    for m in _TOOL_MARKERS:
        counts = _by_marker.get(m, {})
        if counts:
            terminalreporter.write_line(f"{m}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
