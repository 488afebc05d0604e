"""Entry point called by ``import torch`` (group ``torch.backends``): registers the backend."""

from __future__ import annotations


def autoload() -> None:
    """Register the ``homagg`` process-group backend without importing the rest eagerly."""
    try:
        from .torch import _backend
    except ImportError:  # backend not available in this build
        return
    _backend.register()
