"""Greedy DAG extraction: each class keeps the node whose *set* of needed nodes is cheapest.

A node needs itself plus, for each child class, everything that class's current best
needs; the set is a dict class -> cost, so a class shared by two children is paid once.
A worklist recomputes the users of a class whenever it gets strictly cheaper, so the
loop ends. Sets are shared, not copied (see ``_Set``): on a long chain each step costs
O(1) set work instead of a copy of everything below it. A node whose children's sets already contain its own class would close a
cycle and is skipped.

The final picks can still form a cycle (a class may keep a set computed from an older
best of its child), so the choice is repaired: a class on a cycle falls back to its
tree-cost pick, together with everything that pick needs, which is acyclic.
"""

from __future__ import annotations

import math
import time
from collections import deque

from .cycles import find_cycle
from .egraph import EGraph
from .extractor import Extractor, Solution
from .result import HEURISTIC
from .tree import CHECK_EVERY, choice_from_picks, heuristic_costs, past, tree_costs


def greedy_dag_picks(
    egraph: EGraph, allowed: list[bool] | None = None, deadline: float | None = None, roots: tuple[int, ...] = ()
) -> list[int]:
    """The greedy node of every class (-1 where no finite, cycle-free set exists),
    using only the nodes marked in ``allowed`` if given. Past ``deadline`` the loop
    stops as soon as every class in ``roots`` has a pick (``acyclic_choice`` makes
    such picks a valid choice)."""
    cost = heuristic_costs(egraph, allowed)
    child_sets = egraph.child_sets
    node_class = egraph.node_class.tolist()
    parents = egraph.parents
    best_cost = [math.inf] * egraph.n_classes
    best_set: list[_Set | None] = [None] * egraph.n_classes
    pick = [-1] * egraph.n_classes
    queue = deque(n for n in range(egraph.n_nodes) if not child_sets[n])
    queued = [False] * egraph.n_nodes
    for n in queue:
        queued[n] = True
    steps = 0
    while queue:
        steps += 1
        if steps % CHECK_EVERY == 0 and past(deadline, pick, roots):
            break
        node = queue.popleft()
        queued[node] = False
        cls = node_class[node]
        own = cost[node]
        if own >= best_cost[cls]:
            continue
        children = child_sets[node]
        if len(children) == 1:  # the common case, a chain: share the child's set
            s = best_set[children[0]]
            if s is None or (s.bits >> cls) & 1:
                continue
            total = best_cost[children[0]] + own
            if total >= best_cost[cls]:
                continue
            union = _Set(s, [(cls, own)], total, s.bits | (1 << cls))
        else:
            sets = [best_set[c] for c in children]
            if any(s is None or (s.bits >> cls) & 1 for s in sets):
                continue
            union = _union_if_cheaper(sets, best_cost, children, cls, own, best_cost[cls])
            if union is None:
                continue
        best_set[cls], best_cost[cls] = union, union.cost
        pick[cls] = node
        for parent in parents[cls]:
            if not queued[parent]:
                queued[parent] = True
                queue.append(parent)
    return pick


class _Set:
    """A node's needed set, class -> cost, kept incrementally: the set ``base`` (or
    none) plus ``extra`` (class, cost) pairs. A node with one child class shares that
    class's set instead of copying it, so a chain of n classes costs O(n) sets of O(1)
    size each, not O(n^2) entries. ``bits`` marks the member classes; ``flat()`` gives
    the dict, in the insertion order the union below defines, built once when needed."""

    __slots__ = ("base", "extra", "cost", "size", "bits", "_flat", "_pos")

    def __init__(self, base: _Set | None, extra: list[tuple[int, float]], cost: float, bits: int):
        self.base, self.extra, self.cost, self.bits = base, extra, cost, bits
        self.size = len(extra) + (base.size if base is not None else 0)
        self._flat: dict[int, float] | None = None
        self._pos: dict[int, int] | None = None

    def members_in_order(self, bits: int) -> list[tuple[int, float]]:
        """The (class, cost) pairs of the members marked in ``bits``, in ``flat()``'s
        order (so that sums over them round as a walk of the whole set would), found
        from the bits rather than by testing every member: a test of one bit of a
        big int costs as much as the int is long."""
        flat = self.flat()
        if self._pos is None:
            self._pos = {c: i for i, c in enumerate(flat)}
        found = []
        while bits:
            low = bits & -bits
            found.append(low.bit_length() - 1)
            bits ^= low
        pos = self._pos
        found.sort(key=pos.__getitem__)
        return [(c, flat[c]) for c in found]

    def flat(self) -> dict[int, float]:
        if self._flat is None:
            layers, s = [], self
            while s is not None and s._flat is None:
                layers.append(s)
                s = s.base
            d = dict(s._flat) if s is not None else {}
            for layer in reversed(layers):
                d.update(layer.extra)
            self._flat = d
        return self._flat


def _union_if_cheaper(sets, best_cost, children, cls, own, bound):
    """``{cls: own}`` plus the union of ``sets`` (the first set holding a class gives
    its cost, the largest set counting first), or None if its cost is not < bound.

    The largest set is the base and is shared, not walked; only the smaller ones are,
    and the walk stops as soon as the running cost reaches the bound.
    """
    if not sets:
        return _Set(None, [(cls, own)], own, 1 << cls)
    big = max(range(len(sets)), key=lambda i: sets[i].size)
    base = sets[big]
    total = best_cost[children[big]] + own
    if total >= bound:
        return None
    seen = base.bits
    extra: list[tuple[int, float]] = []
    for i, s in enumerate(sets):
        if i == big:
            continue
        new = s.bits & ~seen
        if new:
            seen |= new
            if 2 * new.bit_count() > s.size:  # most of the set is new: walk it
                pairs = [(c, v) for c, v in s.flat().items() if (new >> c) & 1]
            else:
                pairs = s.members_in_order(new)
            for c, v in pairs:
                extra.append((c, v))
                total += v
        if total >= bound:
            return None
    extra.append((cls, own))
    return _Set(base, extra, total, seen | (1 << cls))


def acyclic_choice(egraph: EGraph, pick: list[int], roots: tuple[int, ...]) -> dict[int, int]:
    """The picks as a choice, with classes on a cycle switched to their tree picks
    (computed only if there is a cycle)."""
    choice = choice_from_picks(egraph, pick, roots, "DAG")
    switched: set[int] = set()
    tree_pick: list[int] = []
    while (cycle := find_cycle(egraph.child_sets, choice, roots)) is not None:
        if not tree_pick:
            _, tree_pick = tree_costs(egraph)
        # The tree picks are closed (a tree pick's children have tree picks) and
        # acyclic, so once a class and all its tree descendants are switched, no cycle
        # passes through them; each round switches at least one more class.
        stack = [cycle[0]]
        while stack:
            cls = stack.pop()
            if cls not in switched:
                switched.add(cls)
                choice[cls] = tree_pick[cls]
                stack.extend(egraph.child_sets[tree_pick[cls]])
    return choice


class GreedyDagExtractor(Extractor):
    name = "greedy-dag"

    def solve(self, egraph: EGraph, roots: tuple[int, ...], time_limit: float | None) -> Solution:
        # Stop the worklist at 80 % of the limit: releasing its shared sets afterwards
        # takes time too (on a 4,000-class chain, about 15 % of the time spent).
        deadline = None if time_limit is None else time.perf_counter() + 0.8 * time_limit
        return Solution(first_choice(egraph, roots, deadline), HEURISTIC)


def first_choice(egraph: EGraph, roots: tuple[int, ...], deadline: float | None = None) -> dict[int, int]:
    """The greedy DAG choice; past ``deadline``, the picks greedy has so far (once
    every root has one), repaired to be acyclic."""
    return acyclic_choice(egraph, greedy_dag_picks(egraph, deadline=deadline, roots=roots), roots)
