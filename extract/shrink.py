"""Remove nodes that no optimal extraction needs, before handing the rest to a solver.

Every rule keeps at least one optimal solution (or the incumbent, for the bound rule):
- a class not reachable from the roots through kept nodes is never paid for;
- a node with its own class among its children is a cycle by itself;
- a node costing more than a known solution on its own cannot be in a better one;
- a node is dominated by another node of its class that costs no more and needs a
  subset of its child classes: swapping them keeps a solution complete and acyclic
  (no new edges) and no dearer;
- a node with a child class that has no kept node left can never be completed.
"""

from __future__ import annotations

from .egraph import EGraph


def shrink(egraph: EGraph, roots: tuple[int, ...], upper_bound: float) -> list[int]:
    """Indices of the nodes to keep, in increasing order."""
    cost = egraph.node_cost
    child_sets = egraph.child_sets
    node_class = egraph.node_class
    alive = [
        cost[n] <= upper_bound and node_class[n] not in child_sets[n]
        for n in range(egraph.n_nodes)
    ]
    for members in egraph.class_nodes:
        _drop_dominated(members, alive, cost, child_sets)
    while True:
        before = sum(alive)
        _drop_incompletable(egraph, alive)
        _keep_reachable(egraph, roots, alive)
        if sum(alive) == before:
            return [n for n in range(egraph.n_nodes) if alive[n]]


def _drop_dominated(members, alive, cost, child_sets) -> None:
    # Sorted by cost then fewer children, a node can only be dominated by an earlier one.
    live = sorted((n for n in members if alive[n]), key=lambda n: (cost[n], len(child_sets[n]), n))
    kept: list[tuple[int, frozenset]] = []
    for n in live:
        children = frozenset(child_sets[n])
        if any(kids <= children for _, kids in kept):
            alive[n] = False
        else:
            kept.append((n, children))


def _drop_incompletable(egraph: EGraph, alive: list[bool]) -> None:
    count = [0] * egraph.n_classes
    for n in range(egraph.n_nodes):
        if alive[n]:
            count[egraph.node_class[n]] += 1
    empty = [c for c in range(egraph.n_classes) if count[c] == 0]
    while empty:
        cls = empty.pop()
        for user in egraph.parents[cls]:
            if alive[user]:
                alive[user] = False
                owner = egraph.node_class[user]
                count[owner] -= 1
                if count[owner] == 0:
                    empty.append(owner)


def _keep_reachable(egraph: EGraph, roots: tuple[int, ...], alive: list[bool]) -> None:
    seen = set(roots)
    stack = list(roots)
    while stack:
        for n in egraph.class_nodes[stack.pop()]:
            if alive[n]:
                for child in egraph.child_sets[n]:
                    if child not in seen:
                        seen.add(child)
                        stack.append(child)
    for n in range(egraph.n_nodes):
        if alive[n] and egraph.node_class[n] not in seen:
            alive[n] = False
