"""The P4 target: build the BMv2 program and drive a ``simple_switch_grpc`` over P4Runtime.

* :mod:`homagg.p4.source`  — reads constants and header layouts out of ``p4/*.p4`` (no tools).
* :mod:`homagg.p4._build`  — ``homagg p4 build``: runs ``p4c-bm2-ss`` into ``p4/build/``.
* :mod:`homagg.p4._control` — ``homagg control``: the P4Runtime controller.

Nothing here is imported by the worker side; grpc / p4runtime-shell are needed only by the
controller and are imported lazily.
"""

from __future__ import annotations

from .source import P4_DIR, header_fields, p4_constants

__all__ = ["P4_DIR", "p4_constants", "header_fields"]
