"""The steady small call's one-pass decode (``_small_grid.decode``) against its two definitions,
``dequantize`` and ``nonzero_rows``, on random combined words of one and two limbs (a two-limb
row whose carry sums to zero, ``low = 65536, high = -1``, is still a nonzero row)."""

from __future__ import annotations

import numpy as np
import pytest

from homagg.codec._small_grid import EMPTY, decode, dequantize, nonzero_rows


@pytest.mark.parametrize("limbs", [1, 2])
@pytest.mark.parametrize("scalar", [True, False])
def test_decode_is_dequantize_and_nonzero_rows(limbs: int, scalar: bool) -> None:
    rng = np.random.default_rng(7 + limbs)
    for trial in range(200):
        n = int(rng.integers(1, 17))
        sums = rng.integers(-(2**20), 2**20, size=n * limbs, dtype=np.int64).astype(np.int32)
        sums[rng.random(n * limbs) < 0.4] = 0
        if limbs == 2 and trial % 3 == 0:
            sums[0], sums[1] = 65536, -1  # the row's value is 0, its words are not
        exponent = EMPTY if trial % 17 == 0 else int(rng.integers(-30, 30))
        values, union = decode(sums, exponent, 40, limbs, scalar)
        want = dequantize(sums, exponent, 40, limbs, scalar)
        assert union == nonzero_rows(sums, limbs)
        if scalar:
            assert values == want
        else:
            np.testing.assert_array_equal(values, want)
    if limbs == 2:
        assert decode(np.array([65536, -1], dtype=np.int32), 0, 40, 2, scalar)[1] == 1


@pytest.mark.parametrize("limbs", [1, 2])
def test_quantize_into_is_quantize(limbs: int) -> None:
    """``quantize(..., out)`` (the steady call's write into the port's own array) writes the words
    ``quantize`` returns, from Python numbers and from numpy arrays."""
    from homagg.codec._small_grid import grid, quantize

    p, limit, _ = grid(4, limbs, False, True)
    rng = np.random.default_rng(11)
    for trial in range(100):
        values = rng.standard_normal(int(rng.integers(1, 40))) * 10.0 ** int(rng.integers(-3, 4))
        exponent = EMPTY if trial % 13 == 0 else int(rng.integers(-8, 12))
        for given in (values.tolist(), values):
            out = np.full(values.size * limbs, -7, dtype=np.int32)
            assert quantize(given, exponent, p, limit, limbs, out) is out
            np.testing.assert_array_equal(out, quantize(given, exponent, p, limit, limbs))
