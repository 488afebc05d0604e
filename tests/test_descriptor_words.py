"""The call descriptor's words are built once per call signature and handed to every call of that
signature (:func:`homagg.codec._descriptor.describe`): ports only read them, so they still hold
the signature's words after calls through the in-process switch and the UDP emulator; and
:func:`~homagg.codec._descriptor.check` reads every form it is handed alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import homagg
import switch_emulator
from homagg.codec import _descriptor
from homagg.testing import on_threads
from homagg.transport import InProcessSwitch, SwitchPort
from tests.test_transport_verify_once import udp_ports


def _expected(numel: int, dtype: torch.dtype, scheme: str, world: int, round_words: int) -> list[int]:
    return [*_descriptor.words(numel, dtype, scheme, world, round_words), *([-(2**31)] * _descriptor.SPARE)]


def test_one_tensor_per_signature_holding_its_words() -> None:
    cpu = torch.device("cpu")
    a = _descriptor.describe(1000, torch.float32, "auto", 2, [], cpu)
    b = _descriptor.describe(1000, torch.float32, "auto", 2, [], cpu)
    c = _descriptor.describe(1001, torch.float32, "auto", 2, [], cpu)
    assert a.words is b.words and a.words is not c.words
    assert a.words.dtype == torch.int32 and a.words.shape == (_descriptor.LENGTH,)
    assert a.words.tolist() == _expected(1000, torch.float32, "auto", 2, 0)
    assert c.words.tolist() == _expected(1001, torch.float32, "auto", 2, 0)
    assert a.verify is _descriptor.check and a.op == homagg.CombineOp.MAX


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, list[int]]]:
    """Every descriptor stream the codec builds: its words tensor and the words it held then."""
    seen: list[tuple[torch.Tensor, list[int]]] = []
    describe = _descriptor.describe

    def recorded(*args, **kwargs):
        stream = describe(*args, **kwargs)
        seen.append((stream.words, stream.words.tolist()))
        return stream

    monkeypatch.setattr(_descriptor, "describe", recorded)
    return seen


def _assert_kept(seen: list[tuple[torch.Tensor, list[int]]], calls: int) -> None:
    assert len(seen) >= 2 * calls  # two workers, a descriptor per call each
    assert len({id(t) for t, _ in seen}) < len(seen), "the signature's tensor was not reused"
    for words, then in seen:
        assert words.tolist() == then, "a port wrote into the descriptor's words"


@pytest.mark.parametrize("scheme", ["dense", "auto"])
def test_ports_leave_the_descriptor_words_as_built_in_process(monkeypatch: pytest.MonkeyPatch, scheme: str) -> None:
    seen = _recording(monkeypatch)
    switch = InProcessSwitch(2, timeout=30)
    xs = [torch.randn(5000, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    for _ in range(4):
        outs = on_threads(lambda r: homagg.allreduce(xs[r].clone(), switch.port(r), scheme=scheme), 2)
        want = xs[0].double() + xs[1].double()
        for out in outs:
            assert torch.allclose(out.double(), want, atol=1e-5)
    _assert_kept(seen, 4)


def allreduce_ints_exactly(ports: list[SwitchPort], scheme: str, calls: int = 1) -> None:
    """``calls`` allreduces of the same int32 tensors (one a rank, on threads) through ``ports``:
    every rank gets the exact sum every time."""
    world = len(ports)
    xs = [torch.randint(-1000, 1000, (4000,), dtype=torch.int32, generator=torch.Generator().manual_seed(r))
          for r in range(world)]
    want = torch.stack(xs).sum(0, dtype=torch.int32)
    for _ in range(calls):
        outs = on_threads(lambda r: homagg.allreduce(xs[r].clone(), ports[r], scheme=scheme), world)
        for out in outs:
            assert torch.equal(out, want)


def test_ports_leave_the_descriptor_words_as_built_over_udp(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _recording(monkeypatch)
    with switch_emulator.start() as sw, udp_ports(sw, 2, None, n_slots=8, words_per_packet=256, timeout=30) as ports:
        allreduce_ints_exactly(ports, "dense", calls=3)
    _assert_kept(seen, 3)


def test_check_reads_every_form_alike() -> None:
    """A 1-D CPU tensor (read in place), a 2-D one, a numpy array; a tensor of the wrong length is
    a ProtocolError; the mismatch message is the same whatever the form."""
    a = _descriptor.describe(1000, torch.float32, "auto", 2, [], torch.device("cpu")).words
    b = _descriptor.describe(3000, torch.float32, "auto", 2, [], torch.device("cpu")).words
    for form in (a, a.view(2, -1), a.numpy(), a.clone()[None, :]):
        _descriptor.check(form)  # agreeing: silent
    combined = torch.maximum(a, b)
    messages = set()
    for form in (combined, combined.view(3, -1), combined.numpy()):
        with pytest.raises(homagg.RankMismatchError, match=r"numel \(1,000 \.\. 3,000\)") as err:
            _descriptor.check(form)
        messages.add(str(err.value))
    assert len(messages) == 1
    with pytest.raises(homagg.ProtocolError, match="17 combined words, expected 18"):
        _descriptor.check(a[:17])
    _descriptor.check(np.concatenate([a.numpy(), np.arange(5, dtype=np.int32)]))  # a small call's datagram
