"""The combine semantics, implemented once per target, agree: numpy emulator stage == torch reference.

Oracle: exact integer arithmetic in Python (sum modulo 2**32, bitwise or, signed max) on the same
random words; both implementations must equal it (and hence each other) bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from homagg.transport import combine_words
from homagg.wire import WORD_DTYPE, CombineOp
from switch_emulator.combine import combine as numpy_combine

INT32 = st.integers(-(2**31), 2**31 - 1)
EDGE = st.sampled_from([-(2**31), -1, 0, 1, 2**31 - 1])


def _exact(op: CombineOp, rows: list[list[int]]) -> list[int]:
    out = []
    for col in zip(*rows):
        if op == CombineOp.ADD:
            v = sum(col) % 2**32
            out.append(v - 2**32 if v >= 2**31 else v)
        elif op == CombineOp.OR:
            acc = 0
            for x in col:
                acc |= x & 0xFFFFFFFF
            out.append(acc - 2**32 if acc >= 2**31 else acc)
        else:
            out.append(max(col))
    return out


def _numpy_switch(op: CombineOp, rows: list[list[int]], k: int) -> list[int]:
    """Feed the rows as big-endian datagram payloads into one slot row, as the pipeline does."""
    reg = np.full(k, 12345, dtype=np.int32)  # stale register contents: the first write must replace them
    n = len(rows[0])
    for i, r in enumerate(rows):
        payload = np.frombuffer(np.asarray(r, dtype=WORD_DTYPE).tobytes(), dtype=WORD_DTYPE)
        numpy_combine(reg[:n], payload, int(op), i == 0)
    return reg[:n].tolist()


@settings(max_examples=150, deadline=None)
@given(
    op=st.sampled_from(list(CombineOp)),
    width=st.integers(1, 40),
    workers=st.integers(1, 9),
    data=st.data(),
)
def test_numpy_and_torch_combine_equal_exact(op: CombineOp, width: int, workers: int, data: st.DataObject) -> None:
    rows = [data.draw(st.lists(st.one_of(INT32, EDGE), min_size=width, max_size=width)) for _ in range(workers)]
    expected = _exact(op, rows)
    got_torch = combine_words(op, [torch.tensor(r, dtype=torch.int32) for r in rows])
    assert got_torch.dtype == torch.int32 and got_torch.tolist() == expected
    assert _numpy_switch(op, rows, k=width + 3) == expected


def test_add_wraps_both_ways() -> None:
    big, small = [2**31 - 1, -(2**31)], [1, -1]
    assert combine_words(CombineOp.ADD, [torch.tensor(big, dtype=torch.int32),
                                         torch.tensor(small, dtype=torch.int32)]).tolist() == [-(2**31), 2**31 - 1]
    assert _numpy_switch(CombineOp.ADD, [big, small], k=2) == [-(2**31), 2**31 - 1]
