"""Large-neighbourhood search: re-solve small regions of the incumbent exactly.

The DAG-cost MIP of a large e-graph is too big for HiGHS to solve in seconds, but the
gains in it are local: computations that read the same tensor can share work (two
matmuls of x become one matmul of x with concatenated weights, then a split), and
that choice barely touches the rest of the graph. So, for one *input* class at a time
(a class read by a costly node of the incumbent), a sub-model holds:
- the nodes that read the input (its readers), the ``max_readers`` cheapest by local
  tree cost (own cost plus the tree cost of their other children);
- every node of the classes above those readers through zero-cost nodes (splits,
  views): how a shared result is handed back to the consumers of the old ones;
- every node of the incumbent;
closed so that each class a kept node needs has a node (greedy-DAG and tree picks).
The sub-MIP is warm-started from the incumbent, so it can only improve on it. Inputs
with the most costly readers in the incumbent go first; the search ends when every
input has been tried since the last improvement, when ``patience`` seconds pass
without one, or at the deadline. Improvements come early and in bursts (bert: seven
in the first second, none in the 5 s after; a GPT-2 decode step's 20,000 e-nodes:
none in 295 sub-models over 38 s).

Classes holding a leaf node (weights, inputs, constants) are never inputs: they are
free to compute, read by very many nodes, and reading them shares no work.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from .egraph import EGraph
from .greedy_dag import greedy_dag_picks
from .tree import tree_costs

MAX_READERS = 50  # per input: on bert, 50 reached 0.7047 in 5 s, 200 in 9 s, 1000 never (60 s)
UPWARD_DEPTH = 6  # zero-cost levels above the readers: nested binary splits of a 4-way merge


class NeighbourhoodSearch:
    """Sub-models of one e-graph restricted to ``nodes`` (the shrunk node set)."""

    def __init__(
        self, egraph: EGraph, nodes: list[int], max_readers: int = MAX_READERS, deadline: float | None = None
    ):
        """``deadline``: the tree and greedy-DAG picks that close sub-models stop there
        (they are then valid, not best: a sub-model may hold dearer nodes than it could)."""
        self.egraph = egraph
        self.max_readers = max_readers
        self.allowed = [False] * egraph.n_nodes
        for n in nodes:
            self.allowed[n] = True
        self.tree_cost, tree_pick = tree_costs(egraph, self.allowed, deadline)
        self.picks = (tree_pick, greedy_dag_picks(egraph, self.allowed, deadline))
        self.has_leaf = [any(not egraph.child_sets[n] for n in members) for members in egraph.class_nodes]

    def run(self, best, solve: Callable[[list[int]], None], deadline: float,
            stop: Callable[[], bool] | None = None, patience: float = math.inf) -> int:
        """Improve ``best`` (an incumbent: ``.choice``, ``.cost``, updated by ``solve``)
        until no input is left, the deadline passes, ``patience`` seconds pass without
        an improvement or ``stop()`` says the incumbent is good enough; returns the
        sub-models solved."""
        tried: set[int] = set()
        solved = 0
        last_gain = time.perf_counter()
        while time.perf_counter() < min(deadline, last_gain + patience) and not (stop is not None and stop()):
            cost_before = best.cost
            target = self._next_input(best.choice, tried)
            if target is None:
                break
            tried.add(target)
            solve(self.close(self.region(target) | set(best.choice.values())))
            solved += 1
            if best.cost < cost_before:
                tried = {target}  # the incumbent changed: every other input is worth a retry
                last_gain = time.perf_counter()
        return solved

    def _next_input(self, choice: dict[int, int], tried: set[int]) -> int | None:
        """The untried input class whose costly readers in ``choice`` cost most, those
        read by two or more first (sharing needs two consumers)."""
        g = self.egraph
        readers: dict[int, list[float]] = defaultdict(list)
        for node in choice.values():
            cost = float(g.node_cost[node])
            if cost > 0:
                for cls in g.child_sets[node]:
                    if not self.has_leaf[cls] and cls not in tried:
                        readers[cls].append(cost)
        if not readers:
            return None
        return max(readers, key=lambda c: (len(readers[c]) >= 2, sum(readers[c]), -c))

    def region(self, target: int) -> set[int]:
        """The nodes the sub-model for input class ``target`` may re-choose."""
        g = self.egraph

        def local_cost(node: int) -> float:
            return float(g.node_cost[node]) + sum(self.tree_cost[d] for d in g.child_sets[node] if d != target)

        readers = sorted((n for n in g.parents[target] if self.allowed[n]), key=local_cost)
        frontier = {int(g.node_class[n]) for n in readers[: self.max_readers]}
        classes = set(frontier)
        for _ in range(UPWARD_DEPTH):
            above = {
                int(g.node_class[p])
                for cls in frontier
                for p in g.parents[cls]
                if self.allowed[p] and g.node_cost[p] == 0
            }
            frontier = above - classes
            classes |= frontier
        return {n for cls in classes for n in g.class_nodes[cls] if self.allowed[n]}

    def close(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` plus the greedy-DAG and tree picks of every class they touch or
        need, recursively: every class a kept node needs then has a kept node."""
        g = self.egraph
        keep = set(nodes)
        have: set[int] = set()
        stack = [int(g.node_class[n]) for n in keep]
        while stack:
            cls = stack.pop()
            if cls in have:
                continue
            have.add(cls)
            keep.update(p[cls] for p in self.picks if p[cls] >= 0)
            stack.extend(d for n in g.class_nodes[cls] if n in keep for d in g.child_sets[n])
        return sorted(keep)
