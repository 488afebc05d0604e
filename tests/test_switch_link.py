"""``SwitchLink.close`` from several threads (a failed link's background close and the group's
shutdown): each closer runs once, and no caller returns before the link is released.

Real parts: the closers are the ones a shared embedded emulator's users hold (its reference count,
``homagg.torch._udp_link``), or plain counting functions; the threads are real threads.
"""

from __future__ import annotations

import threading

import pytest

from homagg.torch._link import SwitchLink
from homagg.transport import InProcessSwitch


def _link(closers: list) -> SwitchLink:
    return SwitchLink(InProcessSwitch(1).port(0), "embedded", _closers=list(closers))


def test_a_second_close_waits_for_the_first() -> None:
    """The second caller returns only once the first caller's closers have run."""
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow_release() -> None:
        entered.set()
        release.wait(10)
        ran.append("released")

    link = _link([slow_release])
    first = threading.Thread(target=link.close)
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=link.close)
    second.start()
    second.join(0.3)
    assert second.is_alive(), "a second close returned while the link was still being released"
    release.set()
    first.join(10)
    second.join(10)
    assert not second.is_alive() and ran == ["released"]


def test_a_shared_emulator_stops_with_its_last_user_only() -> None:
    """Two groups share this process's embedded emulator; one group's link closed from two threads
    at once (what a fallback's background close and the group's shutdown did) leaves the emulator
    serving the other group."""
    from homagg.torch import _udp_link
    from homagg.transport import ControlClient

    host = "127.0.0.1"
    first = _udp_link._acquire_emulator(host)
    second = _udp_link._acquire_emulator(host)
    assert first is second
    try:
        link = _link([lambda: _udp_link._release_emulator(host, first)])
        threads = [threading.Thread(target=link.close) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert first.process.poll() is None, "the emulator stopped while another group still uses it"
        with ControlClient(first.control_addr, secret=first.secret, timeout=5) as ctl:
            assert ctl.ping()["version"]
    finally:
        _udp_link._release_emulator(host, second)
    assert first.process.wait(10) is not None  # the last user stopped it


@pytest.mark.parametrize("closers", [0, 1])
def test_close_is_idempotent(closers: int) -> None:
    ran: list[int] = []
    link = _link([lambda: ran.append(1)] * closers)
    link.close()
    link.close()
    assert ran == [1] * closers
