"""The UDP link of a process group larger than one switch: a tree of switches (docs/trees.md).

Two sources of the tree:

* **embedded** (the default, ``world_size > 32``): group rank 0 starts one emulator per switch of
  :func:`homagg.tree.plan_tree`'s plan on this machine (2 leaves and a root at 33..64 ranks, up to
  32 leaves at 1024), all with one fresh control secret, and stops them when the group's link
  closes.  Each runs the emulator's default engine (native where built; both engines have the
  child role).
* **a tree job file** (``switch = /path/tree.toml``, :mod:`homagg._treefile`): external switches
  at the addresses it names; each rank finds their control secret itself
  (``HOMAGG_SWITCH_SECRET`` / ``HOMAGG_SWITCH_SECRET_FILE``).

Admission (rank 0, before anything is sent): the root first (it picks the job id and slot range
unless the file gives them; its members are its children's data addresses with their child ids),
then every other switch with the same job id, token, slots and words per packet, its parent's data
address and its child id.  One token for the whole tree (the file's, else a fresh random one), so
every switch admits only its own members with the job's token.  Rank 0 publishes each switch's
data and control address and its :class:`~homagg.jobs.JobSpec` in the group's store; each rank
opens a :class:`~homagg.transport.UdpSwitchPort` to its leaf as worker ``place(rank)`` there, with
``total_world_size`` = the group's size (the codec's headroom follows the whole job).

Failure: each port watches, beside its own leaf, a store flag that any rank sets when it finds a
switch of the tree gone, and worker 0 of each leaf also the leaf's ancestors' control ports (one
prober per leaf: at 1024 ranks the root's control port sees 32 connects per probe interval while
a round stalls, not 1024) (:class:`TreeWatch`).  So a dead root or another rank's dead leaf ends
every rank's stalled round within about a second; the group then falls back to the host path
(:mod:`._fallback`), and a return starts a new tree.

Closing: every rank closes its port and counts itself out in the store; rank 0 waits (bounded)
for the others, removes the job from every switch and stops the emulators it started.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
import warnings
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from .._errors import ConfigError, TransportError
from .._treefile import TreeJob, load_tree_file
from ._config import BackendConfig
from ._link import SwitchLink, await_ports_closed, port_closer

__all__ = ["open_tree", "TreeWatch"]

_CLOSE_WAIT_S = 10.0
_START_TIMEOUT_S = 60.0


def _spawn_tree(host: str, count: int, secret: str) -> list[Any]:
    """``count`` emulators on ``host`` sharing ``secret``, started in parallel (all or none)."""
    import os

    import switch_emulator

    started: list[Any] = [None] * count
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            started[i] = switch_emulator.spawn(
                listen=(host, 0), control=(host, 0), timeout=_START_TIMEOUT_S, secret=secret,
                allow_faults=os.environ.get("HOMAGG_EMULATOR_FAULTS", "0") == "1",
                log_level=os.environ.get("HOMAGG_EMULATOR_LOG_LEVEL", "warning"))
        except BaseException as exc:  # noqa: BLE001 - re-raised below, after the others are stopped
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,), name=f"homagg-tree-spawn{i}", daemon=True)
               for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_START_TIMEOUT_S + 5)
    if errors or any(e is None for e in started):
        _stop_all(started)
        why = errors[0] if errors else TimeoutError(f"not serving within {_START_TIMEOUT_S:.0f}s")
        raise ConfigError(f"homagg: cannot start the tree's {count} embedded emulators on {host}: {why}") from (
            errors[0] if errors else None)
    return started


def _stop_all(emulators: list[Any]) -> None:
    for e in emulators:
        if e is not None:
            e.stop()


def _admit_tree(tree: TreeJob, token: int, secret: str | None, timeout_s: float) -> list[Any]:
    """Admit the job at every switch of ``tree``, root first (see the module docstring); the specs
    as admitted, in the tree's order.  On a refusal the switches admitted so far remove the job."""
    from ..transport import ControlClient

    specs: list[Any] = []
    try:
        for i, s in enumerate(tree.switches):
            first = specs[0] if specs else None
            want = tree.spec(i, job_id=first.job_id if first else (tree.job_id or 0), token=token,
                             slot_base=first.slot_base if first else (tree.slot_base or 0))
            with ControlClient(s.control, timeout=timeout_s, secret=secret) as ctl:
                specs.append(ctl.admit(
                    want.world_size, job_id=want.job_id if first or tree.job_id is not None else None,
                    slot_base=want.slot_base if first or tree.slot_base is not None else None,
                    n_slots=want.n_slots, words_per_packet=want.words_per_packet,
                    workers=[{"worker_id": w.worker_id, "ip": w.ip, "port": w.port} for w in want.workers],
                    token=token, parent=want.parent, child_id=want.child_id))
    except BaseException as exc:
        if specs:
            _remove_everywhere(tree, specs[0].job_id, secret, timeout_s, count=len(specs))
        name = tree.switches[len(specs)].name if len(specs) < len(tree.switches) else "?"
        exc.add_note(f"homagg: admitting the tree's job at switch {name!r} (switch {len(specs)} of "
                     f"{len(tree.switches)})")
        raise
    return specs


def _remove_everywhere(tree: TreeJob, job_id: int, secret: str | None, timeout_s: float,
                       count: int | None = None) -> list[str]:
    """Remove ``job_id`` from the first ``count`` switches (all by default); what failed, as text."""
    from ..transport import ControlClient

    failed = []
    for s in tree.switches[:count]:
        try:
            with ControlClient(s.control, timeout=timeout_s, secret=secret) as ctl:
                ctl.remove(job_id)
        except (TransportError, ConfigError, OSError) as exc:  # switch gone: no job left there to remove
            failed.append(f"{s.name}: {exc}")
    return failed


class TreeWatch:
    """A port's liveness probe in a tree: its leaf's (:class:`~homagg.transport._liveness.Liveness`,
    ``inner``), then its leaf's ancestors' control ports, then the group's store flag ``flag_key``
    (set by the first rank that finds a switch of the tree gone), each at most every
    ``inner.interval_s`` while a round stalls.  Same interface as ``inner``; ``gone`` returns a
    reason only on positive evidence, as ``inner`` does."""

    def __init__(self, inner: Any, ancestors: list[tuple[str, tuple[str, int]]], store: dist.Store,
                 flag_key: str) -> None:
        self.inner = inner
        self.ancestors = ancestors
        self.store = store
        self.flag_key = flag_key
        self._next = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # control, interval_s, take_probes, counters...

    def gone(self, now: float, stalled_s: float, refused: int, sent: int = 0) -> str | None:
        why = self.inner.gone(now, stalled_s, refused, sent)
        if why is None and stalled_s >= self.inner.min_stall_s and now >= self._next:
            self._next = now + self.inner.interval_s
            why = self._tree_gone()
        if why is not None:
            self._publish(why)
        return why

    def _tree_gone(self) -> str | None:
        from ..transport._liveness import control_silent

        for name, control in self.ancestors:
            silent = control_silent(control, self.inner.connect_timeout_s)
            if silent is not None:
                return f"is cut off from the tree: switch {name} is gone: {silent}"
        try:
            if self.store.check([self.flag_key]):
                return "is cut off from the tree: " + self.store.get(self.flag_key).decode()
        except RuntimeError:
            pass  # the store is gone: no evidence either way
        return None

    def _publish(self, why: str) -> None:
        try:
            if not self.store.check([self.flag_key]):
                self.store.set(self.flag_key, f"another rank found a switch of the tree gone ({why})"[:400])
        except RuntimeError:
            pass


def open_tree(
    config: BackendConfig,
    store: dist.Store,
    rank: int,
    size: int,
    group_timeout_s: float,
    store_get: Callable[[dist.Store, str, float, str], bytes],
    key: str,
) -> SwitchLink:
    """This rank's link to the group's tree of switches (see the module docstring)."""
    from ..jobs import JobSpec, new_token
    from ..transport import UdpSwitchPort
    from ..transport._auth import new_secret
    from ..tree import plan_tree
    from ._udp_link import embedded_packet_shape, emulator_host

    emulators: list[Any] = []
    ctl_timeout = min(config.timeout, 10.0)
    if rank == 0:
        try:
            if config.switch == "embedded":
                plan = plan_tree(size)
                host = emulator_host(config, store)
                secret: str | None = new_secret()
                emulators = _spawn_tree(host, len(plan.switches), secret)  # type: ignore[arg-type]
                words, slots = embedded_packet_shape(host, config.words_per_packet, config.slots)
                tree = TreeJob.from_plan(plan, [(e.data_addr, e.control_addr) for e in emulators],
                                         n_slots=slots, words_per_packet=words)
            else:
                tree, secret = load_tree_file(config.switch), None
                tree = replace(tree, n_slots=config.slots or tree.n_slots,  # an explicit option wins
                               words_per_packet=config.words_per_packet or tree.words_per_packet).validate()
            specs = _admit_tree(tree, tree.token or new_token(), secret, ctl_timeout)
        except BaseException as exc:
            _stop_all(emulators)
            try:
                store.set(key, json.dumps({"error": f"{type(exc).__name__}: {exc}"[:500]}))
            except RuntimeError:
                pass  # the store is gone: the others' waits end at their bound
            raise
        store.set(key, json.dumps({"tree": [{"name": s.name, "data": list(s.data), "control": list(s.control),
                                             "ranks": list(s.ranks), "job": j.to_dict()}
                                            for s, j in zip(tree.switches, specs, strict=True)],
                                   "secret": secret}))
    info = json.loads(store_get(store, key, group_timeout_s, "the tree of switches").decode())
    if "error" in info:
        raise TransportError("homagg: group rank 0 could not open the tree of switches (start the emulators, admit "
                             f"the job): {info['error']}")
    switches, secret = info["tree"], info.get("secret")
    index = next(i for i, s in enumerate(switches) if rank in s["ranks"])
    mine = switches[index]
    job = JobSpec.from_dict(mine["job"])
    data, control = tuple(mine["data"]), tuple(mine["control"])
    try:
        port = UdpSwitchPort(data, rank=mine["ranks"].index(rank), job=job, control=control, timeout=config.timeout,
                             secret=secret, total_world_size=size)
    except BaseException:
        _stop_all(emulators)
        raise
    by_data = {tuple(s["data"]): s for s in switches}
    ancestors, up = [], job.parent if port.rank == 0 else None  # one prober of the ancestors per leaf
    while up is not None:
        above = by_data[tuple(up)]
        ancestors.append((above["name"], tuple(above["control"])))
        up = JobSpec.from_dict(above["job"]).parent
    port._liveness = TreeWatch(port._liveness, ancestors, store, f"{key}/gone")
    kind = "embedded" if config.switch == "embedded" else "external"
    link = SwitchLink(port, kind, data, job.job_id, control, emulators[index] if emulators else None,
                      emulators=tuple(emulators))

    def release_tree() -> None:
        await_ports_closed(store, key, size, min(_CLOSE_WAIT_S, config.timeout))
        try:
            failed = _remove_everywhere(tree, job.job_id, secret, min(config.timeout, 5.0))
            if failed:
                warnings.warn(f"homagg: could not remove job {job.job_id} from every switch of the tree: "
                              + "; ".join(failed), stacklevel=2)
        finally:
            _stop_all(emulators)

    if rank == 0:
        link._closers.append(release_tree)
    link._closers.append(port_closer(port, store, key))  # closers run in reverse: port first, then the job
    return link

