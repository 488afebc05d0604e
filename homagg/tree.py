"""Aggregation trees: which switch each rank sends to, and which switch each switch reports to.

One switch holds at most :data:`~homagg.wire.MAX_WORKERS` members (the worker bitmap); beyond that
a job is aggregated by a tree of switches (docs/trees.md): the *leaves* combine their ranks, each
switch above combines its children (each child is one worker of its parent), the *root* completes
the use and the result travels back down.  ADD mod 2**32, OR and MAX are associative and
commutative, so a tree's result is bit-identical to one switch's of the same inputs.

:func:`plan_tree` spreads ``world_size`` ranks over the fewest levels that hold them (at most
``max_levels``; two levels hold ``MAX_WORKERS ** 2 = 1024`` ranks) and balances each level: leaf
``j`` of ``n`` serves the contiguous ranks ``[j * W // n, (j + 1) * W // n)``.  Switch 0 is the
root; switches are numbered level by level from the root down, so a parent's index is smaller
than its children's.

Invariants of a :class:`TreePlan`: every rank has exactly one leaf and a worker id below that
leaf's ``members``; every switch but the root has a parent one level up and a ``child_id`` below
the parent's ``members``; every switch has ``1 <= members <= per_switch``.  A one-switch plan
(``levels == 1``) is today's star: the root serves every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import ConfigError
from .wire import MAX_WORKERS

__all__ = ["MAX_LEVELS", "MAX_TREE_RANKS", "TreeSwitch", "TreePlan", "plan_tree"]

#: levels a job may use unless told otherwise (the limit homagg documents and tests: 1024 ranks)
MAX_LEVELS = 2
#: ranks a tree of :data:`MAX_LEVELS` levels of :data:`~homagg.wire.MAX_WORKERS` members holds
MAX_TREE_RANKS = MAX_WORKERS**MAX_LEVELS


@dataclass(frozen=True)
class TreeSwitch:
    """One switch of a tree: ``index`` (0 = root), its ``level`` (0 = root), its ``parent`` index
    (None at the root) and its worker id there (``child_id``), and how many ``members`` it combines
    (ranks at a leaf, child switches above).  ``ranks`` is the range of group ranks a leaf serves
    (its worker ``w`` is rank ``ranks[w]``); None above the leaves."""

    index: int
    level: int
    parent: int | None
    child_id: int
    members: int
    ranks: range | None

    @property
    def is_leaf(self) -> bool:
        return self.ranks is not None


@dataclass(frozen=True)
class TreePlan:
    """Switches of a tree, root first, level by level; see the module docstring for invariants."""

    world_size: int
    per_switch: int
    switches: tuple[TreeSwitch, ...]

    @property
    def levels(self) -> int:
        return self.switches[-1].level + 1

    @property
    def leaves(self) -> tuple[TreeSwitch, ...]:
        return tuple(s for s in self.switches if s.is_leaf)

    def children(self, index: int) -> tuple[TreeSwitch, ...]:
        """The switches whose parent is ``index``, by child id."""
        return tuple(s for s in self.switches if s.parent == index)

    def place(self, rank: int) -> tuple[int, int]:
        """``(leaf index, worker id at that leaf)`` of group rank ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank {rank} outside [0, {self.world_size}) of the tree")
        n = len(self.leaves)
        first = self.switches[-n].index
        j = min(n - 1, rank * n // self.world_size)  # the balanced split's leaf, corrected below
        while rank < j * self.world_size // n:
            j -= 1
        while rank >= (j + 1) * self.world_size // n:
            j += 1
        leaf = self.switches[first + j]
        assert leaf.ranks is not None
        return leaf.index, rank - leaf.ranks.start


def plan_tree(world_size: int, *, per_switch: int = MAX_WORKERS, max_levels: int = MAX_LEVELS) -> TreePlan:
    """The balanced tree of the fewest levels holding ``world_size`` ranks with ``per_switch``
    members per switch; :class:`~homagg.ConfigError` naming the limit when ``max_levels`` do not."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size {world_size!r}: expected an integer >= 1")
    if not 2 <= per_switch <= MAX_WORKERS:
        raise ConfigError(f"per_switch {per_switch} outside 2..{MAX_WORKERS} (the worker bitmap)")
    if max_levels < 1:
        raise ConfigError(f"max_levels {max_levels} < 1")
    levels = 1
    while per_switch**levels < world_size:
        levels += 1
    if levels > max_levels:
        raise ConfigError(
            f"world_size {world_size} exceeds {per_switch ** max_levels} ranks, the most a tree of {max_levels} "
            f"level{'s' if max_levels > 1 else ''} holds with {per_switch} members per switch (the worker bitmap); "
            f"homagg supports up to {MAX_TREE_RANKS} ranks")
    # sizes[k]: switches at level k (0 = root) ; leaves hold the ranks
    sizes = [1] * levels
    n = world_size
    for k in range(levels - 1, -1, -1):
        sizes[k] = -(-n // per_switch)
        n = sizes[k]
    sizes[0] = 1
    switches: list[TreeSwitch] = [TreeSwitch(0, 0, None, 0, sizes[1] if levels > 1 else world_size,
                                             range(world_size) if levels == 1 else None)]
    above = [0]  # indices of the previous level
    for k in range(1, levels):
        count, parents = sizes[k], len(above)
        level: list[TreeSwitch] = []
        for j in range(count):
            p = j * parents // count
            while j < _split(p, count, parents):
                p -= 1
            while j >= _split(p + 1, count, parents):
                p += 1
            child_id = j - _split(p, count, parents)
            below = world_size if k == levels - 1 else sizes[k + 1]
            lo, hi = _split(j, below, count), _split(j + 1, below, count)
            level.append(TreeSwitch(len(switches) + j, k, above[p], child_id, hi - lo,
                                    range(lo, hi) if k == levels - 1 else None))
        switches.extend(level)
        above = [s.index for s in level]
    plan = TreePlan(world_size, per_switch, tuple(switches))
    _check(plan)
    return plan


def _split(j: int, total: int, parts: int) -> int:
    """Start of part ``j`` when ``total`` items are split into ``parts`` balanced contiguous parts."""
    return j * total // parts


def _check(plan: TreePlan) -> None:
    for s in plan.switches:
        if not 1 <= s.members <= plan.per_switch:
            raise AssertionError(f"switch {s.index} has {s.members} members")  # pragma: no cover - by construction
        if s.parent is not None:
            assert s.child_id < plan.switches[s.parent].members
    assert sum(s.members for s in plan.leaves) == plan.world_size
