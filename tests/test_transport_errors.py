"""Transport failures map to the HomAggError tree in one place, by type and waited time (no text matching)."""

from __future__ import annotations

import socket

import pytest
import torch.distributed as dist

from homagg import HomAggError, SwitchTimeoutError, TransportError
from homagg._errors import ConfigError
from homagg.transport import ControlClient, transport_error


@pytest.mark.parametrize("exc, timed_out", [
    (TimeoutError("x"), True),
    (socket.timeout("x"), True),
    (dist.DistStoreError("Wait timeout"), True),
    (ConnectionRefusedError(111, "refused"), False),
    (dist.DistNetworkError("Connection reset by peer"), False),
    (RuntimeError("Timed out waiting 1000ms for recv"), False),  # the text alone proves nothing
])
def test_mapped_by_type(exc: BaseException, timed_out: bool) -> None:
    err = transport_error(exc, "doing X")
    assert isinstance(err, TransportError)
    assert isinstance(err, SwitchTimeoutError) is timed_out
    assert str(err).startswith("doing X: ") and type(exc).__name__ in str(err)


def test_failure_at_the_bound_is_a_timeout() -> None:
    err = transport_error(RuntimeError("gloo says something"), "gloo ADD", timeout_s=2.0, waited_s=2.01)
    assert isinstance(err, SwitchTimeoutError) and "within 2s" in str(err)
    assert not isinstance(transport_error(RuntimeError("y"), "gloo", timeout_s=2.0, waited_s=0.1), SwitchTimeoutError)


def test_homagg_errors_pass_through() -> None:
    e = ConfigError("bad")
    assert transport_error(e, "anything") is e
    assert isinstance(e, HomAggError)


def test_control_client_unreachable_is_transport_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        addr = s.getsockname()
    with pytest.raises(TransportError, match=r"switch control 127\.0\.0\.1:\d+ \(ping\)"):
        ControlClient(addr, timeout=1.0).ping()
