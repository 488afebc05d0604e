"""Transport failures -> the :class:`~homagg.HomAggError` tree: the one mapping every port uses.

Mapped by exception *type* and by how long the failed call waited, never by the text of the
message:

* a :class:`~homagg.HomAggError` passes through unchanged;
* :class:`TimeoutError` (``socket.timeout`` included) and torch's ``DistStoreError`` (what
  ``Store.wait``/``get`` raise when a key does not appear in time) -> :class:`~homagg.SwitchTimeoutError`;
* any other failure (``OSError``, torch's ``DistNetworkError``/``DistBackendError``, the plain
  ``RuntimeError`` gloo raises for a collective) -> :class:`~homagg.SwitchTimeoutError` when the
  call had waited for at least its ``timeout_s`` (gloo reports its own timeout this way), else
  :class:`~homagg.TransportError`.

The message names what was being waited for (``what``) and keeps the original text; the original
exception is chained by the caller (``raise transport_error(exc, ...) from exc``).
"""

from __future__ import annotations

import sys

from .._errors import HomAggError, SwitchTimeoutError, TransportError

__all__ = ["transport_error"]


def _timeout_types() -> tuple[type[BaseException], ...]:
    """TimeoutError, and torch's DistStoreError when torch.distributed is loaded (an exception of
    that type implies it is; this module never imports torch itself)."""
    dist = sys.modules.get("torch.distributed")
    store_error = getattr(dist, "DistStoreError", None) if dist is not None else None
    return (TimeoutError,) if store_error is None else (TimeoutError, store_error)


def transport_error(exc: BaseException, what: str, *, timeout_s: float | None = None,
                    waited_s: float | None = None) -> HomAggError:
    """The homagg error for ``exc``, raised by a transport while doing ``what``.

    ``timeout_s``/``waited_s``: the bound of the failed wait and how long it actually waited; a
    failure at (or past) the bound is a timeout whatever its type.
    """
    if isinstance(exc, HomAggError):
        return exc
    timed_out = isinstance(exc, _timeout_types()) or (
        timeout_s is not None and waited_s is not None and waited_s >= timeout_s
    )
    detail = f"{type(exc).__name__}: {exc}"
    if timed_out:
        bound = f" within {timeout_s:g}s" if timeout_s is not None else ""
        return SwitchTimeoutError(f"{what}: no answer{bound} ({detail})")
    return TransportError(f"{what}: {detail}")
