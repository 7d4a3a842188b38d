"""Bottom-up tree-cost extraction: each class takes its node of least tree cost.

A node's tree cost is its own cost plus the best tree cost of each child class, a
shared child being paid once per use. Classes only ever take a strictly cheaper node,
which makes the resulting choice acyclic: along a chosen cycle every class would have
to have been set after its child, all the way round. That holds at every moment of
the loop, so a run cut short by a deadline still gives a valid (if dearer) choice,
once every root has a pick.

Negative costs: the tree and greedy heuristics run on costs shifted up by the least
one (so the cheapest node costs 0), which keeps them finite and acyclic; the choice
they return is then priced with the true costs. Only the ILP is exact for them.
"""

from __future__ import annotations

import math
import time
from collections import deque

from ..errors import ExtractionError
from .egraph import EGraph
from .extractor import Extractor, Solution
from .result import HEURISTIC


CHECK_EVERY = 1024  # worklist steps between looks at the clock


def heuristic_costs(egraph: EGraph, allowed: list[bool] | None = None) -> list[float]:
    """Node costs for the greedy heuristics: inf where not ``allowed``, shifted up so
    that none is negative (see the module docstring)."""
    cost = egraph.node_cost.tolist()
    low = min((c for c in cost if c < 0), default=0.0)
    if low < 0:
        cost = [c - low for c in cost]
    if allowed is not None:
        cost = [c if ok else math.inf for c, ok in zip(cost, allowed)]
    return cost


def past(deadline: float | None, picks: list[int], roots: tuple[int, ...]) -> bool:
    """Whether a worklist may stop now: the deadline has passed and every root has a pick."""
    return deadline is not None and time.perf_counter() > deadline and all(picks[r] >= 0 for r in roots)


def tree_costs(
    egraph: EGraph, allowed: list[bool] | None = None, deadline: float | None = None, roots: tuple[int, ...] = ()
) -> tuple[list[float], list[int]]:
    """Best tree cost and its node for every class (inf / -1 where none is finite),
    using only the nodes marked in ``allowed`` if given. Past ``deadline`` the loop
    stops as soon as every class in ``roots`` has a pick (the picks are then valid,
    not best)."""
    cost = heuristic_costs(egraph, allowed)
    children = egraph.node_children
    node_class = egraph.node_class.tolist()
    parents = egraph.parents
    best = [math.inf] * egraph.n_classes
    pick = [-1] * egraph.n_classes
    queue = deque(n for n in range(egraph.n_nodes) if not children[n])
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
        total = cost[node]
        for child in children[node]:
            total += best[child]
        cls = node_class[node]
        if total < best[cls]:
            best[cls] = total
            pick[cls] = node
            for parent in parents[cls]:
                if not queued[parent]:
                    queued[parent] = True
                    queue.append(parent)
    return best, pick


def choice_from_picks(egraph: EGraph, pick: list[int], roots: tuple[int, ...], what: str) -> dict[int, int]:
    """Choice over the classes that have a pick; fails if a root has none."""
    for root in roots:
        if pick[root] < 0:
            raise ExtractionError(
                f"{egraph.source}: e-class {egraph.class_ids[root]!r} has no finite {what} extraction"
            )
    return {c: n for c, n in enumerate(pick) if n >= 0}


class TreeExtractor(Extractor):
    name = "tree"

    def solve(self, egraph: EGraph, roots: tuple[int, ...], time_limit: float | None) -> Solution:
        deadline = None if time_limit is None else time.perf_counter() + time_limit
        _, pick = tree_costs(egraph, deadline=deadline, roots=roots)
        return Solution(choice_from_picks(egraph, pick, roots, "tree"), HEURISTIC)
