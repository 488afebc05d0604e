"""A dense input's flat view (:class:`homagg.codec._worker.Worker`): a plain 1-D tensor outside autograd
is used as it is (no detach/reshape objects per call); every other input (autograd, a Parameter,
several dimensions) keeps ``detach().reshape(-1)``.  Either way the results are bit-identical to the
same values given as a plain 2-D tensor, a first and a steady call alike, in place or not, and the
input's autograd state is left as it was."""

from __future__ import annotations

import pytest
import torch

import homagg
from homagg.codec import History
from homagg.codec._config import CodecConfig
from homagg.codec._worker import Worker
from homagg.testing import on_threads
from homagg.transport import InProcessSwitch

WORLD, N = 2, 5000


def inputs(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(N, generator=g) * (1 + r) for r in range(WORLD)]


def reduce(tensors: list[torch.Tensor], *, inplace: bool = False, calls: int = 2) -> list[list[torch.Tensor]]:
    """Each call's results per rank (``calls`` calls with a history: a first call, then steady ones)."""
    switch = InProcessSwitch(WORLD)
    histories = [History() for _ in range(WORLD)]

    def rank(r: int) -> list[torch.Tensor]:
        outs = []
        for _ in range(calls):
            x = tensors[r]
            out = homagg.allreduce(x, switch.port(r), scheme="dense", history=histories[r], key="w", inplace=inplace)
            assert not inplace or out is x  # written into the input itself
            outs.append(out.detach().clone())
            if inplace:
                with torch.no_grad():
                    x.copy_(reference_inputs[r])  # the next call sees the same values
        return outs

    reference_inputs = [t.detach().clone() for t in tensors]
    return on_threads(rank, WORLD)


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and torch.equal(a.reshape(-1).view(torch.int32), b.reshape(-1).view(torch.int32))


def test_a_plain_1d_tensor_is_its_own_flat_view_and_others_are_detached() -> None:
    cfg = CodecConfig()
    x = torch.randn(N)
    assert Worker(x, WORLD, cfg).flat is x
    for other in (torch.randn(N, requires_grad=True), torch.nn.Parameter(torch.randn(N)), torch.randn(50, 100)):
        w = Worker(other, WORLD, cfg)
        assert w.flat is not other and w.flat.dim() == 1 and not w.flat.requires_grad
        assert w.flat.data_ptr() == other.data_ptr()


@pytest.mark.parametrize("kind", ["requires_grad", "parameter", "strided"])
def test_every_1d_input_sums_bit_for_bit_as_a_plain_2d_tensor(kind: str) -> None:
    base = inputs(39)
    want = reduce([t.reshape(50, 100).clone() for t in base])  # the detach/reshape path
    if kind == "requires_grad":
        given = [t.clone().requires_grad_() for t in base]
    elif kind == "parameter":
        given = [torch.nn.Parameter(t.clone()) for t in base]
    else:  # a strided 1-D view: not contiguous, so never written in place
        given = [torch.stack([t, torch.zeros_like(t)], 1).reshape(-1)[::2] for t in base]
    got = reduce(given)
    for calls_got, calls_want in zip(got, want, strict=True):
        for g, w in zip(calls_got, calls_want, strict=True):
            same(g, w)
    for g, b in zip(given, base, strict=True):  # inputs untouched (not in place), autograd state kept
        same(g.detach(), b)
        assert g.requires_grad == (kind != "strided") and g.grad is None


def test_a_plain_1d_tensor_sums_in_place_bit_for_bit() -> None:
    base = inputs(40)
    want = reduce([t.reshape(50, 100).clone() for t in base])
    targets = [t.clone() for t in base]
    got = reduce(targets, inplace=True)
    for calls_got, calls_want in zip(got, want, strict=True):
        for g, w in zip(calls_got, calls_want, strict=True):
            same(g, w)
