"""The operator table's shape cases (``ops/shapes.py``) as Z3 facts, a second back end
of them beside the e-graph's: what typing says about the shape of an operator's
result (a quantified axiom per operator function), and what it requires of every
operator application of a rule's left side.
"""

from __future__ import annotations

import z3

from taso_egg.errors import RuleError
from taso_egg.ops import OPS, shapes

from ..ast import App, Lit, Proj, Rule
from ..instantiate import builds_on
from .encode import _CMP, _MAX_RANK, IntSeq, Tensor, _Encoder, _param_sort, _Shape


def _shape_axiom(key: tuple, f: z3.FuncDeclRef):
    """The quantified shape axiom of operator function ``f`` (None when typing fixes
    nothing useful about its result)."""
    op, n = key
    params = [z3.FreshConst(f.domain(i), "p") for i in range(f.arity() - n)]
    ins = [z3.FreshConst(Tensor, "t") for _ in range(n)]
    result = f(*params, *ins)
    op_params, output = (params[:-1], params[-1]) if OPS[op].multi_output else (params, None)
    facts = _shape_facts(op, op_params, [_Shape(t) for t in ins], _Shape(result), output)
    return None if facts is None else z3.ForAll(params + ins, facts, patterns=[result])


def _shape_facts(op, params, ins, out, output):
    """What typing says about the shape ``out`` of ``op`` applied to ``params`` and
    inputs of shapes ``ins`` (all _Shape): the operator's shape cases (OpSpec.shape)
    as ``when -> shape(out) = expression``; a case's ``requires`` are left out (the
    terms are well-typed), and so are dimensions the encoding does not model (those
    that depend on explicit pads). None when no case can be stated."""
    spec = OPS[op]
    values = dict(zip((p.name for p in spec.params), params))
    facts = []
    for case in spec.shape:
        env = _ShapeEnv(values, ins, output)
        when = [env.cond(c) for c in case.when]
        if any(w is None for w in when):
            continue
        shape = env.value(case.out)
        if not isinstance(shape, _Vec):
            raise RuleError(f"{op}: a shape case gives a {type(shape).__name__}, not a vector")
        fact = shape.equals_shape(out)
        facts.append(z3.Implies(z3.And(*when), fact) if when else fact)
    return z3.And(*facts) if facts else None


class _Vec:
    """A vector of Z3 ints: its length and element ``at(i)`` (``i`` a Python or Z3
    int); ``at`` gives None for an element the encoding does not model."""

    def __init__(self, length, at):
        self.length, self.at = length, at

    def equals_shape(self, out: _Shape):
        dims = []
        for i in range(_MAX_RANK):
            d = self.at(i)
            if d is not None:
                dims.append(z3.If(i < self.length, out[i] == d, out[i] == 0))
        return z3.And(out.rank() == self.length, *dims)

    def equals(self, other: "_Vec"):
        dims = []
        for i in range(_MAX_RANK):
            a, b = self.at(i), other.at(i)
            if a is None or b is None:
                return None
            dims.append(z3.Implies(i < self.length, a == b))
        return z3.And(self.length == other.length, *dims)


def _pick(items, i):
    """items[i] for a Z3 index: a chain of Ifs (0 past the end)."""
    if isinstance(i, int):
        return items[i] if 0 <= i < len(items) else z3.IntVal(0)
    if any(x is None for x in items):
        return None
    out = z3.IntVal(0)
    for k in reversed(range(len(items))):
        out = z3.If(i == k, items[k], out)
    return out


def _if(c, a, b):
    return None if a is None or b is None else z3.If(c, a, b)


class _ShapeEnv:
    """Shape expressions (ops.shapes) as Z3 terms over one operator application."""

    def __init__(self, params: dict, ins: list, output):
        self.params, self.ins, self.output = params, ins, output

    def value(self, e):
        if isinstance(e, shapes.Num):
            return z3.IntVal(e.value)
        if isinstance(e, shapes.In):
            t = self.ins[e.index]
            return _Vec(t.rank(), lambda i: t[i])
        if isinstance(e, shapes.P):
            v = self.params[e.name]
            if v.sort() == IntSeq:
                return _Vec(z3.Length(v), lambda i: v[i])
            return v
        if isinstance(e, shapes.OutIndex):
            return self.output
        fn = e.fn
        if fn == "pad":  # paddings are symbols here: explicit amounts are not modelled
            return None
        args = [self.value(a) for a in e.args]
        if fn == "vec":
            return _Vec(z3.IntVal(len(args)), lambda i: _pick(args, i))
        if fn == "len":
            return args[0].length
        if fn == "get":
            return args[0].at(args[1])
        if fn == "set":
            v, k, x = args
            return _Vec(v.length, lambda i: _if(k == i, x, v.at(i)))
        if fn == "pop":
            return _Vec(args[0].length - 1, args[0].at)
        if fn == "remove":
            v, k = args
            return _Vec(v.length - 1, lambda i: _if(i < k, v.at(i), v.at(i + 1)))
        if any(a is None for a in args):
            return None
        a, b = args
        if fn == "/":  # exact when b is 1, and linear there (stride-1 windows)
            return z3.If(b == 1, a, a / b)
        if fn == "%":
            return z3.If(b == 1, z3.IntVal(0), a % b)
        if fn == "max":
            return z3.If(a >= b, a, b)
        return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b}[fn]()

    def cond(self, c):
        """The condition as a Z3 formula; None when it is not modelled."""
        if c.kind == "pad-same":
            return self.params[c.args[0].name] == z3.StringVal("SAME")
        if c.kind == "pad-explicit":
            return self.params[c.args[0].name] != z3.StringVal("SAME")
        a, b = (self.value(x) for x in c.args)
        if a is None or b is None:
            return None
        if isinstance(a, _Vec):
            same = a.equals(b)
            if same is None or c.kind not in ("=", "!="):
                return None
            return same if c.kind == "=" else z3.Not(same)
        if c.kind == "bcast":
            return z3.Or(a == b, a == 1, b == 1)
        return _CMP[c.kind](a, b)


def _example_builds(rule: Rule) -> bool:
    try:
        return bool(rule.example) and builds_on(rule)
    except RuleError:
        return False


def _lhs_typing(enc: "_Encoder", pat, env: dict) -> list:
    """What typing requires of every operator application in a rule's left side (a
    concat's axis is within its rank and its operands agree off it, a conv's weight
    is of rank 4, ...): that one of its shape cases holds, with the case's
    ``requires``, which the quantified shape facts leave out. A rule
    rewrites only a matched, hence well-typed, left side, so these are hypotheses it
    may use; the right side's are not (that it is well-typed is what the rule must
    keep). Conditions the encoding does not model are left out."""
    facts = []

    def walk(p, output=None):
        if isinstance(p, Proj):
            return walk(p.pattern, enc.param(Lit(p.index) if isinstance(p.index, int) else p.index, env,
                                             z3.IntSort()))
        if not isinstance(p, App):
            return
        names = tuple(OPS[p.op].defaults)
        params = [enc.param(e, env, _param_sort(p.op, n)) for n, e in zip(names, p.params)]
        for t in p.inputs:
            walk(t)
        shape_env = _ShapeEnv(dict(zip(names, params)), [_Shape(enc.term(t, env)) for t in p.inputs],
                              output)
        cases = []  # (conditions, requirements) of each shape case
        for case in OPS[p.op].shape:
            when = [shape_env.cond(c) for c in case.when]
            if any(w is None for w in when):
                return  # a case the encoding cannot state: nothing to say
            cases.append((z3.And(*when), z3.And(*[r for r in map(shape_env.cond, case.requires)
                                                  if r is not None])))
        if OPS[p.op].broadcasts:
            # a graph's operands of lower rank are in no case (the bridge reshapes them
            # for the e-graph, the search matches them as they are)
            facts.extend(z3.Implies(when, needs) for when, needs in cases)
        elif cases:  # typed by the table, so in some case
            facts.append(z3.Or(*[z3.And(when, needs) for when, needs in cases]))

    walk(pat)
    return facts

