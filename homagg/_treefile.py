"""Tree job files: a job of up to 1024 ranks aggregated by a tree of external switches.

A tree job file (TOML for a ``.toml`` suffix, JSON otherwise; docs/trees.md, "Tree job files")
names every switch of the tree with its data and control addresses, its parent and its worker id
there (``child_id``), and the group ranks each leaf serves::

    world_size = 40
    token = "0x5eed1e55"        # optional: a fresh random token when absent
    job_id = 7                  # optional: the root picks one (then every switch uses it)
    slot_base = 0               # optional: the root picks one (then every switch uses it)
    n_slots = 64                # optional: 64
    words_per_packet = 32       # optional: 32 (what every P4 target takes)

    [[switches]]
    name = "spine"
    data = "10.0.0.1:18497"
    control = "10.0.0.1:18498"  # optional: the data port + 1

    [[switches]]
    name = "leaf0"
    data = "10.0.1.1:18497"
    parent = "spine"
    child_id = 0
    ranks = "0-19"              # ranks as a list ([0, 1, 2]) or ranges ("0-19,30")

Every rank of the group reads the same file (``HOMAGG_SWITCH=/path/tree.toml``); the group's
rank 0 admits the job at every switch, the others register with their leaf.

Invariants of a :class:`TreeJob` (checked by :func:`load_tree_file` and :meth:`TreeJob.validate`):
exactly one root (no ``parent``), listed first; every other switch's parent is listed before it
(no cycles) and its ``child_id`` is unique among its parent's children and below
:data:`~homagg.wire.MAX_WORKERS`; a parent's children have the ids ``0..n-1``; a switch either
serves ranks (a leaf) or has children, never both, and has at most ``MAX_WORKERS`` members; every
rank ``0..world_size-1`` is served by exactly one leaf (its worker id there: its position in the
leaf's sorted ranks).  Switch names and data addresses are unique.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from .jobs import JobSpec, WorkerAddr, parse_addr, read_job_file
from .tree import MAX_TREE_RANKS, TreePlan
from .wire import MAX_WORKERS

__all__ = ["TreeSwitchAddr", "TreeJob", "load_tree_file", "tree_from_dict", "is_tree_file", "parse_ranks"]

_TOP_KEYS = {"world_size", "token", "job_id", "slot_base", "n_slots", "words_per_packet", "switches"}
_SWITCH_KEYS = {"name", "data", "control", "parent", "child_id", "ranks"}


def is_tree_file(text: str) -> bool:
    """Does a ``switch`` option name a tree job file (a ``.toml`` or ``.json`` path) rather than
    ``host:port``?  (A port is a number, so no address ends with either suffix.)"""
    return text.strip().lower().endswith((".toml", ".json"))


@dataclass(frozen=True)
class TreeSwitchAddr:
    """One switch of a tree job: where it is, where it reports, whom it serves.

    ``parent`` is the parent's index in :attr:`TreeJob.switches` (None at the root); ``ranks``
    the group ranks a leaf serves, sorted (worker ``w`` is ``ranks[w]``), empty above the leaves."""

    name: str
    data: tuple[str, int]
    control: tuple[str, int]
    parent: int | None
    child_id: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class TreeJob:
    """A job's tree of switches, root first (see the module docstring for the invariants).

    ``token``, ``job_id``, ``slot_base``: None lets group rank 0 (token) or the root's switch
    (job id, slots) choose; the same values then go to every switch."""

    world_size: int
    switches: tuple[TreeSwitchAddr, ...]
    token: int | None = None
    job_id: int | None = None
    slot_base: int | None = None
    n_slots: int = 64
    words_per_packet: int = 32

    def children(self, index: int) -> list[TreeSwitchAddr]:
        """Switch ``index``'s children, by child id."""
        return sorted((s for s in self.switches if s.parent == index), key=lambda s: s.child_id)

    def members(self, index: int) -> int:
        """Workers switch ``index`` combines: its ranks at a leaf, its children above."""
        return len(self.switches[index].ranks) or len(self.children(index))

    def place(self, rank: int) -> tuple[int, int]:
        """``(switch index, worker id there)`` of group rank ``rank``."""
        for i, s in enumerate(self.switches):
            if rank in s.ranks:
                return i, s.ranks.index(rank)
        raise ConfigError(f"rank {rank} is served by no switch of the tree (world_size {self.world_size})")

    def spec(self, index: int, *, job_id: int, token: int, slot_base: int) -> JobSpec:
        """The job as switch ``index`` admits it: its members (children's data addresses above the
        leaves; leaves' ranks register themselves), its parent, the tree's ids, token and slots."""
        s = self.switches[index]
        workers = tuple(WorkerAddr(c.child_id, c.data[0], c.data[1]) for c in self.children(index))
        parent = None if s.parent is None else self.switches[s.parent].data
        return JobSpec(job_id, self.members(index), slot_base, self.n_slots, self.words_per_packet, workers,
                       token=token, parent=parent, child_id=s.child_id).validate()

    def validate(self, source: str = "tree") -> TreeJob:
        """Return ``self`` if it keeps the module's invariants, else raise :class:`~homagg.ConfigError`
        (its message starts with ``source``: the file)."""
        if not 1 <= self.world_size <= MAX_TREE_RANKS:
            raise ConfigError(f"{source}: world_size {self.world_size} outside 1..{MAX_TREE_RANKS}")
        if not self.switches or self.switches[0].parent is not None:
            raise ConfigError(f"{source}: the first switch must be the root (no parent)")
        names = [s.name for s in self.switches]
        datas = [s.data for s in self.switches]
        for what, seq in (("names", names), ("data addresses", datas)):
            if len(set(seq)) != len(seq):
                raise ConfigError(f"{source}: switch {what} must be unique, got {seq}")
        served: dict[int, str] = {}
        for i, s in enumerate(self.switches):
            if i and (s.parent is None or not 0 <= s.parent < i):
                raise ConfigError(f"{source}: switch {s.name!r} needs a parent listed before it (one root, no cycles)")
            kids = self.children(i)
            if kids and s.ranks:
                raise ConfigError(f"{source}: switch {s.name!r} serves ranks and has children {[c.name for c in kids]}: "
                                  "a switch is a leaf (ranks) or a parent of switches, not both")
            if [c.child_id for c in kids] != list(range(len(kids))):
                raise ConfigError(f"{source}: the children of {s.name!r} have child ids {[c.child_id for c in kids]}; "
                                  f"expected 0..{len(kids) - 1}, each once")
            if not 1 <= self.members(i) <= MAX_WORKERS:
                raise ConfigError(f"{source}: switch {s.name!r} has {self.members(i)} members; a switch combines 1.."
                                  f"{MAX_WORKERS} (the worker bitmap)")
            for r in s.ranks:
                if r in served:
                    raise ConfigError(f"{source}: rank {r} is served by {served[r]!r} and {s.name!r}")
                served[r] = s.name
        missing = sorted(set(range(self.world_size)) - set(served))
        extra = sorted(set(served) - set(range(self.world_size)))
        if missing or extra:
            raise ConfigError(f"{source}: the leaves must serve ranks 0..{self.world_size - 1} exactly; "
                              f"missing {_short(missing)}, outside {_short(extra)}")
        return self

    @classmethod
    def from_plan(cls, plan: TreePlan, addrs: Sequence[tuple[tuple[str, int], tuple[str, int]]], *,
                  n_slots: int, words_per_packet: int, token: int | None = None) -> TreeJob:
        """The tree of :func:`homagg.tree.plan_tree`'s ``plan`` on switches at ``addrs`` (one
        ``(data, control)`` per switch of the plan, in its order)."""
        switches = tuple(TreeSwitchAddr(f"switch{s.index}", tuple(data), tuple(ctl), s.parent, s.child_id,
                                        tuple(s.ranks) if s.ranks is not None else ())
                         for s, (data, ctl) in zip(plan.switches, addrs, strict=True))
        return cls(plan.world_size, switches, token, None, None, n_slots, words_per_packet).validate()


def parse_ranks(value: Any, *, source: str) -> tuple[int, ...]:
    """A leaf's ranks: a list of ints, or ranges as text (``"0-19,30"``, inclusive); sorted."""
    out: list[int] = []
    if isinstance(value, str):
        for part in (p.strip() for p in value.split(",")):
            lo, dash, hi = part.partition("-")
            try:
                first, last = int(lo), int(hi) if dash else int(lo)
            except ValueError:
                raise ConfigError(f"{source}: ranks {value!r}: expected e.g. '0-19,30'") from None
            if last < first:
                raise ConfigError(f"{source}: ranks {value!r}: range {part!r} is empty")
            out.extend(range(first, last + 1))
    elif isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value):
        out = list(value)
    else:
        raise ConfigError(f"{source}: ranks must be a list of ints or a string such as '0-19,30', got {value!r}")
    if len(set(out)) != len(out) or any(r < 0 for r in out):
        raise ConfigError(f"{source}: ranks {value!r} repeat a rank or are negative")
    return tuple(sorted(out))


def _short(ranks: list[int]) -> str:
    return str(ranks[:8])[:-1] + (", ...]" if len(ranks) > 8 else "]")


def _int(d: Mapping[str, Any], key: str, default: int | None, source: str) -> int | None:
    v = d.get(key, default)
    if v is None:
        return None
    try:
        return int(v, 0) if isinstance(v, str) else int(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {key} {v!r} is not an integer") from None


def tree_from_dict(d: Any, *, source: str = "tree job") -> TreeJob:
    """A :class:`TreeJob` from a parsed file (see the module docstring for the keys)."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{source}: expected a table/object at the top, got {type(d).__name__}")
    unknown = sorted(set(d) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; known: {sorted(_TOP_KEYS)}")
    items = d.get("switches")
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{source}: 'switches' must be a non-empty list of tables")
    world = _int(d, "world_size", None, source)
    if world is None:
        raise ConfigError(f"{source}: world_size is required")
    index: dict[str, int] = {}
    switches: list[TreeSwitchAddr] = []
    for i, s in enumerate(items):
        where = f"{source}: switches[{i}]"
        if not isinstance(s, Mapping):
            raise ConfigError(f"{where}: expected a table/object")
        bad = sorted(set(s) - _SWITCH_KEYS)
        if bad:
            raise ConfigError(f"{where}: unknown keys {bad}; known: {sorted(_SWITCH_KEYS)}")
        name = str(s.get("name", f"switch{i}"))
        if "data" not in s:
            raise ConfigError(f"{where} ({name}): 'data' (HOST:PORT) is required")
        data = parse_addr(s["data"], source=f"{where}.data", zero_port=False)
        control = (parse_addr(s["control"], source=f"{where}.control", zero_port=False) if "control" in s
                   else (data[0], data[1] + 1))
        parent_name = s.get("parent")
        if parent_name is not None and str(parent_name) not in index:
            raise ConfigError(f"{where} ({name}): parent {parent_name!r} is not a switch listed before it")
        parent = None if parent_name is None else index[str(parent_name)]
        child_id = _int(s, "child_id", None if parent is not None else 0, where)
        if child_id is None:
            raise ConfigError(f"{where} ({name}): child_id (its worker id at {parent_name!r}) is required")
        if parent is None and child_id != 0:
            raise ConfigError(f"{where} ({name}): child_id {child_id} without a parent")
        ranks = parse_ranks(s["ranks"], source=where) if "ranks" in s else ()
        index[name] = i
        switches.append(TreeSwitchAddr(name, data, control, parent, child_id, ranks))
    token = _int(d, "token", None, source)
    if token is not None and not 0 < token < 1 << 32:
        raise ConfigError(f"{source}: token {token:#x} outside 1..2**32-1")
    return TreeJob(world, tuple(switches), token, _int(d, "job_id", None, source), _int(d, "slot_base", None, source),
                   _int(d, "n_slots", 64, source), _int(d, "words_per_packet", 32, source)).validate(source)  # type: ignore[arg-type]


def load_tree_file(path: str | Path) -> TreeJob:
    """The tree job in ``path`` (TOML or JSON); :class:`~homagg.ConfigError` naming the file and
    what is wrong."""
    return tree_from_dict(read_job_file(path), source=str(path))

