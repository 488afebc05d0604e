"""The error a :class:`~homagg.transport.UdpSwitchPort` raises when a round makes no progress.

It names the job, the oldest pending slot, bank, stream and offset, and, asked over the control
port when there is one, whether the switch holds the complete result (then results to this worker
are being lost) or which workers it has not heard from for that slot.  The error carries those
as attributes ``job_id``, ``slot``, ``bank``, ``offset``, ``stream``, ``missing`` (list or None).

:func:`patient_wait` is a port's longer wait (a barrier's): its progress timeout raised for the
round, its timers restored afterwards.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

from .._errors import RankTimeoutError, SwitchTimeoutError

__all__ = ["stall_error", "patient_wait"]


def stall_error(ctl: Any, job_id: int, rank: int, stalled_s: float, slot: int, bank: int, stream: str, offset: int,
                pending: int, refused: int, gone: str | None = None,
                ranks: tuple[int, ...] = ()) -> SwitchTimeoutError | RankTimeoutError:
    """The :class:`~homagg.SwitchTimeoutError` of worker ``rank`` waiting ``stalled_s`` s on
    ``slot`` and ``bank`` (``pending`` chunks outstanding; ``refused``: ICMP port-unreachable
    answers seen); ``ctl`` is the port's control client or None; ``gone``: why the switch is known
    to be gone or to fail this job (:mod:`._liveness`; then it is not asked, and the error says so
    first); ``ranks``: the peer ranks known gone (:mod:`._peers`; ``gone`` says why): then the
    error is a :class:`~homagg.RankTimeoutError` naming them."""
    missing: list[int] | None = None
    detail = "switch not asked (no control address)"
    if gone is not None:
        kind = (lambda text: RankTimeoutError(text, ranks)) if ranks else SwitchTimeoutError
        err = kind(
            f"job {job_id} worker {rank}: {gone}; no progress for {stalled_s:.2f}s, waiting on slot {slot} bank "
            f"{bank} (stream {stream!r} offset {offset}, {pending} chunks pending)")
        err.job_id, err.slot, err.bank, err.offset, err.stream, err.missing = (  # type: ignore[attr-defined]
            job_id, slot, bank, offset, stream, None)
        return err
    if ctl is not None:
        try:
            b = ctl.slot_status(job_id, slot)["banks"][bank]
            missing = list(b["missing"])
            if b["complete"]:
                detail = "the switch has the complete result; results to this worker are being lost"
            else:
                detail = f"the switch has not heard from workers {missing} for this slot"
        except Exception as exc:  # noqa: BLE001 - diagnostics only
            detail = f"could not ask the switch: {exc}"
    if refused:
        detail += (f"; the switch's data port refused {refused} datagrams (ICMP port unreachable): "
                   "is the switch process gone?")
    err = SwitchTimeoutError(
        f"job {job_id} worker {rank}: no progress for {stalled_s:.1f}s; waiting on slot {slot} bank {bank} "
        f"(stream {stream!r} offset {offset}, {pending} chunks pending); {detail}")
    err.job_id, err.slot, err.bank, err.offset, err.stream, err.missing = (  # type: ignore[attr-defined]
        job_id, slot, bank, offset, stream, missing)
    return err


@contextlib.contextmanager
def patient_wait(port: Any, timeout_s: float) -> Iterator[None]:
    """A UDP port's :meth:`~homagg.transport.SwitchPort.patient`: its progress timeout raised to
    ``timeout_s`` (reached while the switch says which workers it has not heard from:
    :class:`~homagg.RankTimeoutError` naming them, see :mod:`._roundloop`); its RTO estimator and
    congestion window as they were before, afterwards (their counters keep what happened)."""
    saved_timeout, rtt, window = port.timeout, copy.copy(port.rtt), copy.copy(port.window)
    port.timeout, port.patient_wait = max(saved_timeout, timeout_s), True
    try:
        yield
    finally:
        port.timeout, port.patient_wait = saved_timeout, False
        _restore(port.rtt, rtt, ("samples", "backoffs"))
        _restore(port.window, window, ("reductions", "undos"))
        port._sync_rtt_stats()


def _restore(obj: Any, saved: Any, counters: tuple[str, ...]) -> None:
    """``obj``'s state as ``saved`` holds it, but for its ``counters``."""
    obj.__dict__.update({k: v for k, v in vars(saved).items() if k not in counters})
