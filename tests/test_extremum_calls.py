"""MAX and MIN of small tensors through the switch's MAX (:mod:`homagg.codec._extremum`), against
the reference: ``torch.amax``/``torch.amin`` over the ranks' stacked inputs (``any``/``all`` for
bool), bit for bit, on the in-process switch and through UDP ports on the emulator; the rounds a
call takes; a NaN or a negative zero answered False with nothing written; ranks in different calls
stopped by the descriptor.  The process group's route, against gloo's own result:
``tests/test_torch_extremum.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import switch_emulator
from homagg import InputError, RankMismatchError
from homagg.codec import WorkerStats, _extremum
from homagg.testing import on_threads
from homagg.transport import ControlClient, InProcessSwitch
from homagg.transport._fastpath import AVAILABLE as DATAPATH
from tests.test_transport_small_rounds import _close, _ports

DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.float16, torch.bfloat16,
          torch.float32]


def _inputs(dtype: torch.dtype, world: int, n: int, seed: int) -> list[torch.Tensor]:
    """Per rank: random values over the dtype's range, with its extremes, infinities, subnormals
    and ties between ranks (no NaN, no negative zero: those go to gloo, see below)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for r in range(world):
        if dtype == torch.bool:
            x = torch.rand(n, generator=gen) < 0.5
        elif dtype.is_floating_point:
            info = torch.finfo(dtype)
            x = (torch.randn(n, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-5, 5, (n,), generator=gen))
            x = x.to(dtype)
            specials = [info.max, -info.max, float("inf"), -float("inf"), info.tiny, -info.tiny, info.tiny / 4, 0.0]
            for i, v in enumerate(specials[: n // 2]):
                if (i + r) % 2:
                    x[i] = v
            x[x == 0] = 0.0  # (+0.0 only)
        else:
            info = torch.iinfo(dtype)
            x = torch.randint(info.min, info.max, (n,), generator=gen, dtype=torch.int64).to(dtype)
            x[:2] = torch.tensor([info.min, info.max], dtype=dtype) if n > 2 else x[:2]
        if n > 3:
            x[-1] = 7  # the same on every rank: a tie
        out.append(x)
    return out


def _want(xs: list[torch.Tensor], reduction: str) -> torch.Tensor:
    st = torch.stack(xs)
    if st.dtype == torch.bool:
        return st.any(0) if reduction == "max" else st.all(0)
    return st.amax(0) if reduction == "max" else st.amin(0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.bool else t


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize(("world", "n"), [(1, 1), (2, 1), (3, 5), (2, 17), (3, 300), (2, _extremum.MAX_ELEMENTS)])
def test_the_result_is_the_elementwise_extremum(dtype: torch.dtype, reduction: str, world: int, n: int) -> None:
    switch = InProcessSwitch(world, timeout=30)
    xs = _inputs(dtype, world, n, seed=n * 7 + world)
    ts = [x.clone() for x in xs]
    stats = [WorkerStats() for _ in range(world)]
    answers = on_threads(lambda r: _extremum.allreduce(ts[r], switch.port(r), reduction, stats[r]), world)
    want = _want(xs, reduction)
    assert answers == [True] * world
    for t in ts:
        assert torch.equal(_bits(t), _bits(want))


@pytest.mark.parametrize("reduction", ["max", "min"])
def test_int64_takes_a_second_round_only_where_the_high_words_differ(reduction: str) -> None:
    switch = InProcessSwitch(3, timeout=30)

    def run(xs: list[torch.Tensor]) -> int:
        ts = [x.clone() for x in xs]
        stats = [WorkerStats() for _ in xs]
        on_threads(lambda r: _extremum.allreduce(ts[r], switch.port(r), reduction, stats[r]), 3)
        for t in ts:
            assert torch.equal(t, _want(xs, reduction))
        return stats[0].rounds

    same = [torch.tensor([r, 5 * r, 2**31 + r, 2**32 - 1 - r], dtype=torch.int64) for r in range(3)]  # high words 0
    assert run(same) == 1
    negative = [torch.tensor([-1 - r, -2**31 - r], dtype=torch.int64) for r in range(3)]  # high words -1
    assert run(negative) == 1
    apart = [torch.tensor([-1 + r, 2**40 * (r - 1) + r, 2**63 - 1 - r, -2**63 + r], dtype=torch.int64)
             for r in range(3)]
    assert run(apart) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("special", ["nan", "-nan", "negative zero"])
@pytest.mark.parametrize("n", [1, 40])
def test_a_nan_or_a_negative_zero_on_one_rank_leaves_the_call_to_gloo(dtype: torch.dtype, special: str,
                                                                      n: int) -> None:
    """gloo's operand order decides those: every rank answers False and keeps its input."""
    switch = InProcessSwitch(3, timeout=30)
    xs = [torch.randn(n, generator=torch.Generator().manual_seed(r)).to(dtype) for r in range(3)]
    xs[1][n // 2] = {"nan": float("nan"), "-nan": -float("nan"), "negative zero": -0.0}[special]
    ts = [x.clone() for x in xs]
    for reduction in ("max", "min"):
        assert on_threads(lambda r: _extremum.allreduce(ts[r], switch.port(r), reduction), 3) == [False] * 3
        for t, x in zip(ts, xs):
            assert torch.equal(_bits(t), _bits(x))


def test_ranks_in_different_calls_are_stopped_by_the_descriptor() -> None:
    switch = InProcessSwitch(2, timeout=30)
    ts = [torch.ones(3), torch.ones(3)]

    def rank(r: int) -> str:
        try:
            _extremum.allreduce(ts[r], switch.port(r), "max" if r == 0 else "min")
        except RankMismatchError as exc:
            return str(exc)
        return "no error"

    for message in on_threads(rank, 2):
        assert "scheme (max (a MAX/MIN all_reduce) .. min (a MAX/MIN all_reduce))" in message, message
    assert torch.equal(ts[0], torch.ones(3)) and torch.equal(ts[1], torch.ones(3))


def test_takes() -> None:
    assert _extremum.takes(torch.ones(4)) and _extremum.takes(torch.ones(4, dtype=torch.int64))
    assert not _extremum.takes(torch.ones(4, dtype=torch.float64))  # two rounds: gloo's
    assert not _extremum.takes(torch.ones(_extremum.MAX_ELEMENTS + 1))
    assert not _extremum.takes(torch.ones(0))
    assert not _extremum.takes(torch.ones(4, 4).t())  # not contiguous
    assert not _extremum.takes(torch.ones(4).to_sparse())
    with pytest.raises(ValueError, match="reduction"):
        _extremum.allreduce(torch.ones(1), InProcessSwitch(1).port(0), "sum")
    with pytest.raises(InputError, match="contiguous=False"):  # nothing sent: a 1-worker switch would answer
        _extremum.allreduce(torch.ones(4, 4).t(), InProcessSwitch(1).port(0), "max")


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


@pytest.mark.parametrize("native", [True, False] if DATAPATH else [False])
def test_udp_ports_on_the_emulator(switch, native: bool) -> None:
    """The same calls through UDP ports (with the native datapath: the ports' own arrays, the
    descriptor written once per signature), signatures alternating on one port."""
    job, ports = _ports(switch, 2, native, k=64, slots=8)
    cases = [(torch.float32, 1), (torch.int64, 3), (torch.float32, 300), (torch.int32, 1), (torch.bfloat16, 9),
             (torch.float32, 1), (torch.int64, 3)]
    try:
        for i, (dtype, n) in enumerate(cases):
            xs = _inputs(dtype, 2, n, seed=i)
            if dtype == torch.int64 and i > 2:  # high words that differ: two rounds
                xs = [torch.tensor([-5, 2**40, 3]), torch.tensor([4, -2**40, 2**33])]
            for reduction in ("max", "min"):
                ts = [x.clone() for x in xs]
                assert on_threads(lambda r: _extremum.allreduce(ts[r], ports[r], reduction), 2) == [True, True]
                for t in ts:
                    assert torch.equal(_bits(t), _bits(_want(xs, reduction))), (i, reduction)
        assert (ports[0].own_round(_extremum._OPS1, (18, 2)) is not None) == native
    finally:
        _close(ports)
        ControlClient(switch.control_addr).remove(job.job_id)


def test_the_keys_order_as_the_values() -> None:
    """The float32 key map over a sweep of bit patterns: signed order of keys == order of values."""
    bits = np.unique(np.random.default_rng(0).integers(-(2**31), 2**31, 20000).astype(np.int32))
    vals = bits.view(np.float32)
    keep = ~np.isnan(vals) & (bits != np.int32(-(2**31)))
    vals = vals[keep]
    keys = np.empty(vals.size, dtype=np.int32)
    special = _extremum._keys32(torch.from_numpy(vals.copy()), keys)
    assert not special
    assert np.array_equal(np.argsort(keys, kind="stable"), np.argsort(vals, kind="stable"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16], ids=str)
def test_cuda_tensors_go_through_a_host_copy(dtype: torch.dtype) -> None:
    switch = InProcessSwitch(2, timeout=30)
    xs = _inputs(dtype, 2, 37, seed=5)
    ts = [x.cuda() for x in xs]
    assert on_threads(lambda r: _extremum.allreduce(ts[r], switch.port(r), "max"), 2) == [True, True]
    for t in ts:
        assert t.is_cuda and torch.equal(_bits(t.cpu()), _bits(_want(xs, "max")))
