"""The latency floor of this machine for ``homagg bench latency``: one UDP round trip through the
switch emulator process, measured.

The cheapest real path through the emulator is one datagram of a job with a single worker: the
switch aggregates it (the slot completes at once) and answers with the result datagram.  Two forms
are measured against one emulator (the embedded default's: ``python -m switch_emulator`` with its
default engine, a child process with its own GIL, on loopback):

* ``bare``: a blocking socket sends one 1-word datagram (the header built once, the slot, bank and
  tag advanced as :class:`~homagg.transport.UdpSwitchPort` does) and waits in ``recv`` for the
  answer: the kernel's loopback path twice and the emulator's per-datagram work, no homagg host
  code;
* ``port``: :meth:`UdpSwitchPort.combine` of one 1-word ADD stream (world size 1): the same
  datagram through homagg's round loop (chunk table, native datapath, timers), but no codec.

Both are reported as p50/p90/p99 of ``calls`` round trips after ``warmup``.  Invariant: every
answer is checked (the echoed word equals the one sent); a lost datagram raises
:class:`~homagg.SwitchTimeoutError` after ``timeout`` seconds instead of hanging.
"""

from __future__ import annotations

import socket
import statistics
import time
from typing import Any

import torch

from .._errors import SwitchTimeoutError
from ..wire import FLAG_RESULT, HEADER_LEN, OP_ADD, datagram_len, pack_header_into, unpack_header

__all__ = ["percentiles", "measure_limit"]


def percentiles(values: list[float]) -> dict[str, float]:
    """``{"p50", "p90", "p99", "mean"}`` of ``values`` (seconds; nearest-rank percentiles)."""
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))]

    return {"p50": float(statistics.median(ordered)), "p90": rank(0.90), "p99": rank(0.99),
            "mean": float(statistics.fmean(ordered))}


def _bare_round_trips(port: Any, calls: int, timeout: float) -> list[float]:
    """``calls`` one-datagram round trips on ``port``'s connected socket, each timed (seconds)."""
    job = port.job
    sock: socket.socket = port.sock
    sock.setblocking(True)
    sock.settimeout(timeout)
    out = bytearray(datagram_len(1))
    back = bytearray(2048)
    times: list[float] = []
    seq = port._seq  # the next global chunk number: slots and banks continue where the port left them
    try:
        for i in range(calls):
            g = seq + i
            word = (i * 2654435761) & 0x7FFFFFFF
            pack_header_into(out, OP_ADD, 0, job.job_id, port.rank, 1, (g // job.n_slots) % 2,
                             job.slot_base + g % job.n_slots, g % 2**16, 0, job.token)
            out[HEADER_LEN:] = word.to_bytes(4, "big")
            t0 = time.perf_counter()
            sock.send(out)
            while True:
                try:
                    n = sock.recv_into(back)
                except TimeoutError:
                    raise SwitchTimeoutError(f"bench latency: no answer from the emulator at {port.switch_addr} "
                                             f"within {timeout:g}s (one-datagram round {i})") from None
                fields = unpack_header(back)
                if fields[2] & FLAG_RESULT and fields[8] == g % 2**16 and n >= HEADER_LEN + 4:
                    break  # a stale or foreign datagram is skipped
            times.append(time.perf_counter() - t0)
            if int.from_bytes(back[HEADER_LEN:HEADER_LEN + 4], "big", signed=True) != word:
                raise SwitchTimeoutError(f"bench latency: the emulator answered round {i} with another word")
    finally:
        sock.setblocking(False)
    port._seq = seq + calls
    return times


def _port_rounds(port: Any, calls: int) -> list[float]:
    """``calls`` rounds of one 1-word ADD stream through ``port.combine``, each timed (seconds)."""
    from ..transport import Stream
    from ..wire import CombineOp

    times: list[float] = []
    for i in range(calls):
        words = torch.tensor([i], dtype=torch.int32)
        t0 = time.perf_counter()
        (result,) = port.combine([Stream("ping", CombineOp.ADD, words)])
        times.append(time.perf_counter() - t0)
        if int(result[0]) != i:
            raise SwitchTimeoutError(f"bench latency: port round {i} came back as {int(result[0])}")
    return times


def measure_limit(calls: int, warmup: int, timeout: float) -> dict[str, Any]:
    """Spawn an emulator, admit a 1-worker job, time ``bare`` and ``port`` round trips (see the
    module docstring); everything started is stopped before this returns or raises."""
    import switch_emulator

    from ..transport import ControlClient, UdpSwitchPort

    with switch_emulator.spawn(timeout=timeout) as emulator:
        with ControlClient(emulator.control_addr, secret=emulator.secret) as ctl:
            job = ctl.admit(world_size=1, n_slots=16, words_per_packet=16)
        port = UdpSwitchPort(emulator.data_addr, job=job, rank=0, control=emulator.control_addr,
                             secret=emulator.secret, multicast=False, timeout=timeout)
        try:
            _bare_round_trips(port, warmup, timeout)
            bare = _bare_round_trips(port, calls, timeout)
            _port_rounds(port, warmup)
            rounds = _port_rounds(port, calls)
        finally:
            port.close()
    return {"what": "one 1-word datagram of a 1-worker job through the emulator process (spawned as the "
                    "embedded default is) on loopback and its answer; bare: a blocking socket's send + recv; "
                    "port: UdpSwitchPort.combine of one 1-word stream",
            "calls": calls, "bare_s": percentiles(bare), "port_s": percentiles(rounds),
            "bare_times_s": [round(t, 9) for t in bare]}


if __name__ == "__main__":  # pragma: no cover - a quick look: python -m homagg.bench._latency_limit
    import json

    print(json.dumps({k: v for k, v in measure_limit(2000, 200, 10.0).items() if k != "bare_times_s"}, indent=1))
