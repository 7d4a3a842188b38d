"""Greedy DAG extraction: each class keeps the node whose *set* of needed nodes is cheapest.

A node needs itself plus, for each child class, everything that class's current best
needs; the set is a dict class -> cost, so a class shared by two children is paid once.
A worklist recomputes the users of a class whenever it gets strictly cheaper, so the
loop ends. A node whose children's sets already contain its own class would close a
cycle and is skipped.

The final picks can still form a cycle (a class may keep a set computed from an older
best of its child), so the choice is repaired: a class on a cycle falls back to its
tree-cost pick, together with everything that pick needs, which is acyclic.
"""

from __future__ import annotations

import math
from collections import deque

from .base import Extractor, Solution
from .cycles import find_cycle
from .egraph import EGraph
from .result import HEURISTIC
from .tree import choice_from_picks, tree_costs


def greedy_dag_picks(egraph: EGraph, allowed: list[bool] | None = None) -> list[int]:
    """The greedy node of every class (-1 where no finite, cycle-free set exists),
    using only the nodes marked in ``allowed`` if given."""
    cost = egraph.node_cost.tolist()
    if allowed is not None:
        cost = [c if ok else math.inf for c, ok in zip(cost, allowed)]
    child_sets = egraph.child_sets
    node_class = egraph.node_class.tolist()
    parents = egraph.parents
    best_cost = [math.inf] * egraph.n_classes
    best_set: list[dict[int, float] | None] = [None] * egraph.n_classes
    pick = [-1] * egraph.n_classes
    queue = deque(n for n in range(egraph.n_nodes) if not child_sets[n])
    queued = [False] * egraph.n_nodes
    for n in queue:
        queued[n] = True
    while queue:
        node = queue.popleft()
        queued[node] = False
        cls = node_class[node]
        own = cost[node]
        if own >= best_cost[cls]:
            continue
        sets = [best_set[c] for c in child_sets[node]]
        if any(s is None or cls in s for s in sets):
            continue
        union = _union_if_cheaper(sets, best_cost, child_sets[node], cls, own, best_cost[cls])
        if union is None:
            continue
        best_set[cls], best_cost[cls] = union
        pick[cls] = node
        for parent in parents[cls]:
            if not queued[parent]:
                queued[parent] = True
                queue.append(parent)
    return pick


def _union_if_cheaper(sets, best_cost, children, cls, own, bound):
    """(set, cost) of ``{cls: own}`` plus the union of ``sets``, or None if not < bound.

    The largest set is the base; only the smaller ones are walked, and the walk stops
    as soon as the running cost reaches the bound.
    """
    if not sets:
        return ({cls: own}, own)
    big = max(range(len(sets)), key=lambda i: len(sets[i]))
    base = sets[big]
    total = best_cost[children[big]] + own
    if total >= bound:
        return None
    extra: dict[int, float] = {}
    for i, s in enumerate(sets):
        if i == big:
            continue
        for c, v in s.items():
            if c not in base and c not in extra:
                extra[c] = v
                total += v
        if total >= bound:
            return None
    union = dict(base)
    union.update(extra)
    union[cls] = own
    return (union, total)


def acyclic_choice(egraph: EGraph, pick: list[int], roots: tuple[int, ...]) -> dict[int, int]:
    """The picks as a choice, with classes on a cycle switched to their tree picks."""
    _, tree_pick = tree_costs(egraph)
    choice = choice_from_picks(egraph, pick, roots, "DAG")
    switched: set[int] = set()
    while (cycle := find_cycle(egraph.child_sets, choice, roots)) is not None:
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
        return Solution(acyclic_choice(egraph, greedy_dag_picks(egraph), roots), HEURISTIC)
