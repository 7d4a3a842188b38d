"""Which rules saturation compiles into egglog, and when: only those that can match.

Egglog compiles each rule it is given (about 0.4 ms a rule, as much again for its
probe), and on the zoo at most 140 of the default corpus's 970 rules have a left side
whose operators and literal parameters occur in the saturated e-graph at all (0-10
ever fire), so compiling the corpus up front cost more than saturating most models.

A rule is admitted before a step of its ruleset once each of its left-hand patterns has
a structural match in the e-graph as it stands: every operator present with the
pattern's literal parameters, each input class holding a node that matches the input
pattern (guards, repeated variables and computed parameters are not checked, so this
can only over-approximate). A rule that fails this cannot match now, and a rule egglog
runs for the first time sees every match, old facts included, so admitting a rule at
the first step where it can match gives the same matches as compiling it up front.
An operator's analysis rules (``language.analysis_rules``) are admitted with the first
rule whose right side builds it, or when the input's conversion holds it.

The structural match needs the e-graph serialized, which costs a few us an e-node; past
:data:`STRUCTURE_LIMIT` e-nodes only the operators are checked (the table sizes egglog
reports for free), which admits more rules but no fewer.
"""

from __future__ import annotations

import json

from ..rules.ast import Lit, Proj, Var, operators
from .language import (OP_OF_CONSTRUCTOR, SORTS, STEPS, Ruleset, analysis_rules, egraph_params, encode, encode_param,
                       probe_name, ruleset_of)
from .rule_compiler import compile_probe, compile_rule

# E-nodes up to which the e-graph is decoded to match left sides structurally; above,
# decoding would cost about what compiling the rules it leaves out costs.
STRUCTURE_LIMIT = 5_000


def present_ops(sizes: dict[str, int]) -> set[str]:
    """The operators with e-nodes, from egglog's table sizes (constructor -> rows)."""
    ops = {OP_OF_CONSTRUCTOR[name] for name, n in sizes.items() if n and name in OP_OF_CONSTRUCTOR}
    return ops | ({"proj"} if sizes.get("Proj") else set())


class Structure:
    """Which patterns have a structural match in a serialized e-graph (egraph-serialize
    JSON, as ``saturate`` reads it; see the module).

    Bottom up: the classes that match each subpattern, computed once per distinct
    subpattern with variables left anonymous, which the corpus's rules share widely.
    Parameters are compared as egglog literals, rendered from the serialized values
    only where a pattern names one."""

    def __init__(self, data: dict):
        self.nodes = nodes = data["nodes"]
        # op -> [(class, parameter node ids, input class ids)]
        self.by_op: dict[str, list] = {}
        for node in nodes.values():
            op = "proj" if node["op"] == "Proj" else OP_OF_CONSTRUCTOR.get(node["op"])
            if op is None or node.get("subsumed"):
                continue
            kids = node["children"]
            if op == "proj":
                params, inputs = kids[1:], kids[:1]
            else:
                arity = len(egraph_params(op))
                params, inputs = kids[:arity], kids[arity:]
            self.by_op.setdefault(op, []).append(
                (node["eclass"], params, tuple(nodes[k]["eclass"] for k in inputs)))
        self._classes: dict = {}
        self._with: dict = {}
        self._by_input: dict = {}
        self._text: dict = {}

    def matches(self, pattern) -> bool:
        """Some e-node of the e-graph matches ``pattern`` (a Var matches any class)."""
        key = _shape_key(pattern)
        return key is None or bool(self.classes(key))

    def classes(self, key) -> set:
        """The classes holding an e-node that matches the subpattern ``key``."""
        found = self._classes.get(key)
        if found is not None:
            return found
        if key[0] == "proj":
            _, index, inner = key
            below = self.classes(inner)
            checks = () if index is None else ((0, "i64", str(index)),)  # None: any output
            found = {cid for cid, kids in self._with_params("proj", checks) if kids[0] in below}
        else:
            op, literals, inputs = key
            spec = egraph_params(op)
            checks = tuple((spec.index(param), SORTS[param.kind], text) for param, text in literals)
            below = []
            for k in inputs:
                b = None if k is None else self.classes(k)
                if b is not None and not b:  # an input no class matches: none can
                    found = set()
                    break
                below.append(b)
            else:
                nodes = self._with_params(op, checks)
                # scan only the users of the input with the fewest matching classes
                narrow = min(((i, b) for i, b in enumerate(below) if b is not None),
                             key=lambda ib: len(ib[1]), default=None)
                if narrow is not None and len(narrow[1]) < len(nodes):
                    users = self._users(op, checks, narrow[0])
                    nodes = [e for c in narrow[1] for e in users.get(c, ())]
                found = {cid for cid, kids in nodes if all(b is None or k in b for b, k in zip(below, kids))}
        self._classes[key] = found
        return found

    def _users(self, op: str, checks: tuple, i: int) -> dict:
        """Input class -> the (class, input classes) of ``_with_params(op, checks)``
        with that class as input ``i``."""
        key = (op, checks, i)
        found = self._by_input.get(key)
        if found is None:
            found = self._by_input[key] = {}
            for entry in self._with_params(op, checks):
                found.setdefault(entry[1][i], []).append(entry)
        return found

    def _with_params(self, op: str, checks: tuple) -> list:
        """(class, input classes) of the e-nodes of ``op`` whose parameters at the
        checked positions render as the literals given."""
        key = (op, checks)
        found = self._with.get(key)
        if found is None:
            found = self._with[key] = [
                (cid, kids) for cid, params, kids in self.by_op.get(op, ())
                if all(self._render(params[i], sort) in (text, None) for i, sort, text in checks)]
        return found

    def _render(self, nid: str, sort: str) -> str | None:
        """The serialized value ``nid`` as the egglog literal ``language.encode`` writes;
        None where it cannot be read back, which then matches any literal (the check
        may only over-approximate)."""
        if nid in self._text:
            return self._text[nid]
        node = self.nodes[nid]
        try:
            if sort == "IVec":
                items = [self._render(k, "i64") for k in node["children"]]
                text = None if None in items else "(vec-of " + " ".join(items) + ")" if items else "(vec-empty)"
            elif sort == "String":
                text = encode(sort, json.loads(node["op"]))
            else:
                text = encode(sort, float(node["op"]) if sort == "f64" else int(node["op"]))
        except (ValueError, TypeError):
            text = None
        self._text[nid] = text
        return text


def _lhs_operators(rule) -> frozenset:
    """The operators of ``rule``'s left side, kept on the rule (rules outlive saturations)."""
    found = rule.__dict__.get("_lhs_operators")
    if found is None:
        found = frozenset(operators(rule.lhs))
        object.__setattr__(rule, "_lhs_operators", found)  # not a field: equality ignores it
    return found


def _shape_key(pattern):
    """A hashable key of ``pattern`` with its variables anonymous (None for a variable)
    and its literal parameters as egglog literals; kept on the pattern."""
    if isinstance(pattern, Var):
        return None
    found = pattern.__dict__.get("_shape_key")
    if found is None:
        if isinstance(pattern, Proj):
            index = None if isinstance(pattern.index, Var) else int(pattern.index)
            found = ("proj", index, _shape_key(pattern.pattern))
        else:
            found = (pattern.op, tuple(_literals(pattern)), tuple(_shape_key(p) for p in pattern.inputs))
        object.__setattr__(pattern, "_shape_key", found)  # not a field: equality ignores it
    return found


def _literals(pattern) -> list:
    """(parameter, its egglog literal) for each literal parameter of an App pattern,
    encoded as the rule compiler encodes it (so a padding compares as its pads)."""
    found = pattern.__dict__.get("_literals")
    if found is None:
        found = tuple((q, encode_param(q, p.value)) for p, q in zip(pattern.params, egraph_params(pattern.op))
                      if isinstance(p, Lit))
        object.__setattr__(pattern, "_literals", found)  # not a field: equality ignores it
    return found


class Admission:
    """The rules and analyses compiled into one egglog e-graph so far, and those waiting.

    ``compiled=True``: the e-graph already holds every rule and analysis
    (``saturate.rules_egraph``), and nothing is admitted."""

    def __init__(self, egraph, rules, compiled: bool = False):
        self.egraph = egraph
        self.everything = compiled
        self.admitted: list[str] = [r.name for r in rules] if compiled else []
        self._lhs_ops = {r.name: _lhs_operators(r) for r in rules}
        self._waiting = {ruleset: [] for ruleset in STEPS}
        self._analysed: set[str] = set()
        if not compiled:
            for r in rules:
                self._waiting[ruleset_of(r)].append(r)

    def analyses(self, ops) -> None:
        """Compile the analysis rules of ``ops`` not compiled yet."""
        if self.everything:
            return
        new = sorted(set(ops) - self._analysed - {"proj"})
        if new:
            self._analysed |= set(new)
            self.egraph.parse_and_run_program("".join(analysis_rules(op) for op in new))

    def admit(self, ruleset: Ruleset, sizes, enodes: int, serialized) -> list:
        """Compile the waiting rules of ``ruleset`` that can match the e-graph now
        (``sizes()``: egglog's table sizes; ``serialized()``: the e-graph serialized,
        called only at most STRUCTURE_LIMIT e-nodes). Returns the rules admitted."""
        waiting = self._waiting[ruleset]
        if not waiting:
            return []
        present = present_ops(sizes())
        ready = [r for r in waiting if self._lhs_ops[r.name] <= present]
        if ready and enodes <= STRUCTURE_LIMIT:
            structure = Structure(serialized())
            ready = [r for r in ready if all(structure.matches(p) for p in r.lhs)]
        if not ready:
            return []
        names = {r.name for r in ready}
        self._waiting[ruleset] = [r for r in waiting if r.name not in names]
        new_ops = set().union(*(operators(r.rhs) for r in ready)) - self._analysed - {"proj"}
        self._analysed |= new_ops
        self.egraph.parse_and_run_program(
            "".join(analysis_rules(op) for op in sorted(new_ops))
            + "\n".join(compile_rule(r) + "\n" + compile_probe(r, ruleset.probes, probe_name(r.name))
                        for r in ready) + "\n")
        self.admitted += [r.name for r in ready]
        return ready

    @property
    def compiled(self) -> int:
        """Rules compiled so far."""
        return len(self.admitted)
