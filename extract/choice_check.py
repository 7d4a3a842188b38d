"""Independent validation of a choice: complete, acyclic, and its DAG cost.

Written against the loaded e-graph only, so it shares no code with the extractors it
checks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..errors import ExtractionError
from .egraph import EGraph


def used_classes(egraph: EGraph, choice: Mapping[int, int], roots: Iterable[int] | None = None) -> list[int]:
    """Classes reachable from the roots through chosen nodes, children before parents.

    Raises ExtractionError if a reachable class has no choice, a chosen node belongs to
    another class, or the chosen nodes form a cycle.
    """
    roots = egraph.roots if roots is None else tuple(roots)
    src = egraph.source
    on_path, done = set(), set()
    order: list[int] = []
    for root in roots:
        if root in done:
            continue
        # Iterative DFS: (class, iterator over its chosen node's child classes).
        stack = [(root, iter(_children(egraph, choice, root)))]
        on_path.add(root)
        while stack:
            cls, it = stack[-1]
            child = next(it, None)
            if child is None:
                stack.pop()
                on_path.discard(cls)
                done.add(cls)
                order.append(cls)
            elif child in on_path:
                path = [c for c, _ in stack]
                cycle = path[path.index(child):] + [child]
                names = " -> ".join(egraph.class_ids[c] for c in cycle)
                raise ExtractionError(f"{src}: choice is cyclic: e-class {names}")
            elif child not in done:
                stack.append((child, iter(_children(egraph, choice, child))))
                on_path.add(child)
    return order


def check_choice(egraph: EGraph, choice: Mapping[int, int], roots: Iterable[int] | None = None) -> float:
    """DAG cost of a valid choice: every chosen node reachable from the roots, paid
    once, except absorbed ones (a non-root class whose chosen users all absorb its
    chosen node; see egraph.py)."""
    roots = egraph.roots if roots is None else tuple(roots)
    classes = used_classes(egraph, choice, roots)
    waived = absorbed_classes(egraph, choice, classes, roots)
    cost = math.fsum(float(egraph.node_cost[choice[c]]) for c in classes if c not in waived)
    if math.isinf(cost):
        raise ExtractionError(f"{egraph.source}: choice uses a node of infinite cost")
    return cost


def absorbed_classes(egraph: EGraph, choice: Mapping[int, int], classes: Iterable[int],
                     roots: Iterable[int]) -> set[int]:
    """The used ``classes`` whose chosen node is absorbed by all its chosen users."""
    classes = list(classes)
    if not egraph.absorbers:
        return set()
    users: dict[int, set[int]] = {}
    for c in classes:
        node = choice[c]
        for d in egraph.child_sets[node]:
            users.setdefault(d, set()).add(node)
    roots = set(roots)
    out = set()
    for c in classes:
        absorbers = egraph.absorbers.get(choice[c])
        if absorbers and c not in roots and users.get(c) and users[c] <= absorbers:
            out.add(c)
    return out


def _children(egraph: EGraph, choice: Mapping[int, int], cls: int) -> tuple[int, ...]:
    node = choice.get(cls)
    if node is None:
        raise ExtractionError(f"{egraph.source}: e-class {egraph.class_ids[cls]!r} is used but has no chosen node")
    if not 0 <= node < egraph.n_nodes or egraph.node_class[node] != cls:
        raise ExtractionError(
            f"{egraph.source}: e-class {egraph.class_ids[cls]!r} chose node {node}, "
            "which is not one of its nodes"
        )
    return egraph.child_sets[node]
