"""A graph pattern matcher compiled from the rule language (``rules/lang.py``): the
same rules the e-graph saturates with, found in one concrete graph.

A pattern is matched top-down from a root node: an operator pattern fixes the node
behind each of its inputs, so one root gives at most one match and no backtracking is
needed. A multi-pattern rule matches its first pattern, then tries every root for the
second one with the first's bindings in force (shared variables must bind the same
tensor, shared parameter variables equal values). When the second pattern's root
reads a tensor the first pattern bound, only that tensor's users are tried.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from taso_egg.errors import RuleError
from taso_egg.graph import Graph, Node, Tensor
from taso_egg.rules.instantiate import compare, evaluate_param
from taso_egg.rules.lang import App, Guard, Proj, Rule, Var, guard_vars, walk_vars


class GraphIndex:
    """What matching and rewriting need to know about one graph, computed once: nodes
    by operator, users of each tensor, use counts (edges plus graph outputs), a
    topological order and ranks, weight-only nodes and their weight-id ranges."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.by_op: dict[str, list[int]] = {}
        self.users: dict[tuple[int, int], list[int]] = {}
        self.use_count: dict[int, int] = dict.fromkeys(graph.nodes, 0)
        self.order = order = graph.topo_order()
        self.rank = {n.id: i for i, n in enumerate(order)}
        for n in order:
            self.by_op.setdefault(n.op, []).append(n.id)
            for t in n.inputs:
                users = self.users.setdefault((t.node, t.index), [])
                if n.id not in users:
                    users.append(n.id)
                self.use_count[t.node] += 1
        for _, t in graph.outputs:
            self.use_count[t.node] += 1
        for ids in self.by_op.values():
            ids.sort()
        self.weight_only = graph.weight_only_nodes()
        # (smallest, largest) weight node id a weight-only node is computed from: the
        # order `(before a b)` compares, as the e-graph's wlo/whi analyses do.
        self.weight_range: dict[int, tuple[int, int]] = {}
        for n in order:
            if n.op == "weight":
                self.weight_range[n.id] = (n.id, n.id)
            elif n.id in self.weight_only and n.inputs:
                ranges = [self.weight_range.get(t.node) for t in n.inputs]
                if all(r is not None for r in ranges):
                    self.weight_range[n.id] = (min(r[0] for r in ranges), max(r[1] for r in ranges))


@dataclass(frozen=True)
class Match:
    """One place a rule applies. ``roots[i]`` is the tensor ``rule.lhs[i]`` matched;
    ``nodes`` are the operator nodes the lhs patterns cover."""

    rule: Rule
    roots: tuple[Tensor, ...]
    tensors: dict[str, Tensor]
    params: dict[str, Any]
    nodes: frozenset[int]


class _Binding:
    __slots__ = ("nodes", "params", "tensors")

    def __init__(self, tensors=None, params=None, nodes=None):
        self.tensors: dict[str, Tensor] = tensors or {}
        self.params: dict[str, Any] = params or {}
        self.nodes: set[int] = nodes or set()

    def copy(self) -> _Binding:
        return _Binding(dict(self.tensors), dict(self.params), set(self.nodes))


class RuleMatcher:
    """One rule compiled for matching: root operators, the guards that can be checked
    after each pattern, and the anchor variable of a multi rule's second pattern."""

    def __init__(self, rule: Rule):
        self.rule = rule
        self.roots = [_root_app(p) for p in rule.lhs]
        bound: set[str] = set()
        self.guards_after: list[list[Guard]] = []
        for pattern in rule.lhs:
            bound |= {name for name, _ in walk_vars(pattern)}
            ready = [g for g in rule.guards if {n for n, _ in guard_vars(g)} <= bound
                     and not any(g in done for done in self.guards_after)]
            self.guards_after.append(ready)
        self.anchor: str | None = None
        if rule.multi:
            first = {name for name, _ in walk_vars(rule.lhs[0])}
            direct = [t.name for t in self.roots[1].inputs if isinstance(t, Var)]
            self.anchor = next((v for v in direct if v in first), None)
        self.rhs_tensor_vars = sorted({name for p in rule.rhs for name, kind in walk_vars(p)
                                       if kind == "tensor"})

    def matches(self, index: GraphIndex) -> Iterator[Match]:
        """Every match in ``index.graph``, in a deterministic order (by root node id)."""
        graph = index.graph
        for root in self._root_tensors(index, 0, None):
            first = _Binding()
            if not (self._tensor(self.rule.lhs[0], root, first, graph)
                    and self._guards(0, first, index)):
                continue
            if not self.rule.multi:
                yield self._match((root,), first)
                continue
            for root2 in self._root_tensors(index, 1, first):
                if root2 == root:
                    continue
                both = first.copy()
                if self._tensor(self.rule.lhs[1], root2, both, graph) and self._guards(1, both, index):
                    yield self._match((root, root2), both)

    def _match(self, roots, b: _Binding) -> Match:
        return Match(self.rule, roots, b.tensors, b.params, frozenset(b.nodes))

    def _root_tensors(self, index: GraphIndex, i: int, bound: _Binding | None) -> Iterator[Tensor]:
        pattern, app = self.rule.lhs[i], self.roots[i]
        out = pattern.index if isinstance(pattern, Proj) else 0
        if bound is not None and self.anchor is not None:
            t = bound.tensors[self.anchor]
            ids = [u for u in index.users.get((t.node, t.index), ()) if index.graph.nodes[u].op == app.op]
            ids.sort()
        else:
            ids = index.by_op.get(app.op, ())
        for nid in ids:
            node = index.graph.nodes[nid]
            if out < len(node.outputs):
                yield node.out(out)

    # -- structure --

    def _tensor(self, pattern, t: Tensor, b: _Binding, graph: Graph) -> bool:
        if isinstance(pattern, Var):
            seen = b.tensors.get(pattern.name)
            if seen is None:
                b.tensors[pattern.name] = t
                return True
            return seen == t
        if isinstance(pattern, Proj):
            return t.index == pattern.index and self._app(pattern.pattern, graph.nodes[t.node], b, graph)
        return t.index == 0 and self._app(pattern, graph.nodes[t.node], b, graph)

    def _app(self, app: App, node: Node, b: _Binding, graph: Graph) -> bool:
        if node.op != app.op or len(node.inputs) != len(app.inputs):
            return False
        for name, expr in app.param_dict().items():
            value = node.params[name]
            if isinstance(expr, Var):
                if expr.name in b.params:
                    if not _same_value(b.params[expr.name], value):
                        return False
                else:
                    b.params[expr.name] = value
            elif not _same_value(expr.value, value):
                return False
        b.nodes.add(node.id)
        return all(self._tensor(p, t, b, graph) for p, t in zip(app.inputs, node.inputs))

    # -- guards --

    def _guards(self, i: int, b: _Binding, index: GraphIndex) -> bool:
        return all(self._guard(g, b, index) for g in self.guards_after[i])

    def _guard(self, g: Guard, b: _Binding, index: GraphIndex) -> bool:
        if g.kind == "weight":
            return b.tensors[g.args[0].name].node in index.weight_only
        if g.kind == "before":
            a, c = (index.weight_range.get(b.tensors[v.name].node) for v in g.args)
            return a is not None and c is not None and a[1] < c[0]
        try:
            shape_of = lambda name: b.tensors[name].shape
            x, y = (evaluate_param(e, b.params, shape_of, self.rule.where) for e in g.args)
            return compare(g.kind, x, y)
        except (RuleError, TypeError):
            return False  # a guard that cannot be evaluated on this match does not hold


def _root_app(pattern) -> App:
    return pattern.pattern if isinstance(pattern, Proj) else pattern


def _same_value(a, b) -> bool:
    """Parameter equality; a vector never equals a scalar."""
    return isinstance(a, tuple) == isinstance(b, tuple) and a == b


def compile_rules(rules) -> list[RuleMatcher]:
    """Matchers for ``rules`` (every rule's operators must be in the table)."""
    return [RuleMatcher(r) for r in rules]


def find_matches(graph: Graph | GraphIndex, matchers) -> Iterator[Match]:
    """Every match of every matcher, rule by rule."""
    index = graph if isinstance(graph, GraphIndex) else GraphIndex(graph)
    for m in matchers:
        yield from m.matches(index)


__all__ = ["GraphIndex", "Match", "RuleMatcher", "compile_rules", "find_matches"]
