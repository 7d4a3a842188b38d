"""Compile parsed rules (taso_egg.rules.ast) to egglog rules over the tensor language.

A rule's source patterns become query facts, its guards more facts (shapes are read
through the ``shape`` analysis, weight-only-ness and anchoring order through
``wlo``/``whi``), and its action records ``(pending old new)`` for each replaced
pattern; the ``commit`` analysis rule unions them once the new term's shape checks.
"""

from __future__ import annotations

import re

from .language import SORTS, Ruleset, constructor, egraph_params, encode, encode_param, ruleset_of, tensor_arity
from ..errors import RuleError
from ..rules import semantics
from ..rules.ast import App, Guard, Lit, ParamOp, Proj, Rule, Var


class _Compiler:
    def __init__(self, rule: Rule):
        self.rule = rule
        self.facts: list[str] = []
        self.shape_vars: dict[str, str] = {}
        self.sorts: dict[str, str] = {}  # egglog variable -> its sort, as the patterns use it

    def fail(self, msg: str):
        file, line = self.rule.source if self.rule.source else ("<rule>", 0)
        raise RuleError(f"{file}:{line}: rule {self.rule.name}: {msg}")

    # --- patterns ----------------------------------------------------------------------

    def tensor(self, pat) -> str:
        if isinstance(pat, Var):
            self.sorts[f"t_{_ident(pat.name)}"] = "T"
            return f"t_{_ident(pat.name)}"
        if isinstance(pat, Proj):
            index = pat.index if isinstance(pat.index, int) else self.param(pat.index, "i64")
            return f"(Proj {self.tensor(pat.pattern)} {index})"
        if isinstance(pat, App):
            spec = egraph_params(pat.op)
            if len(pat.params) > len(spec):
                self.fail(f"{pat.op} takes {len(spec)} parameters, got {len(pat.params)}")
            params = [self.op_param(p, q) for p, q in zip(pat.params, spec)]
            params += [encode_param(q, q.default) for q in spec[len(pat.params):]]  # omitted defaults
            if len(pat.inputs) != tensor_arity(pat.op):
                self.fail(f"{pat.op} takes {tensor_arity(pat.op)} tensor inputs, got {len(pat.inputs)}")
            ins = [self.tensor(t) for t in pat.inputs]
            return f"({constructor(pat.op)} {' '.join(params + ins)})"
        self.fail(f"not a tensor pattern: {pat!r}")

    def op_param(self, p, param) -> str:
        """Operator parameter ``param`` (ops.base.Param) given as ``p``."""
        if isinstance(p, Lit):
            return encode_param(param, p.value)
        return self.param(p, SORTS[param.kind])

    def param(self, p, kind: str | None = None) -> str:
        """A parameter expression; ``kind`` is the egglog sort a literal takes (guessed
        from the literal when None)."""
        if isinstance(p, Var):
            if kind is not None:
                self.sorts[f"p_{_ident(p.name)}"] = kind
            return f"p_{_ident(p.name)}"
        if isinstance(p, Lit):
            v = p.value
            if kind is None:
                kind = "IVec" if isinstance(v, tuple) else "i64" if isinstance(v, int) else \
                    "f64" if isinstance(v, float) else "String"
            return encode(kind, v)
        if isinstance(p, ParamOp):
            return self.expr(p)
        self.fail(f"not a parameter: {p!r}")

    def shape_of(self, t) -> str:
        if not isinstance(t, Var):
            self.fail(f"shape queries need a tensor variable, got {t!r}")
        v = self.shape_vars.get(t.name)
        if v is None:
            v = f"s_{_ident(t.name)}"
            self.shape_vars[t.name] = v
            self.facts.append(f"(= {v} (shape {self.tensor(t)}))")
        return v

    def expr(self, e: ParamOp) -> str:
        return _EGGLOG.param_fns[e.fn](self, e.args)

    def guard(self, g: Guard) -> None:
        _EGGLOG.guards[g.kind](self, g.args)

    def divide(self, a, b) -> str:
        """``(/ A B)``, defined for A >= 0 and B > 0 (egglog's ``/`` truncates)."""
        x, y = self.param(a, "i64"), self.param(b, "i64")
        self.facts += [f"(>= {x} 0)", f"(> {y} 0)"]
        return f"(/ {x} {y})"

    def compare(self, op: str, args) -> None:
        a, b = (self.param(x) for x in args)
        self.facts.append(f"({op} {a} {b})")

    def parts(self) -> tuple[list[str], list[str], list[str]]:
        """The query facts, the replaced roots and the replacing terms."""
        roots = []
        for i, pat in enumerate(self.rule.lhs):
            root = f"__lhs{i}"
            self.facts.append(f"(= {root} {self.tensor(pat)})")
            roots.append(root)
        for g in self.rule.guards:
            self.guard(g)
        news = [self.tensor(rhs) for rhs in self.rule.rhs]  # may add shape facts
        return self.facts, roots, news

    def compile(self) -> str:
        facts, roots, news = self.parts()
        actions = [f"(pending {root} {new})" for root, new in zip(roots, news)]
        return (f"(rule ({' '.join(facts)})\n      ({' '.join(actions)})\n"
                f"      :ruleset {ruleset_of(self.rule).name} :name \"{self.rule.name}\")")


# rules/semantics.py's guards and parameter functions as egglog query facts: tensor
# properties are read through the shape analysis and weight-only-ness and the anchoring
# order through wlo/whi, which are defined exactly for the e-classes with a member
# computed from weights alone. A vector index out of range (negative included) fails
# to match, as in the table.
_EGGLOG = semantics.backend("egglog", param_fns={
    "dim": lambda c, a: f"(vec-get {c.shape_of(a[0])} {c.param(a[1], 'i64')})",
    "rank": lambda c, a: f"(vec-length {c.shape_of(a[0])})",
    "shape": lambda c, a: c.shape_of(a[0]),
    "len": lambda c, a: f"(vec-length {c.param(a[0], 'IVec')})",
    "at": lambda c, a: f"(vec-get {c.param(a[0], 'IVec')} {c.param(a[1], 'i64')})",
    **{op: (lambda op: lambda c, a: f"({op} {c.param(a[0], 'i64')} {c.param(a[1], 'i64')})")(op)
       for op in ("+", "-", "*")},
    "/": lambda c, a: c.divide(*a),
    "vec": lambda c, a: "(vec-of " + " ".join(c.param(x, "i64") for x in a) + ")",
}, guards={
    **{op: (lambda op: lambda c, a: c.compare(op, a))(op) for op in semantics.COMPARISONS},
    "weight": lambda c, a: c.facts.append(f"(= lo_{_ident(a[0].name)} (wlo {c.tensor(a[0])}))"),
    "before": lambda c, a: c.facts.append(f"(< (whi {c.tensor(a[0])}) (wlo {c.tensor(a[1])}))"),
})


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name.lstrip("?"))


def compile_rule(rule: Rule) -> str:
    return _Compiler(rule).compile()


def compile_rules(rules) -> str:
    return "\n".join(compile_rule(r) for r in rules) + "\n"


def compile_probe(rule: Rule, ruleset: Ruleset, name: str) -> str:
    """``rule``'s whole query (the right-hand sides' shape facts included) with no
    actions, as rule ``name`` of ``ruleset``: running it reports how many matches the
    rule has and changes nothing."""
    c = _Compiler(rule)
    facts, _, _ = c.parts()
    return f"(rule ({' '.join(facts)})\n      ()\n      :ruleset {ruleset.name} :name \"{name}\")"


def compile_match_recorder(rule: Rule, terms, ruleset: Ruleset, relation: str) -> str | None:
    """Egglog declarations that count ``rule``'s matches by what its right sides build.
    Rule ``relation`` of ruleset ``ruleset`` adds to relation ``relation`` a row per
    distinct binding of the variables that ``terms`` (subterms of the right sides) read,
    from every match; then rule ``relation-I`` of ruleset ``ruleset-present`` adds to
    relation ``relation-I`` the rows where the e-graph holds ``terms[I]`` already.
    One match builds at most one e-node per term, and matches with one binding build
    the same ones, so the rows lacking a term bound the e-nodes it adds. Each term is
    looked up from a recorded row, its variables bound: joined with the rule's whole
    query instead, egglog's plan can walk the e-graph's paths first (a size-3 generated
    rule's probe passed 14 GB over 12,000 e-nodes). None when a variable's sort is
    unknown or the terms read no variable."""
    c = _Compiler(rule)
    facts, _, _ = c.parts()
    built = [c.tensor(t) for t in terms]

    def reads(text: str, var: str) -> bool:
        return re.search(rf"(?<![\w]){re.escape(var)}(?![\w])", text) is not None

    text = " ".join(built)
    shapes = [f"(= {s} (shape {c.tensor(Var(v))}))" for v, s in c.shape_vars.items() if reads(text, s)]
    text += " " + " ".join(shapes)
    if any(v not in c.sorts for v in re.findall(r"(?<![\w])p_\w+", text)):
        return None
    used = [v for v in c.sorts if reads(text, v)]
    if not used:
        return None
    sorts = " ".join(c.sorts[v] for v in used)
    row = f"({relation} {' '.join(used)})"
    out = [f"(relation {relation} ({sorts}))",
           f"(rule ({' '.join(facts)})\n      ({row})\n      :ruleset {ruleset.name} :name \"{relation}\")"]
    for i, term in enumerate(built):
        out += [f"(relation {relation}-{i} ({sorts}))",
                f"(rule ({row} {' '.join(shapes)} (= __present {term}))\n      (({relation}-{i} {' '.join(used)}))\n"
                f"      :ruleset {ruleset.name}-present :name \"{relation}-{i}\")"]
    return "\n".join(out)
