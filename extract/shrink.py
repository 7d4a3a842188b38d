"""Remove nodes that no optimal extraction needs, before handing the rest to a solver.

Every rule keeps at least one optimal solution (or the incumbent, for the bound rule):
- a class not reachable from the roots through kept nodes is never paid for;
- a node with its own class among its children is a cycle by itself;
- a node costing more than a known solution on its own cannot be in a better one;
- a node is dominated by another node of its class that costs no more and needs a
  subset of its child classes: swapping them keeps a solution complete and acyclic
  (no new edges) and no dearer. With absorption (egraph.py) "no more" compares the
  other's full cost with the node's least (``low_cost``), and the other must absorb
  every child node the node absorbs, so that the swap frees no child of its waiver;
- a node that cannot be grounded (a child class with no kept node, or only nodes that
  lead back into cycles) can never be completed;
- a node whose children all need its own class (bounds.Necessity) closes a cycle in
  every completion, X = split1(split(concat(Y, X))) for one.
Nodes listed in ``protect`` (a known solution, used as the solver's warm start) stay.

With negative costs neither the bound rule nor domination holds (a dropped child
class may have held a negative node), so only the other rules run. Past ``deadline``
shrinking stops where it is: every rule only removes nodes, so the set kept so far
still holds an optimal solution.

Besides the nodes, shrinking reports the classes that every extraction from the kept
nodes uses (bounds.Necessity.required): the ILP makes their rows equalities.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

from .bounds import Necessity, grounding
from .egraph import EGraph


class Shrunk(NamedTuple):
    nodes: list[int]  # the kept nodes, in increasing order
    required: frozenset[int]  # classes every extraction of the roots from them uses


def shrink(
    egraph: EGraph, roots: tuple[int, ...], upper_bound: float, protect: frozenset[int] = frozenset(),
    deadline: float | None = None,
) -> Shrunk:
    cost = egraph.node_cost
    low = egraph.low_cost
    child_sets = egraph.child_sets
    node_class = egraph.node_class.tolist()
    negative = bool((cost < 0).any())
    if negative:
        upper_bound = math.inf
    alive = [
        n in protect or (low[n] <= upper_bound and node_class[n] not in child_sets[n])
        for n in range(egraph.n_nodes)
    ]

    def late() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    if not negative:
        for i, members in enumerate(egraph.class_nodes):
            if i % 1024 == 0 and late():
                break
            _drop_dominated(egraph, members, alive, protect)
    _settle(egraph, roots, alive, late)
    necessity = Necessity(egraph, alive, deadline)
    cyclic = [n for n in range(egraph.n_nodes) if alive[n] and n not in protect and necessity.cyclic(n)]
    if cyclic:
        for n in cyclic:
            alive[n] = False
        # Needs computed on more nodes stay sound on fewer (fewer ways, more needed).
        _settle(egraph, roots, alive, late)
    required = frozenset(c for c in necessity.required(roots) if any(alive[n] for n in egraph.class_nodes[c]))
    return Shrunk([n for n in range(egraph.n_nodes) if alive[n]], required)


def _settle(egraph: EGraph, roots: tuple[int, ...], alive: list[bool], late) -> None:
    while not late():
        before = sum(alive)
        _keep_groundable(egraph, alive)
        _keep_reachable(egraph, roots, alive)
        if sum(alive) == before:
            break


def _drop_dominated(egraph: EGraph, members, alive, protect) -> None:
    cost, low, child_sets = egraph.node_cost, egraph.low_cost, egraph.child_sets
    # Sorted by least cost then fewer children, a node can only be dominated by an
    # earlier one (without absorption, the cost test below always holds for those).
    live = sorted((n for n in members if alive[n]), key=lambda n: (low[n], len(child_sets[n]), n))
    kept: list[tuple[int, frozenset]] = []
    for n in live:
        children = frozenset(child_sets[n])
        if n not in protect and any(cost[m] <= low[n] and kids <= children and _keeps_waivers(egraph, m, n)
                                    for m, kids in kept):
            alive[n] = False
        else:
            kept.append((n, children))


def _keeps_waivers(egraph: EGraph, m: int, n: int) -> bool:
    """Whether ``m``, in ``n``'s place, absorbs every node of its child classes that
    ``n`` absorbs."""
    if not egraph.absorbers:
        return True
    return all(m in egraph.absorbers[k] for d in egraph.child_sets[m] for k in egraph.class_nodes[d]
               if n in egraph.absorbers.get(k, ()))


def _keep_groundable(egraph: EGraph, alive: list[bool]) -> None:
    _, missing = grounding(egraph, alive)
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
