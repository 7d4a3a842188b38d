"""A graph pattern matcher compiled from the rule language (``rules/ast.py``): the
same rules the e-graph saturates with, found in one concrete graph.

A pattern is matched top-down from a root node: an operator pattern fixes the node
behind each of its inputs, so one root gives at most one match and no backtracking is
needed. A multi-pattern rule matches its first pattern, then tries every root for the
second one with the first's bindings in force (shared variables must bind the same
tensor, shared parameter variables equal values). When the second pattern's root
reads a tensor the first pattern bound, only that tensor's users are tried.

Guards mean what ``rules/semantics.py`` says, evaluated by its Python evaluators;
``weight`` and ``before`` read :func:`~taso_egg.rules.semantics.weight_ranges` of the
graph, as the e-graph's ``wlo``/``whi`` analyses do. Parameters are compared as the
e-graph stores them (concat and split axes in 0..rank-1, VALID padding as [0 0 0 0]),
so a rule matches a node here when it matches the node's e-class there.
:meth:`RuleMatcher.match_at` says why a rule does not match at given roots.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from taso_egg.graph import Graph, Node, Tensor
from taso_egg.ops import CONCAT, SPLIT
from taso_egg.rules import semantics
from taso_egg.rules.instantiate import guard_holds, why_guard_fails
from taso_egg.rules.ast import App, Guard, Proj, Rule, Var, guard_vars, walk_vars


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
        # what is free at run time (weights and constants, and work on them alone)
        self.weight_only = graph.weight_only_nodes()
        # (smallest, largest) weight node id of each node computed from weights alone
        # (constants are not weights): what `weight` and `before` read
        self.weight_range: dict[int, tuple[int, int]] = semantics.weight_ranges(order)


@dataclass(frozen=True)
class Match:
    """One place a rule applies. ``roots[i]`` is the tensor ``rule.lhs[i]`` matched;
    ``nodes`` are the operator nodes the lhs patterns cover."""

    rule: Rule
    roots: tuple[Tensor, ...]
    tensors: dict[str, Tensor]
    params: dict[str, Any]
    nodes: frozenset[int]


@dataclass(frozen=True)
class MatchResult:
    """Whether a rule matches at given roots: the ``match``, or None and the ``reason``."""

    match: Match | None
    reason: str = ""

    def __bool__(self) -> bool:
        return self.match is not None


class _Binding:
    __slots__ = ("explain", "failure", "nodes", "params", "tensors")

    def __init__(self, tensors=None, params=None, nodes=None, explain=False):
        self.tensors: dict[str, Tensor] = tensors or {}
        self.params: dict[str, Any] = params or {}
        self.nodes: set[int] = nodes or set()
        self.explain = explain  # record why matching fails (match_at); not while searching
        self.failure = ""

    def copy(self) -> _Binding:
        return _Binding(dict(self.tensors), dict(self.params), set(self.nodes), self.explain)

    def fail(self, why) -> bool:
        """False, having recorded ``why()`` when explaining."""
        if self.explain:
            self.failure = why()
        return False


# The matcher's reading of the guards: rules/semantics.py's evaluators, with the
# weight ranges of the graph for the tensor guards.
_MATCHER = semantics.backend("search matcher", guards=dict.fromkeys(semantics.GUARDS, guard_holds))


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

    def match_at(self, index: GraphIndex, roots) -> MatchResult:
        """Whether the rule matches with ``rule.lhs[i]`` rooted at tensor ``roots[i]``
        (what :meth:`matches` would find there), and why not: the first node,
        parameter or guard that fails."""
        roots = tuple(roots)
        if len(roots) != len(self.rule.lhs):
            raise ValueError(f"{self.rule.where}: {len(self.rule.lhs)} root(s) wanted, got {len(roots)}")
        if len(roots) == 2 and roots[0] == roots[1]:
            return MatchResult(None, "both patterns of a multi rule at one tensor")
        b = _Binding(explain=True)
        for i, (pattern, root) in enumerate(zip(self.rule.lhs, roots)):
            if not self._tensor(pattern, root, b, index.graph):
                return MatchResult(None, f"{pattern} at {_where(index.graph, root)}: {b.failure}")
            if not self._guards(i, b, index):
                return MatchResult(None, f"guard {b.failure}")
        return MatchResult(self._match(roots, b))

    def _match(self, roots, b: _Binding) -> Match:
        return Match(self.rule, roots, b.tensors, b.params, frozenset(b.nodes))

    def _root_tensors(self, index: GraphIndex, i: int, bound: _Binding | None) -> Iterator[Tensor]:
        pattern, app = self.rule.lhs[i], self.roots[i]
        out = pattern.index if isinstance(pattern, Proj) else 0  # a Var: every output read
        if bound is not None and self.anchor is not None:
            t = bound.tensors[self.anchor]
            ids = [u for u in index.users.get((t.node, t.index), ()) if index.graph.nodes[u].op == app.op]
            ids.sort()
        else:
            ids = index.by_op.get(app.op, ())
        read = {(t.node, t.index) for _, t in index.graph.outputs} if isinstance(out, Var) else set()
        for nid in ids:
            node = index.graph.nodes[nid]
            if isinstance(out, Var):  # the outputs something reads (rewriting another changes nothing)
                yield from (node.out(k) for k in range(len(node.outputs))
                            if (nid, k) in index.users or (nid, k) in read)
            elif out < len(node.outputs):
                yield node.out(out)

    # -- structure --

    def _tensor(self, pattern, t: Tensor, b: _Binding, graph: Graph) -> bool:
        if isinstance(pattern, Var):
            seen = b.tensors.get(pattern.name)
            if seen is None:
                b.tensors[pattern.name] = t
                return True
            return seen == t or b.fail(lambda: f"{pattern} is {_where(graph, seen)} already, "
                                               f"not {_where(graph, t)}")
        index = pattern.index if isinstance(pattern, Proj) else 0
        if isinstance(index, Var):
            if b.params.setdefault(index.name, t.index) != t.index:
                return b.fail(lambda: f"{_where(graph, t)} is not output {b.params[index.name]}")
        elif t.index != index:
            return b.fail(lambda: f"{_where(graph, t)} is not output {index}")
        app = _root_app(pattern)
        return self._app(app, graph.nodes[t.node], b, graph)

    def _app(self, app: App, node: Node, b: _Binding, graph: Graph) -> bool:
        if node.op != app.op:
            return b.fail(lambda: f"node {node.id} is {node.op}, not {app.op}")
        if len(node.inputs) != len(app.inputs):
            return b.fail(lambda: f"node {node.id} ({node.op}) has {len(node.inputs)} inputs, "
                                  f"{app} {len(app.inputs)}")
        for name, expr in app.param_dict().items():
            value = _param_value(node, name)
            if isinstance(expr, Var):
                if expr.name in b.params:
                    if not _same_value(b.params[expr.name], value, name):
                        return b.fail(lambda: f"{name} of node {node.id} ({node.op}) is {value!r}, "
                                              f"but {expr} is {b.params[expr.name]!r} already")
                else:
                    b.params[expr.name] = value
            elif not _same_value(expr.value, value, name):
                return b.fail(lambda: f"{name} of node {node.id} ({node.op}) is {value!r}, "
                                      f"not {expr}")
        b.nodes.add(node.id)
        return all(self._tensor(p, t, b, graph) for p, t in zip(app.inputs, node.inputs))

    # -- guards --

    def _guards(self, i: int, b: _Binding, index: GraphIndex) -> bool:
        return all(self._guard(g, b, index) for g in self.guards_after[i])

    def _guard(self, g: Guard, b: _Binding, index: GraphIndex) -> bool:
        def shape_of(name):
            return b.tensors[name].shape

        def weight_range(name):
            return index.weight_range.get(b.tensors[name].node)

        if _MATCHER.guards[g.kind](g, b.params, shape_of, weight_range):
            return True
        return b.fail(lambda: why_guard_fails(g, b.params, shape_of, weight_range))


def _root_app(pattern) -> App:
    return pattern.pattern if isinstance(pattern, Proj) else pattern


def _where(graph: Graph, t: Tensor) -> str:
    node = graph.nodes[t.node]
    return f"node {node.id} ({node.op})" + (f" output {t.index}" if t.index else "")


def _param_value(node: Node, name: str):
    """Parameter ``name`` of ``node`` as the e-graph holds it: concat and split axes
    in 0..rank-1 (the conversion writes them so)."""
    value = node.params[name]
    if name == "axis" and node.op in (CONCAT.name, SPLIT.name) and isinstance(value, int):
        return value % len(node.outputs[0].shape)
    return value


_VALID = (0, 0, 0, 0)


def _same_value(a, b, name: str = "") -> bool:
    """Parameter equality as in the e-graph: a vector never equals a scalar; a VALID
    padding is the explicit padding [0 0 0 0] (the e-graph encodes both so)."""
    if name == "padding":
        a, b = (_VALID if v == "VALID" else v for v in (a, b))
    return isinstance(a, tuple) == isinstance(b, tuple) and a == b


def compile_rules(rules) -> list[RuleMatcher]:
    """Matchers for ``rules`` (every rule's operators must be in the table)."""
    return [RuleMatcher(r) for r in rules]


def find_matches(graph: Graph | GraphIndex, matchers) -> Iterator[Match]:
    """Every match of every matcher, rule by rule."""
    index = graph if isinstance(graph, GraphIndex) else GraphIndex(graph)
    for m in matchers:
        yield from m.matches(index)


__all__ = ["GraphIndex", "Match", "MatchResult", "RuleMatcher", "compile_rules", "find_matches"]
