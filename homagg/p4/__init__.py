"""The P4 target: build the BMv2 program and drive a ``simple_switch_grpc`` over P4Runtime.

* :mod:`homagg.p4.source`      — reads constants, header layouts and drop reason names out of
  ``p4/*.p4`` (no tools).
* :mod:`homagg.p4._build`      — ``homagg p4 build``: runs ``p4c-bm2-ss`` into ``p4/build/``
  (``--target tofino|tofino2``: :mod:`homagg.p4._tofino`, bf-p4c; what the compiled Tofino
  program aggregates: :mod:`homagg.p4._compiled`; both builds run their compiler through
  :mod:`homagg.p4._tool`).
* :mod:`homagg.p4.bfrt`        — the BF Runtime writes that admit a job on the Tofino program.
* :mod:`homagg.p4._switches`   — the ``bmv2`` section of a job file (:class:`SwitchConfig`).
* :mod:`homagg.p4._session`    — one P4Runtime session: pipeline push/check, idempotent writes.
* :mod:`homagg.p4._controller` — :class:`Controller`: the homagg operations (configure, jobs,
  counters) on a session.
* :mod:`homagg.p4._control`    — ``homagg control``: the command line over :class:`Controller`.

Nothing here is imported by the worker side; grpcio / p4runtime are needed only when a
:class:`Controller` connects, and are imported then.
"""

from __future__ import annotations

from ._controller import Controller
from ._session import PipelineMismatchError, SwitchUnreachableError
from ._switches import HostPort, SwitchConfig, load_switches
from .source import P4_DIR, drop_reason_names, header_fields, p4_constants, tree_event_names

__all__ = [
    "Controller",
    "SwitchConfig",
    "HostPort",
    "load_switches",
    "SwitchUnreachableError",
    "PipelineMismatchError",
    "P4_DIR",
    "p4_constants",
    "header_fields",
    "drop_reason_names",
    "tree_event_names",
]
