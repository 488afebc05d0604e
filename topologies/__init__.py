"""Mininet topologies for homagg: a star and a two-tier (leaf/spine) network.

* :mod:`topologies.star`     — W workers around one switch.
* :mod:`topologies.two_tier` — racks of workers under leaf switches, one spine that aggregates
  (with ``tree``, the leaves aggregate too).
* :mod:`topologies.runner`   — ``homagg mininet``: brings a topology up, runs workers on the hosts,
  collects results, logs and pcaps into a folder, and always tears down (``mn -c`` grade).
* :mod:`topologies.bmv2`     — a Mininet switch node running ``simple_switch_grpc``; crash and restart.
* :mod:`topologies.bmv2_agent` — a homagg control port for BMv2 (admit/register/remove as P4Runtime
  writes), so that ``init_process_group("homagg")`` can use BMv2 as its switch.
* :mod:`topologies._mgmt`    — a management network (Linux bridge) for the store, gloo and control.

The switch is either the Python emulator (``--switch emulator``) running on a switch host, or BMv2
running ``p4/homagg.p4`` configured by ``homagg control`` (``--switch bmv2``).  Needs root and the
Debian ``mininet`` package (whose Python module lives in ``/usr/lib/python3/dist-packages``;
:func:`topologies._mn.import_mininet` makes it importable from any Python 3 interpreter).
"""

from __future__ import annotations

__all__: list[str] = []
