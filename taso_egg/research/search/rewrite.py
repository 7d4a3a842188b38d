"""Apply a match: build the rhs, point the users of each replaced tensor at its
replacement, drop what became dead.

Graphs the search has seen are never modified. A rewrite makes a shallow copy (the
node table is copied, ``Node`` objects are shared) and replaces only the nodes whose
inputs change, so a rewrite costs O(nodes) dict copying plus the work on the nodes it
touches.
"""

from __future__ import annotations

from dataclasses import dataclass

from taso_egg.errors import RuleError
from taso_egg.graph import Graph, Node, Tensor
from taso_egg.ops import INPUT, OPS
from taso_egg.rules.instantiate import PatternBuilder
from taso_egg.rules.ast import walk_vars

from .matcher import GraphIndex, Match


class Rejected(Exception):
    """A match that cannot be applied; ``reason`` is ``"cycle"`` or ``"shape"``."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Rewrite:
    """The rewritten graph and what changed: ``added`` new node ids that survive,
    ``removed`` nodes of the original that are gone, ``redirected`` surviving nodes of
    the original whose inputs now read a replacement, ``added_weight_only`` the added
    nodes computed from weights alone, and whether a replaced tensor changed between
    weight-only and not (then weight-only status may change downstream)."""

    graph: Graph
    added: list[int]
    removed: list[Node]
    redirected: list[int]
    added_weight_only: set[int]
    weight_status_changed: bool


def creates_cycle(index: GraphIndex, match: Match, rhs_vars) -> bool:
    """Whether a tensor the rhs reads is computed from one of the replaced roots: the
    users of that root would then feed their own input. Only multi rules can do this;
    a single pattern's variables all lie above its root."""
    if not match.rule.multi:
        return False
    roots = {t.node for t in match.roots}
    targets = {match.tensors[v].node for v in rhs_vars}
    if roots & targets:
        return True
    lowest = min(index.rank[r] for r in roots)
    targets = {t for t in targets if index.rank[t] > lowest}
    if not targets:
        return False
    limit = max(index.rank[t] for t in targets)
    stack, seen = list(roots), set(roots)
    nodes = index.graph.nodes
    while stack:
        nid = stack.pop()
        for i in range(len(nodes[nid].outputs)):
            for u in index.users.get((nid, i), ()):
                if u in targets:
                    return True
                if u not in seen and index.rank[u] < limit:
                    seen.add(u)
                    stack.append(u)
    return False


def apply_match(index: GraphIndex, match: Match, rhs_vars=None) -> Rewrite:
    """Rewrite ``index.graph`` at ``match``; Rejected when the result would have a
    cycle or the rhs does not type-check (or changes a replaced tensor's type)."""
    rule = match.rule
    if rhs_vars is None:
        rhs_vars = sorted({n for p in rule.rhs for n, k in walk_vars(p) if k == "tensor"})
    if creates_cycle(index, match, rhs_vars):
        raise Rejected("cycle", rule.name)
    parent = index.graph
    graph = parent.copy()
    first_new = graph.next_id
    builder = PatternBuilder(rule, match.params, graph, match.tensors)
    try:
        new = [builder.tensor(p) for p in rule.rhs]
    except RuleError as err:
        raise Rejected("shape", str(err)) from None
    for old, t in zip(match.roots, new):
        if t.type != old.type:
            raise Rejected("shape", f"{rule.name}: rhs gives {t.type}, lhs was {old.type}")

    # Weight-only status of the new nodes, from their inputs.
    added_wo: set[int] = set()
    for nid in range(first_new, graph.next_id):
        n = graph.nodes[nid]
        spec = OPS[n.op]
        if spec.is_constant or (n.inputs and all(
                t.node in added_wo or (t.node < first_new and t.node in index.weight_only)
                for t in n.inputs)):
            added_wo.add(nid)

    def weight_only(t: Tensor) -> bool:
        return t.node in added_wo if t.node >= first_new else t.node in index.weight_only

    delta: dict[int, int] = {}  # use-count changes against index.use_count
    for nid in range(first_new, graph.next_id):
        for t in graph.nodes[nid].inputs:
            delta[t.node] = delta.get(t.node, 0) + 1
    status_changed = False
    redirected: list[int] = []
    for old, t in zip(match.roots, new):
        if old == t:
            continue
        status_changed |= weight_only(old) != weight_only(t)
        for uid in index.users.get((old.node, old.index), ()):
            user = graph.nodes[uid]
            hits = sum(1 for x in user.inputs if x == old)
            inputs = tuple(t if x == old else x for x in user.inputs)
            graph.nodes[uid] = Node(uid, user.op, user.params, inputs, user.outputs, user.name)
            redirected.append(uid)
            delta[old.node] = delta.get(old.node, 0) - hits
            delta[t.node] = delta.get(t.node, 0) + hits
        hits = graph.redirect_output(old, t)
        delta[old.node] = delta.get(old.node, 0) - hits
        delta[t.node] = delta.get(t.node, 0) + hits

    removed: list[Node] = []
    work = [nid for nid, d in delta.items() if d < 0] + list(range(first_new, graph.next_id))
    while work:
        nid = work.pop()
        node = graph.nodes.get(nid)
        if node is None or node.op == INPUT.name or index.use_count.get(nid, 0) + delta.get(nid, 0) > 0:
            continue
        del graph.nodes[nid]
        if nid < first_new:
            removed.append(parent.nodes[nid])
            graph.weight_data.pop(nid, None)
        for t in node.inputs:
            delta[t.node] = delta.get(t.node, 0) - 1
            work.append(t.node)
    added = [nid for nid in range(first_new, graph.next_id) if nid in graph.nodes]
    redirected = sorted({uid for uid in redirected if uid in graph.nodes})
    return Rewrite(graph, added, removed, redirected, added_wo & set(added), status_changed)


__all__ = ["Rejected", "Rewrite", "apply_match", "creates_cycle"]
