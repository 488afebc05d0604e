"""Deprecated: the oracles live in :mod:`homagg.testing`; this thin module re-exports them for the
test modules that still import ``tests._oracle`` (to be switched to ``homagg.testing`` and this
file deleted).  ``assert_within_bound`` is :func:`homagg.testing.check_within_bound` (it raises
``homagg.testing.BoundExceededError``)."""

from __future__ import annotations

from homagg.testing import block_max, exact_sum
from homagg.testing import check_within_bound as assert_within_bound

__all__ = ["exact_sum", "block_max", "assert_within_bound"]
