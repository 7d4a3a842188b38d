"""Compile parsed rules (rules/lang.py) to egglog rules over the tensor language.

A rule's source patterns become query facts, its guards more facts (shapes are read
through the ``shape`` analysis, weight-only-ness and anchoring order through
``wlo``/``whi``), and its action records ``(pending old new)`` for each replaced
pattern; the ``commit`` analysis rule unions them once the new term's shape checks.
"""

from __future__ import annotations

from ..egraph.language import constructor, encode, op_params, tensor_arity
from ..errors import RuleError
from .lang import App, Guard, Lit, ParamOp, Proj, Rule, Var

_CMP = {"=": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_ARITH = {"+": "+", "-": "-", "*": "*", "/": "/"}


class _Compiler:
    def __init__(self, rule: Rule):
        self.rule = rule
        self.facts: list[str] = []
        self.shape_vars: dict[str, str] = {}

    def fail(self, msg: str):
        file, line = self.rule.source if self.rule.source else ("<rule>", 0)
        raise RuleError(f"{file}:{line}: rule {self.rule.name}: {msg}")

    # --- patterns ----------------------------------------------------------------------

    def tensor(self, pat) -> str:
        if isinstance(pat, Var):
            return f"t_{_ident(pat.name)}"
        if isinstance(pat, Proj):
            return f"(Proj {self.tensor(pat.pattern)} {int(pat.index)})"
        if isinstance(pat, App):
            kinds = op_params(pat.op)
            if len(pat.params) > len(kinds):
                self.fail(f"{pat.op} takes {len(kinds)} parameters, got {len(pat.params)}")
            params = [self.param(p, kind, name) for p, (name, kind) in zip(pat.params, kinds)]
            for name, kind in kinds[len(pat.params):]:  # omitted trailing defaults
                from ..ops import OPS

                params.append(encode(kind, OPS[pat.op].defaults[name], name))
            if len(pat.inputs) != tensor_arity(pat.op):
                self.fail(f"{pat.op} takes {tensor_arity(pat.op)} tensor inputs, got {len(pat.inputs)}")
            ins = [self.tensor(t) for t in pat.inputs]
            return f"({constructor(pat.op)} {' '.join(params + ins)})"
        self.fail(f"not a tensor pattern: {pat!r}")

    def param(self, p, kind: str | None = None, name: str = "") -> str:
        if isinstance(p, Var):
            return f"p_{_ident(p.name)}"
        if isinstance(p, Lit):
            v = p.value
            if kind is None:
                kind = "IVec" if isinstance(v, tuple) else "i64" if isinstance(v, int) else \
                    "f64" if isinstance(v, float) else "String"
            return encode(kind, v, name)
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
        fn, args = e.fn, e.args
        if fn == "dim":
            return f"(vec-get {self.shape_of(args[0])} {self.param(args[1], 'i64')})"
        if fn == "rank":
            return f"(vec-length {self.shape_of(args[0])})"
        if fn == "shape":
            return self.shape_of(args[0])
        if fn == "len":
            return f"(vec-length {self.param(args[0], 'IVec')})"
        if fn == "at":
            return f"(vec-get {self.param(args[0], 'IVec')} {self.param(args[1], 'i64')})"
        if fn in _ARITH:
            return f"({_ARITH[fn]} {self.param(args[0], 'i64')} {self.param(args[1], 'i64')})"
        if fn == "vec":
            return "(vec-of " + " ".join(self.param(a, "i64") for a in args) + ")" if args else "(vec-empty)"
        self.fail(f"unknown parameter function {fn!r}")

    def guard(self, g: Guard) -> None:
        if g.kind in _CMP:
            a, b = (self.param(x) for x in g.args)
            self.facts.append(f"({_CMP[g.kind]} {a} {b})")
        elif g.kind == "weight":
            self.facts.append(f"(= lo_{_ident(g.args[0].name)} (wlo {self.tensor(g.args[0])}))")
        elif g.kind == "before":
            a, b = (self.tensor(x) for x in g.args)
            self.facts.append(f"(< (whi {a}) (wlo {b}))")
        else:
            self.fail(f"unknown guard {g.kind!r}")

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
        ruleset = "multi" if self.rule.multi else "rewrites"
        return (f"(rule ({' '.join(facts)})\n      ({' '.join(actions)})\n"
                f"      :ruleset {ruleset} :name \"{self.rule.name}\")")


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name.lstrip("?"))


def compile_rule(rule: Rule) -> str:
    return _Compiler(rule).compile()


def compile_rules(rules) -> str:
    return "\n".join(compile_rule(r) for r in rules) + "\n"


def compile_probe(rule: Rule, ruleset: str, name: str, present=()) -> str:
    """``rule``'s whole query (the right-hand sides' shape facts included) with no
    actions, as rule ``name`` of ``ruleset``: running it reports how many matches the
    rule has and changes nothing. With ``present`` (subterms of the right-hand
    sides) it counts only the matches where the e-graph has those terms already."""
    c = _Compiler(rule)
    facts, _, _ = c.parts()
    facts = facts + [f"(= __present{i} {c.tensor(p)})" for i, p in enumerate(present)]
    return f"(rule ({' '.join(facts)})\n      ()\n      :ruleset {ruleset} :name \"{name}\")"
