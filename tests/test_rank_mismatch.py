"""Ranks that disagree about a call fail on every rank within the call's first round trip, with a
typed error naming the mismatch (not a timeout blaming a worker "not heard from")."""

from __future__ import annotations

import time

import pytest
import torch

import homagg
import switch_emulator
from homagg.codec import _descriptor
from homagg.testing import on_threads
from homagg.transport import InProcessSwitch
from tests.test_descriptor_words import allreduce_ints_exactly
from tests.test_transport_verify_once import udp_ports

TIMEOUT = 60.0  # the ports' own timeout; a mismatch must be reported long before it


def _words(**change: int) -> torch.Tensor:
    """The combined descriptor of two ranks, the second one's fields changed as given."""
    base = dict(numel=1000, dtype=torch.float32, scheme="auto", world_size=2)
    a = _descriptor.describe(base["numel"], base["dtype"], base["scheme"], 2, [], torch.device("cpu"))
    other = {**base, **change}
    b = _descriptor.describe(other["numel"], other["dtype"], other["scheme"], other["world_size"], [],
                             torch.device("cpu"))
    return torch.maximum(a.words, b.words)


def test_descriptor_agrees_and_names_each_mismatch() -> None:
    _descriptor.check(_words())  # equal: silent
    with pytest.raises(homagg.RankMismatchError, match=r"numel \(1,000 \.\. 3,000\)") as err:
        _descriptor.check(_words(numel=3000))
    assert "dtype (" not in str(err.value)
    with pytest.raises(homagg.RankMismatchError, match=r"dtype \(torch.float32 \.\. torch.float64\)"):
        _descriptor.check(_words(dtype=torch.float64))
    with pytest.raises(homagg.RankMismatchError, match=r"scheme \(auto \.\. dense\)"):
        _descriptor.check(_words(scheme="dense"))
    with pytest.raises(homagg.RankMismatchError, match=r"numel \(differs; some rank.s is >= 2\*\*31\)"):
        _descriptor.check(_words(numel=2**32))  # differs in the high half too
    assert issubclass(homagg.RankMismatchError, homagg.ProtocolError)


def _mismatched(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rank)
    return torch.randn(1000 if rank == 0 else 3000, generator=gen)


@pytest.mark.parametrize("scheme", homagg.SCHEMES)
def test_sizes_differ_in_process_every_rank_gets_the_typed_error(scheme: str) -> None:
    switch = InProcessSwitch(2, timeout=TIMEOUT)

    def call(rank: int) -> BaseException | None:
        try:
            homagg.allreduce(_mismatched(rank), switch.port(rank), scheme=scheme)
        except homagg.HomAggError as exc:
            return exc
        return None

    t0 = time.monotonic()
    errors = on_threads(call, 2, timeout=2 * TIMEOUT)
    assert time.monotonic() - t0 < TIMEOUT / 2
    for exc in errors:
        assert isinstance(exc, homagg.RankMismatchError), exc
        assert "numel (1,000 .. 3,000)" in str(exc)


@pytest.fixture(scope="module")
def switch():
    with switch_emulator.start() as sw:
        yield sw


@pytest.mark.parametrize("case", ["numel", "dtype"])
def test_mismatch_over_udp_fails_fast_on_every_rank_and_the_job_is_usable_by_a_new_port(switch, case: str) -> None:
    def tensor(rank: int) -> torch.Tensor:
        if case == "numel":
            return _mismatched(rank)
        return torch.randn(5000, generator=torch.Generator().manual_seed(rank), dtype=torch.float32 if rank else torch.float64)

    with udp_ports(switch, 2, None, n_slots=8, words_per_packet=256, timeout=TIMEOUT) as ports:

        def call(rank: int) -> BaseException | None:
            try:
                homagg.allreduce(tensor(rank), ports[rank], scheme="compact")
            except homagg.HomAggError as exc:
                return exc
            return None

        t0 = time.monotonic()
        errors = on_threads(call, 2, timeout=2 * TIMEOUT)
        elapsed = time.monotonic() - t0
        for exc in errors:
            assert isinstance(exc, homagg.RankMismatchError), exc
            needle = "numel (1,000 .. 3,000)" if case == "numel" else "dtype (torch.float32 .. torch.float64)"
            assert needle in str(exc)
        assert elapsed < TIMEOUT / 2, f"took {elapsed:.1f} s: waited for a timeout instead of the descriptor"
    # agreeing ranks on a fresh job still get the exact sum (the switch is not left broken)
    with udp_ports(switch, 2, None, n_slots=8, words_per_packet=256, timeout=TIMEOUT) as ports:
        allreduce_ints_exactly(ports, "compact")


@pytest.mark.parametrize(("case", "needle"), [("numel", "numel (1,000 .. 3,000)"),
                                              ("dtype", "dtype (torch.float32 .. torch.float64)")])
@pytest.mark.parametrize("switch_kind", ["embedded", "gloo"])
def test_process_group_ranks_that_disagree_get_the_typed_error(case: str, needle: str, switch_kind: str) -> None:
    """``dist.all_reduce`` through ``backend="homagg"``: 3 ranks, one disagreeing, every rank
    gets RankMismatchError at once (timeout 60 s), and the broken group says so on the next call."""
    from tests._dist_scripts._launch import launch

    env = {"HOMAGG_TIMEOUT": str(TIMEOUT)}
    if switch_kind == "gloo":
        env["HOMAGG_SWITCH"] = "gloo"
    results, outputs = launch("mismatch.py", 3, args=[case], env=env, timeout=3 * TIMEOUT)
    for rank, res in enumerate(results):
        assert res["is_mismatch"], (rank, res, outputs[rank][-2000:])
        assert needle in res["message"]
        assert res["seconds"] < TIMEOUT / 2, res
        assert res["after"] == "RankMismatchError" and res["after_seconds"] < 5, res
