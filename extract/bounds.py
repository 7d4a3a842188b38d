"""What every acyclic extraction must contain, and the lower bounds that follows.

The LP relaxation of the DAG-cost model is weak on Tensat's e-graphs for two reasons
(measured on vgg, resnet50 and bert):
- A class whose nodes read different child classes (a conv output that is also
  split_i(split(concat(...))) of several merged results) may take a fraction of each
  node, and each child then needs only that fraction: the mass spreads and shrinks
  level by level (vgg: LP 0.216 for an optimum of 4.851; resnet50: 0.044 for 4.386).
- Cycles: without the order rows a class can hold itself up through
  X = split1(split(concat(Y, X))), and the big-M order rows relax to nothing (the
  same LP value with and without them); the integer model without them is 1.43 on vgg.

Two facts that hold for every *acyclic* derivation and are cheap to compute:

``necessary``: for each class c, a set N(c) of classes that every acyclic derivation
of c contains (c itself, and for every usable node of c, the union of N over its
children: the intersection over the nodes). It is the least fixpoint of those
equations, reached by a worklist from empty sets; every intermediate state is below
it, so a run cut short by the deadline is still sound, only weaker. Consequences:
- a node whose children need its own class can never be chosen (it generalises the
  self-loop rule: X = split1(split(concat(Y, X))) needs X below X);
- every class in N(root) is used by every extraction: its row becomes "= 1", which
  stops the spreading above (resnet50: LP 0.044 -> 4.375).

``path_bound``: the least, over acyclic derivations, of the costliest root-to-leaf
path (Knuth's generalisation of Dijkstra to "own cost + max over children"). Every
path of a DAG visits each node once, so with costs >= 0 it is a lower bound on the
DAG cost. On chain-like networks it is nearly the whole cost (vgg: 4.8508, equal to
greedy's answer, so optimality is proven without a MIP); where work runs in
parallel (bert's attention heads) it is weak, and the MIP's bound is the better one.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from collections.abc import Sequence

from .egraph import EGraph

CHECK_EVERY = 1024  # worklist steps between looks at the clock


class Necessity:
    """``needs[c]``: bitset (a Python int) of classes every acyclic derivation of class
    c contains; ``node_needs[n]``: the same for node n's children together."""

    def __init__(self, egraph: EGraph, alive: Sequence[bool], deadline: float | None = None):
        needs = [0] * egraph.n_classes
        node_needs = [0] * egraph.n_nodes
        child_sets = egraph.child_sets
        node_class = egraph.node_class.tolist()
        live = [[n for n in members if alive[n]] for members in egraph.class_nodes]
        # Children first (the order in which classes can be grounded): each class then
        # sees its children's final sets on its first visit, mostly (NasRNN: 6x fewer steps).
        grounded, _ = grounding(egraph, alive)
        seen = set(grounded)
        work = [c for c in range(egraph.n_classes) if live[c] and c not in seen]
        work += [c for c in reversed(grounded) if live[c]]
        queued = [False] * egraph.n_classes
        for c in work:
            queued[c] = True
        steps = 0
        while work:
            steps += 1
            if steps % CHECK_EVERY == 0 and deadline is not None and time.perf_counter() > deadline:
                break  # sound as it stands (see the module docstring)
            cls = work.pop()
            queued[cls] = False
            common = None
            for n in live[cls]:
                below = 0
                for d in child_sets[n]:
                    below |= needs[d]
                node_needs[n] = below
                if not (below >> cls) & 1:  # a node that needs its own class adds no way
                    common = below if common is None else common & below
            new = (1 << cls) | (common or 0)
            if new != needs[cls]:
                needs[cls] = new
                for p in egraph.parents[cls]:
                    pc = node_class[p]
                    if alive[p] and not queued[pc]:
                        queued[pc] = True
                        work.append(pc)
        self.needs, self.node_needs = needs, node_needs
        self._node_class = node_class

    def cyclic(self, node: int) -> bool:
        """Whether every completion of ``node`` needs its own class (so it is never chosen)."""
        return bool((self.node_needs[node] >> self._node_class[node]) & 1)

    def required(self, roots: tuple[int, ...]) -> frozenset[int]:
        """Classes that every extraction of ``roots`` uses (the roots included)."""
        bits = 0
        for r in roots:
            bits |= self.needs[r]
        return frozenset(_members(bits))


def grounding(egraph: EGraph, alive: Sequence[bool]) -> tuple[list[int], list[int]]:
    """The least fixpoint of groundedness over the ``alive`` nodes: the classes in the
    order they get a derivation from the leaves up (breadth first), and for each node
    how many of its child classes never do (0: the node is groundable)."""
    missing = [len(children) for children in egraph.child_sets]
    node_class = egraph.node_class.tolist()
    done = [False] * egraph.n_classes
    ready = deque(n for n in range(egraph.n_nodes) if alive[n] and not missing[n])
    order = []
    while ready:
        c = node_class[ready.popleft()]
        if done[c]:
            continue
        done[c] = True
        order.append(c)
        for p in egraph.parents[c]:
            missing[p] -= 1
            if not missing[p] and alive[p]:
                ready.append(p)
    return order, missing


def _members(bits: int) -> list[int]:
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


def path_bound(
    egraph: EGraph, alive: Sequence[bool], roots: tuple[int, ...], deadline: float | None = None
) -> float | None:
    """A lower bound on the DAG cost of any extraction of ``roots`` from the ``alive``
    nodes: the largest, over the roots, of the least costliest-path value (see the
    module docstring). None where a cost is negative (a path is then no bound), a
    root has no acyclic derivation, or the deadline passed first."""
    cost = egraph.low_cost  # an absorbed node is free on the path
    if (cost < 0).any():
        return None
    cost = cost.tolist()
    child_sets = egraph.child_sets
    node_class = egraph.node_class.tolist()
    value = [math.inf] * egraph.n_classes
    missing = [len(child_sets[n]) for n in range(egraph.n_nodes)]
    heap = [(cost[n], n) for n in range(egraph.n_nodes) if alive[n] and not missing[n]]
    heapq.heapify(heap)
    steps = 0
    while heap:
        steps += 1
        if steps % CHECK_EVERY == 0 and deadline is not None and time.perf_counter() > deadline:
            return None  # an unsettled root's value is not yet its least
        v, n = heapq.heappop(heap)
        cls = node_class[n]
        if value[cls] < math.inf:
            continue  # settled: a class's first value out of the heap is its least
        value[cls] = v
        for p in egraph.parents[cls]:
            missing[p] -= 1
            if missing[p] == 0 and alive[p]:
                heapq.heappush(heap, (cost[p] + max(value[d] for d in child_sets[p]), p))
    bound = max(value[r] for r in roots)
    return None if math.isinf(bound) else bound
