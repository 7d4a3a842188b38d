"""Remove nodes that no optimal extraction needs, before handing the rest to a solver.

Every rule keeps at least one optimal solution (or the incumbent, for the bound rule):
- a class not reachable from the roots through kept nodes is never paid for;
- a node with its own class among its children is a cycle by itself;
- a node costing more than a known solution on its own cannot be in a better one;
- a node is dominated by another node of its class that costs no more and needs a
  subset of its child classes: swapping them keeps a solution complete and acyclic
  (no new edges) and no dearer;
- a node that cannot be grounded (a child class with no kept node, or only nodes that
  lead back into cycles) can never be completed.
Nodes listed in ``protect`` (a known solution, used as the solver's warm start) stay.
"""

from __future__ import annotations

from .egraph import EGraph


def shrink(
    egraph: EGraph, roots: tuple[int, ...], upper_bound: float, protect: frozenset[int] = frozenset()
) -> list[int]:
    """Indices of the nodes to keep, in increasing order."""
    cost = egraph.node_cost
    child_sets = egraph.child_sets
    node_class = egraph.node_class.tolist()
    alive = [
        n in protect or (cost[n] <= upper_bound and node_class[n] not in child_sets[n])
        for n in range(egraph.n_nodes)
    ]
    for members in egraph.class_nodes:
        _drop_dominated(members, alive, cost, child_sets, protect)
    while True:
        before = sum(alive)
        _keep_groundable(egraph, alive)
        _keep_reachable(egraph, roots, alive)
        if sum(alive) == before:
            return [n for n in range(egraph.n_nodes) if alive[n]]


def _drop_dominated(members, alive, cost, child_sets, protect) -> None:
    # Sorted by cost then fewer children, a node can only be dominated by an earlier one.
    live = sorted((n for n in members if alive[n]), key=lambda n: (cost[n], len(child_sets[n]), n))
    kept: list[frozenset] = []
    for n in live:
        children = frozenset(child_sets[n])
        if n not in protect and any(kids <= children for kids in kept):
            alive[n] = False
        else:
            kept.append(children)


def _keep_groundable(egraph: EGraph, alive: list[bool]) -> None:
    # Least fixpoint: a class is grounded once one of its nodes has all children grounded.
    missing = [len(egraph.child_sets[n]) for n in range(egraph.n_nodes)]
    grounded = [False] * egraph.n_classes
    ready = [n for n in range(egraph.n_nodes) if alive[n] and missing[n] == 0]
    while ready:
        cls = egraph.node_class[ready.pop()]
        if grounded[cls]:
            continue
        grounded[cls] = True
        for user in egraph.parents[cls]:
            missing[user] -= 1
            if missing[user] == 0 and alive[user]:
                ready.append(user)
    for n in range(egraph.n_nodes):
        if alive[n] and missing[n] > 0:
            alive[n] = False


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
