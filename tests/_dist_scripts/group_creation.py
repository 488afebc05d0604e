"""Rank script: creating a homagg group while group rank 0 (the emulator's host) dies, or a rank is slow.

Environment:
``GC_MODE``   ``init`` (``init_process_group("homagg")``) or ``new_group`` (gloo world, then
              ``new_group(backend="homagg")``);
``GC_EVENT``  ``after_publish``: rank 0 dies (``os._exit``) right after it published the switch's
              address and job, before its own registration (its emulator dies with it);
              ``before_switch``: rank 0 dies after both gloo groups exist, before the switch is set
              up; ``slow_register``: the last rank registers with the switch 3 s late (nobody dies);
              ``gloo_gives_up``: the last rank loses the store inside its private gloo group's
              connect, right after it published its address (as when the store's host dies then),
              so it gives up while its peers wait in gloo's connect for it (nobody dies);
              ``late_ops``: after creation the last rank joins a barrier (private gloo group) and a
              reduce (delegate) ``LATE_S`` late, longer than the gloo groups' connect timeout;
``GC_STORE_PORT``  when set, the rendezvous store is hosted by the test process (as torchrun's
              agent hosts it), so it outlives rank 0; otherwise rank 0 hosts it (``env://``).

The death is injected here, in the rank script, by wrapping the real function at that point; the
group's code is unchanged.  Each rank reports what creation did (outcome, error type, ``ranks``,
message, seconds) and wall-clock times; the test judges.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist

import homagg
import homagg.torch._creation as creation
import homagg.torch._process_group as pgmod
import homagg.transport
from _launch import write_result

warnings.filterwarnings("ignore")
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
MODE, EVENT = os.environ["GC_MODE"], os.environ["GC_EVENT"]
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("GC_TIMEOUT", "20")))
result: dict = {"rank": RANK}
LATE_S = 2.5


def late_ops(group: dist.ProcessGroup) -> dict:
    """The gloo groups' op timeouts, then a barrier and a reduce that the last rank joins late."""
    gloo_groups = (group._private, group._delegate)  # type: ignore[attr-defined]
    timeouts = [g.options._timeout.total_seconds() for g in gloo_groups]
    if RANK == WORLD - 1:
        time.sleep(LATE_S)
    dist.barrier(group=group)  # the private gloo group, on the group's worker
    if RANK == WORLD - 1:
        time.sleep(LATE_S)
    total = torch.ones(4)
    dist.reduce(total, 0, group=group)  # the delegate gloo group, in this thread
    return {"gloo_timeouts": timeouts, "reduced": total[0].item()}


def die(point: str) -> None:
    write_result({"rank": RANK, "died": point, "at": time.time()})
    sys.stdout.flush()
    os._exit(0)


if EVENT == "after_publish" and RANK == 0:
    homagg.transport.UdpSwitchPort = lambda *a, **k: die("after_publish")  # type: ignore[assignment,misc]
if EVENT == "before_switch" and RANK == 0:
    pgmod.open_switch = lambda *a, **k: die("before_switch")  # type: ignore[assignment]
if EVENT == "slow_register" and RANK == WORLD - 1:
    real_port = homagg.transport.UdpSwitchPort

    def slow_port(*args: object, **kwargs: object) -> object:
        time.sleep(3.0)
        port = real_port(*args, **kwargs)
        result["registered_at"] = time.time()
        return port

    homagg.transport.UdpSwitchPort = slow_port  # type: ignore[assignment,misc]

if EVENT == "gloo_gives_up" and RANK == WORLD - 1:
    real_prefix_store = creation.PrefixStore

    class LosesStore(dist.Store):
        """Publishes (``set``), then every read fails as a store whose host died does."""

        def __init__(self, inner: dist.Store) -> None:
            super().__init__()
            self.inner = inner

        def set(self, key: str, value: bytes) -> None:
            self.inner.set(key, value)

        def _gone(self, *args: object) -> bytes:
            raise dist.DistNetworkError("Connection reset by peer (injected: the store's host died)")

        get = wait = check = add = multi_get = _gone

    def prefix_store(prefix: str, inner: dist.Store) -> dist.Store:
        wrapped = real_prefix_store(prefix, inner)
        return LosesStore(wrapped) if prefix == "homagg/private/" else wrapped

    creation.PrefixStore = prefix_store  # type: ignore[assignment]

store = None
if os.environ.get("GC_STORE_PORT"):
    store = dist.TCPStore("127.0.0.1", int(os.environ["GC_STORE_PORT"]), WORLD, is_master=False, timeout=TIMEOUT)
t0 = time.monotonic()
try:
    if MODE == "init":
        if store is None:
            dist.init_process_group("homagg", timeout=TIMEOUT)
        else:
            dist.init_process_group("homagg", store=store, rank=RANK, world_size=WORLD, timeout=TIMEOUT)
    else:
        if store is None:
            dist.init_process_group("gloo", timeout=TIMEOUT)
        else:
            dist.init_process_group("gloo", store=store, rank=RANK, world_size=WORLD, timeout=TIMEOUT)
        t0 = time.monotonic()
        group = dist.new_group(backend="homagg", timeout=TIMEOUT)
    result.update(outcome="ok", returned_at=time.time())
    if EVENT == "late_ops":
        result.update(late_ops(group if MODE == "new_group" else dist.group.WORLD))
except Exception as exc:  # noqa: BLE001 - the test judges the type
    result.update(outcome=type(exc).__name__, is_homagg=isinstance(exc, homagg.HomAggError),
                  ranks=list(getattr(exc, "ranks", [])), message=str(exc)[:1500])
result["seconds"] = time.monotonic() - t0
write_result(result)
sys.stdout.flush()
if result["outcome"] == "ok":
    dist.destroy_process_group()
else:
    os._exit(0)  # a peer is gone: torch's gloo world group cannot be torn down collectively
