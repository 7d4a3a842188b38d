"""Rules, axioms and the rule language's guards and parameter functions as Z3 terms
(the encoding this package's docstring describes): tensors an uninterpreted sort,
operators uninterpreted functions, a shape its rank and dimensions.
"""

from __future__ import annotations

import z3

from taso_egg.errors import RuleError
from taso_egg.ops import OPS, shapes

from .. import semantics
from ..ast import App, Guard, Lit, ParamOp, Proj, Rule, Var


class _Unsupported(Exception):
    """The rule uses something the encoding does not model."""


# --- the encoding ------------------------------------------------------------------

Tensor = z3.DeclareSort("Tensor")
IntSeq = z3.SeqSort(z3.IntSort())
rank = z3.Function("rank", Tensor, z3.IntSort())
dim = z3.Function("dim", Tensor, z3.IntSort(), z3.IntSort())

# Shapes are compared up to the rank the operator table's shape cases are unrolled to.
_MAX_RANK = shapes.MAX_RANK


class _Shape:
    """The shape of tensor term ``t`` (its rank and dimensions)."""

    def __init__(self, t):
        self.t = t

    def rank(self):
        return rank(self.t)

    def __getitem__(self, i):
        return dim(self.t, i)


def _length(s):
    return s.rank() if isinstance(s, _Shape) else z3.Length(s)


def _same_shape(a, b):
    """``a`` and ``b`` (each a _Shape or a sequence of ints) are the same shape."""
    if not isinstance(a, _Shape):
        a, b = b, a
    n = _length(b)
    if isinstance(b, _Shape):
        dims = [a[i] == b[i] for i in range(_MAX_RANK)]
    else:  # a sequence has no elements past its length; the shape reads 0 there
        dims = [z3.If(i < n, a[i] == b[i], a[i] == 0) for i in range(_MAX_RANK)]
    return z3.And(a.rank() == n, *dims)


def _past_rank_zero(s: _Shape):
    """Dimensions past the rank read 0 (so that equal shapes have equal dim terms), and
    the rank is one the shape cases are unrolled to (the encoding's assumption, stated:
    the per-rank cases of broadcasting and transposition then always give a shape)."""
    return z3.And(s.rank() >= 0, s.rank() <= _MAX_RANK,
                  *[z3.Implies(i >= s.rank(), s[i] == 0) for i in range(_MAX_RANK)])


_CMP = {"=": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}
_ARITH = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
          "/": lambda a, b: a / b}  # Z3 int division floors for positive divisors


# Z3 sort of each parameter kind (ops.base.PARAM_KINDS) a rule can use. Paddings are
# symbols here (SAME, VALID): explicit pads are not modelled.
_SORTS = {"int": z3.IntSort(), "float": z3.RealSort(), "symbol": z3.StringSort(),
          "activation": z3.StringSort(), "dtype": z3.StringSort(), "ints": IntSeq, "dims": IntSeq,
          "padding": z3.StringSort()}


def _param_sort(op: str, name: str):
    return _SORTS[OPS[op].param(name).kind]


def _seq(items) -> z3.SeqRef:
    units = [z3.Unit(z3.IntVal(i) if isinstance(i, int) else i) for i in items]
    if not units:
        return z3.Empty(IntSeq)
    return units[0] if len(units) == 1 else z3.Concat(*units)


def _literal(value, sort):
    if sort == IntSeq and isinstance(value, tuple):
        return _seq(value)
    if sort == z3.StringSort() and isinstance(value, str):
        return z3.StringVal(value)
    if sort == z3.RealSort() and isinstance(value, (int, float)) and not isinstance(value, bool):
        return z3.RealVal(value)
    if sort == z3.IntSort() and isinstance(value, int) and not isinstance(value, bool):
        return z3.IntVal(value)
    raise _Unsupported(f"parameter value {value!r} is not modelled as a {sort}")


def _var_sorts(rule: Rule) -> dict:
    """Z3 sort of every variable: tensors, and parameters by the operator parameter
    that binds them (every parameter variable appears bare in some :lhs position)."""
    sorts = {v: Tensor for v in rule.tensor_vars()}

    def walk(p):
        if isinstance(p, Proj):
            if isinstance(p.index, Var) and sorts.setdefault(p.index.name, z3.IntSort()) != z3.IntSort():
                raise _Unsupported(f"?{p.index.name} is bound to parameters of different kinds")
            walk(p.pattern)
        elif isinstance(p, App):
            names = tuple(OPS[p.op].defaults)
            for name, e in zip(names, p.params):
                if isinstance(e, Var):
                    sort = _param_sort(p.op, name)
                    if sorts.setdefault(e.name, sort) != sort:
                        raise _Unsupported(f"?{e.name} is bound to parameters of different "
                                           f"kinds ({sorts[e.name]} and {sort})")
            for t in p.inputs:
                walk(t)

    for p in rule.lhs + rule.rhs:
        walk(p)
    missing = [v for v in rule.param_vars() if v not in sorts]
    if missing:
        raise _Unsupported("parameter variable(s) " + ", ".join("?" + m for m in missing)
                           + " never bound by an operator parameter")
    return sorts


class _Encoder:
    """Turns patterns, parameter expressions and guards into Z3 terms, and collects
    the operator functions it declared (each needs its shape axiom)."""

    def __init__(self):
        self.funcs: dict[tuple, z3.FuncDeclRef] = {}

    def func(self, op: str, n_inputs: int) -> z3.FuncDeclRef:
        """The function of ``op`` with ``n_inputs`` tensors: its parameters, then (for a
        multi-output operator) the output's index, then its tensor inputs."""
        key = (op, n_inputs)
        if key not in self.funcs:
            names = tuple(OPS[op].defaults)
            sorts = [_param_sort(op, n) for n in names] + [z3.IntSort()] * OPS[op].multi_output \
                + [Tensor] * n_inputs
            self.funcs[key] = z3.Function(f"{op}/{n_inputs}", *sorts, Tensor)
        return self.funcs[key]

    def term(self, pat, env: dict, abstract: list | None = None):
        """The Z3 tensor for pattern ``pat``. With ``abstract`` (a list), every
        parameter that is not a bare variable becomes a fresh bound variable, and
        ``(variable, equality)`` is appended to ``abstract``: the term is then a valid
        E-matching pattern."""
        if isinstance(pat, Var):
            return env[pat.name]
        if isinstance(pat, Proj):
            return self._app(pat.pattern, env, abstract, pat.index)
        if isinstance(pat, App):
            if OPS[pat.op].multi_output:
                raise _Unsupported("split outside (proj I ...)")
            return self._app(pat, env, abstract, None)
        raise _Unsupported(f"not a tensor pattern: {pat!r}")

    def _app(self, app: App, env: dict, abstract, output):
        if app.op not in OPS:
            raise _Unsupported(f"operator {app.op!r}")
        names = tuple(OPS[app.op].defaults)
        given = list(zip(names, app.params)) + ([("output", output)] if output is not None else [])
        params = []
        for name, e in given:
            sort = z3.IntSort() if name == "output" else _param_sort(app.op, name)
            value = self.param(Lit(e) if isinstance(e, int) else e, env, sort)
            if abstract is not None and not isinstance(e, Var):
                bound = z3.FreshConst(sort, name)
                abstract.append((bound, bound == value))
                value = bound
            params.append(value)
        inputs = [self.term(t, env, abstract) for t in app.inputs]
        return self.func(app.op, len(inputs))(*params, *inputs)

    def param(self, e, env: dict, sort=None):
        if isinstance(e, Var):
            return env[e.name]
        if isinstance(e, Lit):
            if sort is None:
                sort = IntSeq if isinstance(e.value, tuple) else z3.IntSort()
            return _literal(e.value, sort)
        if isinstance(e, ParamOp):
            return _Z3.param_fns[e.fn](self, env, e.args)
        raise _Unsupported(f"not a parameter expression: {e!r}")

    def guard(self, g: Guard, env: dict):
        """The guard as a Z3 formula; None for the scheduling guards."""
        translate = _Z3.guards[g.kind]
        return None if translate is None else translate(self, env, g)

    def compare(self, env: dict, g: Guard):
        a, b = (self.param(x, env) for x in g.args)
        if isinstance(a, _Shape) or isinstance(b, _Shape):
            if g.kind not in ("=", "!=") or not all(isinstance(x, _Shape) or x.sort() == IntSeq for x in (a, b)):
                raise _Unsupported(f"guard {g}: a shape compares only (in)equal to a shape or vector")
            return _same_shape(a, b) if g.kind == "=" else z3.Not(_same_shape(a, b))
        if a.sort() != b.sort():
            raise _Unsupported(f"guard {g} compares a {a.sort()} with a {b.sort()}")
        return _CMP[g.kind](a, b)


# rules/semantics.py's guards and parameter functions as Z3 terms. Definedness is not
# stated (dims past the rank read 0, negative axes are unconstrained): guards are
# hypotheses, which that only weakens. The scheduling guards (weight, before) are
# ignored (None): every rule is proved for all tensors.
_Z3 = semantics.backend("z3", param_fns={
    "dim": lambda enc, env, a: _Shape(env[a[0].name])[enc.param(a[1], env)],
    "rank": lambda enc, env, a: rank(env[a[0].name]),
    "shape": lambda enc, env, a: _Shape(env[a[0].name]),
    "len": lambda enc, env, a: _length(enc.param(a[0], env, IntSeq)),
    "at": lambda enc, env, a: enc.param(a[0], env, IntSeq)[enc.param(a[1], env)],
    **{op: (lambda f: lambda enc, env, a: f(enc.param(a[0], env), enc.param(a[1], env)))(f)
       for op, f in _ARITH.items()},
    "vec": lambda enc, env, a: _seq([enc.param(x, env) for x in a]),
}, guards={
    **dict.fromkeys(semantics.COMPARISONS, lambda enc, env, g: enc.compare(env, g)),
    **dict.fromkeys(semantics.SCHEDULING_GUARDS, None),
})


def _encode_axiom(enc: _Encoder, axiom: Rule) -> list:
    """The quantified equations of one axiom (one per usable trigger side)."""
    sorts = _var_sorts(axiom)
    env = {v: z3.Const(v, s) for v, s in sorts.items()}
    guards = [f for f in (enc.guard(g, env) for g in axiom.guards) if f is not None]
    formulas = []
    for lhs, rhs in zip(axiom.lhs, axiom.rhs):
        for trigger, other in ((lhs, rhs), (rhs, lhs)):
            if isinstance(trigger, Var) or not set(env) <= _bare_vars(trigger):
                continue
            abstracted: list = []
            pattern = enc.term(trigger, env, abstracted)
            body = pattern == enc.term(other, env)
            premises = guards + [eq for _, eq in abstracted]
            if premises:
                body = z3.Implies(z3.And(*premises), body)
            bound = list(env.values()) + [v for v, _ in abstracted]
            formulas.append(z3.ForAll(bound, body, patterns=[pattern], qid=axiom.name))
    if not formulas:
        raise RuleError(f"{axiom.where}: neither side of the axiom holds all its variables "
                        f"outside parameter expressions, so it cannot trigger")
    return formulas


def _bare_vars(pat) -> set[str]:
    """Variables a pattern binds directly (not inside parameter expressions)."""
    if isinstance(pat, Var):
        return {pat.name}
    if isinstance(pat, Proj):
        return _bare_vars(pat.pattern) | ({pat.index.name} if isinstance(pat.index, Var) else set())
    out = {e.name for e in pat.params if isinstance(e, Var)}
    for t in pat.inputs:
        out |= _bare_vars(t)
    return out
