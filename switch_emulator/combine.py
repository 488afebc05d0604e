"""Stage 4, combine into the slot registers (P4: ``Combine``, one register action per op).

``first`` writes the payload; later contributions combine element-wise in int32: ``OP_ADD`` wraps
modulo 2**32 (numpy int32 arithmetic wraps silently), ``OP_OR`` is bitwise or, ``OP_MAX`` signed max.
``payload`` is the big-endian view of the datagram; numpy converts while it combines (vectorized).
"""

from __future__ import annotations

import numpy as np

from homagg.wire import OP_ADD, OP_MAX, OP_OR

__all__ = ["combine"]


def combine(row: np.ndarray, payload: np.ndarray, op: int, first: bool) -> None:
    """Combine ``payload`` into ``row`` (both length ``word_count``) in place."""
    if first:
        row[:] = payload
    elif op == OP_ADD:
        np.add(row, payload, out=row)
    elif op == OP_OR:
        np.bitwise_or(row, payload, out=row)
    elif op == OP_MAX:
        np.maximum(row, payload, out=row)
    else:  # pragma: no cover - rejected by the parser
        raise ValueError(f"unknown op {op}")
