"""The homagg switch emulator: the aggregation pipeline of ``p4/`` in Python, over UDP or raw ports.

Stages (one module each, named like the P4 control blocks, run in this order by
:class:`~switch_emulator.pipeline.Pipeline`): :mod:`.admission` -> :mod:`.slots` ->
:mod:`.bitmap` -> :mod:`.combine` -> :mod:`.completion` -> :mod:`.replication`.
State: :mod:`.state`; counters: :mod:`.counters`; faults: :mod:`.faults`; I/O: :mod:`.io_udp`,
:mod:`.io_raw`; control plane: :mod:`.switch`, :mod:`.control`.

Embedding (see :mod:`.embedded`)::

    import switch_emulator
    with switch_emulator.start() as sw:          # background thread in this process
        print(sw.data_addr, sw.control_addr)
    with switch_emulator.spawn(drop=0.01) as sw:  # child process
        ...

Both generate a control secret (``sw.secret``; this process's control clients find it by
themselves, other processes need it passed or in ``HOMAGG_SWITCH_SECRET``), keep the control port
on loopback unless told otherwise, and allow fault injection over the control port only when asked
(``allow_faults=True``, or fault rates given at start).
"""

from .embedded import RunningSwitch, spawn, start
from .faults import FaultConfig
from .switch import Switch

__all__ = ["RunningSwitch", "Switch", "FaultConfig", "start", "spawn"]
