"""Bottom-up tree-cost extraction: each class takes its node of least tree cost.

A node's tree cost is its own cost plus the best tree cost of each child class, a
shared child being paid once per use. Classes only ever take a strictly cheaper node,
which makes the resulting choice acyclic: along a chosen cycle every class would have
to have been set after its child, all the way round.
"""

from __future__ import annotations

import math
from collections import deque

from ..errors import ExtractionError
from .base import Extractor, Solution
from .egraph import EGraph
from .result import HEURISTIC


def tree_costs(egraph: EGraph, allowed: list[bool] | None = None) -> tuple[list[float], list[int]]:
    """Best tree cost and its node for every class (inf / -1 where none is finite),
    using only the nodes marked in ``allowed`` if given."""
    cost = egraph.node_cost.tolist()
    if allowed is not None:
        cost = [c if ok else math.inf for c, ok in zip(cost, allowed)]
    children = egraph.node_children
    node_class = egraph.node_class.tolist()
    parents = egraph.parents
    best = [math.inf] * egraph.n_classes
    pick = [-1] * egraph.n_classes
    queue = deque(n for n in range(egraph.n_nodes) if not children[n])
    queued = [False] * egraph.n_nodes
    for n in queue:
        queued[n] = True
    while queue:
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
        _, pick = tree_costs(egraph)
        return Solution(choice_from_picks(egraph, pick, roots, "tree"), HEURISTIC)
