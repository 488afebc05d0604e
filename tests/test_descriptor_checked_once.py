"""The general path checks a call's descriptor exactly once per call on every port (issue 39).

The port verifies the descriptor stream as soon as its words are back where it can (the UDP
port's early verify, on its host words; the gloo host path's head first), and the codec checks the
round's results only where no port did (the in-process switch): :func:`homagg.codec._descriptor.check`
runs once per call and rank whatever the port.  Ranks that disagree about a call still raise
:class:`~homagg.RankMismatchError` on every rank, with the same message.

Ports: the in-process switch, the UDP port (both loops, the emulator in a thread), the gloo host
path, the process group's :class:`~homagg.torch._fallback.PathPort` on the switch and on the host
path.  Oracles: integers' exact sums; floats' float64 sums within the codec's bound, equal on every
rank.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import homagg
import switch_emulator
from switch_emulator.embedded import RunningSwitch
from homagg.codec import History, _descriptor
from homagg.testing import on_threads
from homagg.torch._fallback import PathPort
from homagg.transport import CheckOnce, GlooSwitchPort, InProcessSwitch, SwitchPort, UdpSwitchPort
from tests.test_transport_rto import LOOPS
from tests.test_transport_small_rounds import _gloo_groups
from tests.test_transport_verify_once import _raised, path_ports_over_udp, udp_ports

#: (scheme, dtype, numel) of each rank's calls, in order, one history: first and steady calls of
#: dense and auto (the steady ones guess: one round, the descriptor in it), compact, sketch
CALLS = [("dense", torch.float32, 5000), ("dense", torch.float32, 5000), ("dense", torch.float32, 5000),
         ("auto", torch.float32, 3000), ("auto", torch.float32, 3000), ("compact", torch.int32, 4000),
         ("sketch", torch.float32, 2000)]


@pytest.fixture(scope="module")
def switch() -> Iterator[RunningSwitch]:
    with switch_emulator.start() as sw:
        yield sw


class Checks(Counter[int]):
    """Descriptor checks per thread (each rank runs on its own thread), and the types of the words checked."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: set[type] = set()


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Checks:
    """:class:`Checks`, counted at the one check."""
    counts = Checks()
    real = _descriptor.check

    def counting(words: np.ndarray | torch.Tensor) -> None:
        counts[threading.get_ident()] += 1
        counts.kinds.add(type(words))
        real(words)

    monkeypatch.setattr(_descriptor, "check", counting)
    return counts


def _inputs(rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    out = []
    for i, (_, dtype, n) in enumerate(CALLS):
        if dtype.is_floating_point:
            x = torch.randn(n, generator=gen) * (1 + i)
            if i == len(CALLS) - 1:
                x[torch.rand(n, generator=gen) < 0.9] = 0  # sparse: sketch's regime
        else:
            x = torch.randint(-1000, 1000, (n,), generator=gen, dtype=dtype)
        out.append(x)
    return out


def _check_once_per_call(ports: list[SwitchPort], checks: Checks) -> None:
    """Every call of :data:`CALLS` on every rank: exact/within-bound results, equal on every rank,
    and exactly one descriptor check per call and rank; then a mismatch raises on every rank."""
    world = len(ports)
    xs = [_inputs(r) for r in range(world)]

    def rank(r: int) -> tuple[list[torch.Tensor], list[int]]:
        me, history, outs, per_call = threading.get_ident(), History(), [], []
        for i, (scheme, _, _) in enumerate(CALLS):
            before = checks[me] + native_agreements(ports[r])
            outs.append(homagg.allreduce(xs[r][i], ports[r], scheme=scheme, history=history, key=i % 3))
            per_call.append(checks[me] + native_agreements(ports[r]) - before)
        return outs, per_call

    results = on_threads(rank, world)
    for r, (_, per_call) in enumerate(results):
        assert per_call == [1] * len(CALLS), f"rank {r}: descriptor checks per call {per_call}"
    for i, (_, dtype, _) in enumerate(CALLS):
        outs = [res[0][i] for res in results]
        assert all(torch.equal(o, outs[0]) for o in outs), CALLS[i]
        if dtype.is_floating_point:
            want = sum(x[i].double() for x in xs)
            bound = 1e-5 * float(max(x[i].abs().max() for x in xs)) * world
            assert float((outs[0].double() - want).abs().max()) <= bound, CALLS[i]
        else:
            assert torch.equal(outs[0], sum(x[i] for x in xs)), CALLS[i]

    _check_mismatch(ports, checks)


def _check_mismatch(ports: list[SwitchPort], checks: Checks) -> None:
    """Rank 0 calls with 1000 elements, the others with 3000: every rank raises RankMismatchError
    with the same message; no rank checks twice (the in-process switch judges a round whose
    shapes differ once, with rank 0's verifier, on the thread that completed the round)."""
    world = len(ports)

    def rank(r: int) -> tuple[BaseException | None, int]:
        me = threading.get_ident()
        before = checks[me]
        x = torch.randn(1000 if r == 0 else 3000, generator=torch.Generator().manual_seed(r))
        return _raised(lambda: homagg.allreduce(x, ports[r], scheme="dense")), checks[me] - before

    results = on_threads(rank, world)
    errors = [e for e, _ in results]
    assert all(isinstance(e, homagg.RankMismatchError) for e in errors), errors
    assert len({str(e) for e in errors}) == 1 and "numel (1,000 .. 3,000)" in str(errors[0])
    counts = [n for _, n in results]
    assert max(counts) == 1 and sum(counts) >= 1, counts


def native_agreements(port: SwitchPort) -> int:
    """Descriptors the native datapath found in agreement in C (:class:`~homagg.transport.AgreementCheck`:
    then no Python check runs): the UDP port's ``agreements`` (a path port's switch port's)."""
    udp = port.link.port if isinstance(port, PathPort) else port
    return udp.stats["agreements"] if isinstance(udp, UdpSwitchPort) else 0


def test_in_process_switch_checks_once(checks: Checks) -> None:
    switch = InProcessSwitch(2, timeout=30)
    _check_once_per_call([switch.port(r) for r in range(2)], checks)


def test_gloo_host_path_checks_once(checks: Checks) -> None:
    gloos = _gloo_groups(2)
    _check_once_per_call([GlooSwitchPort(g, r, 2, timeout_s=30.0) for r, g in enumerate(gloos)], checks)


#: the job of the UDP and path-port tests: room for a 4,000-element call per datagram run
_JOB = {"n_slots": 8, "words_per_packet": 256, "timeout": 30.0}


@pytest.mark.parametrize("native", LOOPS)
def test_udp_port_checks_once(switch: RunningSwitch, checks: Checks, native: bool) -> None:
    with udp_ports(switch, 2, native, **_JOB) as ports:
        _check_once_per_call(list(ports), checks)
        assert checks.kinds == {np.ndarray}  # the port's early verify: its host words, no tensor made
        agreed = [p.stats["agreements"] for p in ports]
        # the native loop judges every call's descriptor in C (the mismatch's check runs in Python);
        # the Python loop calls the check on every one
        assert agreed == ([len(CALLS)] * 2 if ports[0].native else [0, 0]), agreed


@pytest.mark.parametrize("path", ["switch", "host"])
def test_path_port_checks_once(switch: RunningSwitch, checks: Checks, path: str) -> None:
    world = 2
    with path_ports_over_udp(switch, world, path, **_JOB) as ports:
        _check_once_per_call(list(ports), checks)
        assert [p.path for p in ports] == [path] * world


def test_check_once_runs_its_check_once_in_either_form() -> None:
    """:class:`CheckOnce`: the first call checks (a tensor or a numpy array), later ones do not
    (a fallback's recovery that combines the round again); a failed check is raised, and counts."""
    seen: list[object] = []
    once = CheckOnce(seen.append)
    assert not once.called
    words = np.arange(3, dtype=np.int32)
    once(words)
    once(torch.from_numpy(words))
    assert once.called and seen == [words]

    def refuse(words: object) -> None:
        raise homagg.RankMismatchError("out of step")

    once = CheckOnce(refuse)
    with pytest.raises(homagg.RankMismatchError):
        once(torch.zeros(3, dtype=torch.int32))
    assert once.called
