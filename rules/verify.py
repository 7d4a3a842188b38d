"""The Z3 verifier: a rule is proved when its two sides are equal under the operator
axioms of ``rules/axioms.rules``, the way TASO's verifier proves its rules.

Encoding. Tensors are an uninterpreted sort; every operator (per input count) is an
uninterpreted function of its parameters, then (``split``) the index of the output
read, an int (so ``(proj ?i ...)`` states a rule for every output), then its tensor
inputs. Parameters keep their kind: integers (axes) are Z3 ints, symbols
(``RELU``, ``SAME``, dtypes) Z3 strings, int vectors (strides, kernels, split sizes,
perms, literal shapes) Z3 sequences of ints. A tensor's shape is two functions,
``rank : Tensor -> Int`` and ``dim : Tensor x Int -> Int`` (dimensions past the rank
read 0), so shape reasoning stays in uninterpreted functions and linear arithmetic,
which Z3 decides far faster than sequence equations (ranks up to 6 are modelled);
every operator function comes with a quantified axiom stating what typing fixes
about the shape of its result (enough for the guards of the axioms).

Each axiom becomes one or two quantified equations (one per side that contains all
its variables, that side being the E-matching trigger; literal and computed parameters
of the trigger are abstracted to bound variables so the pattern stays uninterpreted).
A rule's variables become constants, its guards hypotheses (``weight`` and ``before``
only schedule saturation, so they are ignored), and so is what typing requires of its
left side, which a rule only ever rewrites once matched, hence well-typed (that each
operator application there is in one of its shape cases, with the case's requirements:
a concat's operands agree off its axis, a conv's weight has rank 4; stated where the
rule's example shows they can hold with the guards); the right side's requirements are
not (that the right side is well-typed is what the rule must keep). The prover asks
whether ``lhs != rhs`` is consistent with the axioms. Model-based quantifier instantiation is
off, so Z3 answers unsat (proved), or gives up once E-matching has nothing left to
instantiate, or at the per-rule limit: wall-clock seconds, or Z3's resource count
(``rlimit``), which depends on the work alone and not on the machine's load (the
generator's, so that two runs prove the same rules). An unsat core names the axioms a
proof used.

Soundness rests on the axioms, each of which the tests check numerically through the
kernels, and on two assumptions: every term the prover reasons about is well-typed
(as every term of a real graph is), so axiom guards state only what typing does not
imply; and tensors have rank 6 at most. Reading dimensions past the rank as 0 is a
convention every asserted fact keeps, so it proves nothing real shapes do not. A rule
not proved is "refuted" only when a float counterexample exists (on the example or on
other shapes); a model over uninterpreted functions is no counterexample.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import z3

from taso_egg.errors import RuleError, TasoEggError, VerificationError
from taso_egg.files import write_atomically
from taso_egg.ops import OPS, shapes

from . import semantics
from .instantiate import builds_on, check_rule_numerically, check_rule_on_other_shapes
from .lang import App, Guard, Lit, ParamOp, Proj, Proof, Rule, Var, load_rule_file, parse_rules, with_proof_records
from .workers import check_jobs, map_in_order, worker_pool

AXIOM_FILE = Path(__file__).with_name("axioms.rules")

STATUSES = ("proved", "refuted", "unknown", "unsupported")


@dataclass(frozen=True)
class ProofResult:
    rule: str                      # rule name
    status: str                    # one of STATUSES
    seconds: float
    axioms_used: tuple[str, ...]   # axioms in the unsat core (when proved)
    reason: str                    # why refuted/unknown/unsupported; "" when proved


def load_axioms() -> list[Rule]:
    """The axioms of ``rules/axioms.rules``."""
    return load_rule_file(AXIOM_FILE)


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
            names = ("axis",) if p.op == "concat" else tuple(OPS[p.op].defaults)
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
            names = ("axis",) if op == "concat" else tuple(OPS[op].defaults)
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
            if pat.op == "split":
                raise _Unsupported("split outside (proj I ...)")
            return self._app(pat, env, abstract, None)
        raise _Unsupported(f"not a tensor pattern: {pat!r}")

    def _app(self, app: App, env: dict, abstract, output):
        if app.op not in OPS:
            raise _Unsupported(f"operator {app.op!r}")
        names = ("axis",) if app.op == "concat" else tuple(OPS[app.op].defaults)
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
        names = ("axis",) if p.op == "concat" else tuple(OPS[p.op].defaults)
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


# --- proving -----------------------------------------------------------------------


class _AxiomSet:
    """Axioms encoded once (Z3's Python API makes encoding cost more than most proofs)."""

    def __init__(self, axioms):
        self.encoder = _Encoder()
        self.formulas: dict[str, z3.BoolRef] = {}
        for ax in axioms:
            try:
                self.formulas[ax.name] = z3.And(*_encode_axiom(self.encoder, ax))
            except _Unsupported as e:
                raise RuleError(f"{ax.where}: axiom cannot be encoded: {e}") from None
        self.trackers = {name: z3.Bool(f"axiom {name}") for name in self.formulas}
        self.shape_axioms: dict[tuple, z3.BoolRef] = {}

    def rule_encoder(self) -> _Encoder:
        enc = _Encoder()
        enc.funcs = dict(self.encoder.funcs)
        return enc

    def shapes_for(self, enc: _Encoder) -> list:
        for key, f in enc.funcs.items():
            if key not in self.shape_axioms:
                self.shape_axioms[key] = _shape_axiom(key, f)
        return [self.shape_axioms[k] for k in sorted(enc.funcs, key=str)
                if self.shape_axioms[k] is not None]


_AXIOM_SETS: dict[tuple, _AxiomSet] = {}


def _axiom_set(axioms) -> _AxiomSet:
    key = tuple(axioms)
    if key not in _AXIOM_SETS:
        if len(_AXIOM_SETS) >= 4:  # a few axiom lists at most (the file's, tests' subsets)
            _AXIOM_SETS.pop(next(iter(_AXIOM_SETS)))
        _AXIOM_SETS[key] = _AxiomSet(axioms)
    return _AXIOM_SETS[key]


# The float evidence of a rule the generator already checked on floats (its example and
# other shapes, or pinned to its example): the same checks with the same seeds.
FLOAT_CHECKED = "passed when the rule was generated"

# The generator's per-rule proof budget in Z3 resource units, in place of a wall-clock
# timeout: proofs of the shipped corpus use about 0.1 million, and 10 million is 2-9 s
# of a failing proof on this project's 2-core machine. Under it a proof's count depends
# on the rule alone (each runs in a fresh Z3 context), so two runs prove the same rules.
DEFAULT_RLIMIT = 10_000_000


# The check that a proof's hypotheses are consistent: the contradictions of the
# generator's batch-broadcasting matmuls showed within 0.11 million steps; consistent
# hypotheses keep E-matching the shape axioms up to the limit (0.3 million, about 0.1 s
# per proved rule), whatever limit the proof itself had.
CONSISTENCY_RLIMIT = 300_000
# Under a resource limit a proof also stops at this wall-clock time. Z3's resource count
# can stall: a generated division rule over a ones tensor of symbolic shape ran 25 min
# at rlimit 10 million (1.5 s at 1 million), while every proved rule of session 14's
# size-3 corpus took under 0.6 s and its 16,921 unknown ones 0.06 s on average. So
# only a stall meets this bound, and proofs do not depend on the machine's load.
RLIMIT_SAFETY_S = 5.0


def _solver(axset: _AxiomSet | None, facts: list, timeout_s: float, rlimit: int) -> z3.Solver:
    """A solver holding the axioms (tracked, for the unsat core; none without
    ``axset``) and ``facts``. Under an ``rlimit`` it works in a fresh Z3 context: the
    ids of the terms earlier proofs left in the process's context steer Z3's search,
    so a proof's outcome, resource count and unsat core would depend on which proofs
    its worker ran before."""
    ctx = z3.Context() if rlimit else None
    move = (lambda f: f.translate(ctx)) if ctx else (lambda f: f)
    solver = z3.Solver(ctx=ctx)
    if rlimit:
        solver.set("rlimit", rlimit)
        solver.set("timeout", int(RLIMIT_SAFETY_S * 1000))
    else:
        solver.set("timeout", max(1, int(timeout_s * 1000)))
    solver.set("smt.mbqi", False)
    for name, formula in (axset.formulas.items() if axset else ()):
        solver.assert_and_track(move(formula), move(axset.trackers[name]))
    solver.add(*[move(f) for f in facts])
    return solver


def prove_rule(rule: Rule, timeout_s: float = 10.0, axioms=None,
               float_checked: bool = False, rlimit: int = 0) -> ProofResult:
    """Prove ``rule`` (each ``lhs[i] = rhs[i]``) from ``axioms`` (default: the file's)
    within ``timeout_s`` seconds, or, when ``rlimit`` is positive, within that many Z3
    resource units instead (a bound that does not depend on the machine's load).
    A rule not proved is checked on floats for the reason (refuted on a disagreement),
    unless ``float_checked`` says it passed those checks already."""
    if rlimit < 0 or (not rlimit and not timeout_s > 0):
        raise RuleError(f"{rule.where}: proof limit must be positive, got "
                        f"{f'rlimit {rlimit}' if rlimit else f'timeout {timeout_s}'}")
    start = time.perf_counter()
    axset = _axiom_set(load_axioms() if axioms is None else axioms)

    def result(status, reason="", used=()):
        return ProofResult(rule.name, status, time.perf_counter() - start, tuple(used), reason)

    enc = axset.rule_encoder()
    facts = []
    try:
        env = {v: z3.Const(v, s) for v, s in _var_sorts(rule).items()}
        facts += [_past_rank_zero(_Shape(env[v])) for v in rule.tensor_vars()]
        for g in rule.guards:
            formula = enc.guard(g, env)
            if formula is not None:
                facts.append(formula)
        # Typing's requirements of the left side, where the example shows that they can
        # hold with the guards (else they might contradict them: a proof of nothing;
        # deciding that with Z3 costs more than most proofs).
        if _example_builds(rule):
            for pat in rule.lhs:
                facts += _lhs_typing(enc, pat, env)
        sides = [enc.term(l, env) == enc.term(r, env) for l, r in zip(rule.lhs, rule.rhs)]
    except _Unsupported as e:
        return result("unsupported", str(e))
    except (z3.Z3Exception, TypeError) as e:  # e.g. arithmetic on a vector parameter
        return result("unsupported", f"parameter expressions of mismatched kinds: {e}")
    hypotheses = facts + axset.shapes_for(enc)
    solver = _solver(axset, hypotheses + [z3.Not(z3.And(*sides))], timeout_s, rlimit)
    answer = solver.check()
    if answer == z3.unsat:
        # Hypotheses that contradict each other prove anything: such a rule is in no
        # shape case the e-graph holds (a batched matmul broadcasting its batch dims).
        if _solver(None, hypotheses, 0, CONSISTENCY_RLIMIT).check() == z3.unsat:
            return result("unknown", "no proof: its guards and what typing asks of its left side "
                                     "contradict each other (a proof of nothing)")
        core = {str(b) for b in solver.unsat_core()}
        return result("proved", used=[a for a, t in axset.trackers.items() if str(t) in core])
    reason = solver.reason_unknown()
    if answer == z3.sat or reason == "(incomplete quantifiers)":
        why = "no proof from the axioms (E-matching ran out of instances)"
    elif reason in ("timeout", "canceled"):
        if rlimit and time.perf_counter() - start >= RLIMIT_SAFETY_S:
            why = (f"no proof within the {RLIMIT_SAFETY_S:g} s that bound a proof under a resource limit "
                   f"(Z3's resource count stalled short of {rlimit:,})")
        else:
            why = (f"no proof within Z3's resource limit ({rlimit:,})" if rlimit
                   else f"no proof within the {timeout_s:g} s timeout")
    else:
        why = f"no proof from the axioms (Z3: {reason})"
    if float_checked:
        return result("unknown", f"{why}; float check: {FLOAT_CHECKED}")
    agrees, evidence = _float_evidence(rule)
    if agrees is False:
        return result("refuted", f"{why}; float counterexample: {evidence}")
    return result("unknown", f"{why}; float check: {evidence}")


def _float_evidence(rule: Rule, trials: int = 3, seed: int = 0) -> tuple[bool | None, str]:
    """Float agreement on the example and on ``trials`` other shapes: (True, what was
    checked), (False, the disagreement) or (None, why nothing could be checked)."""
    if not rule.example:
        return None, f"{rule.where}: no :example to vary"
    try:
        check_rule_numerically(rule, seed=seed)
        checked = check_rule_on_other_shapes(rule, trials, seed)
    except VerificationError as e:
        return False, str(e)
    except RuleError as e:  # the example itself violates a guard or does not type-check
        return None, str(e)
    if not checked:
        return None, (f"{rule.where}: no shape other than the example (dims in 1..4) "
                      f"satisfies the guards and type-checks")
    shapes = "; ".join(", ".join(f"?{k} {list(v)}" for k, v in c.items()) for c in checked)
    return True, f"agrees on the example and {len(checked)} other shape(s): {shapes}"


def prove_and_check(rule: Rule, timeout_s: float = 10.0, axioms=None,
                    float_checked: bool = False, rlimit: int = 0) -> ProofResult:
    """:func:`prove_rule`, then the float check a proof must also pass (on the example
    and on other shapes): a proved rule whose floats disagree is ``refuted``.
    ``float_checked``: the rule passed these float checks already (the generator's)."""
    res = prove_rule(rule, timeout_s, axioms, float_checked, rlimit)
    if res.status != "proved" or float_checked:
        return res
    try:
        check_rule_numerically(rule)
        check_rule_on_other_shapes(rule)
    except TasoEggError as err:
        return ProofResult(res.rule, "refuted", res.seconds, res.axioms_used,
                           f"proved from the axioms but the float check fails: {err}")
    return res


def _prove_in_worker(job: tuple) -> ProofResult:
    rule, timeout_s, float_checked, rlimit = job
    return prove_and_check(rule, timeout_s, None, float_checked, rlimit)  # axioms encoded once per worker


def verify_rules(rules, timeout_s: float = 10.0, progress=None, jobs: int = 1,
                 float_checked: bool = False, pool=None, rlimit: int = 0) -> list[ProofResult]:
    """:func:`prove_and_check` every rule (axioms loaded once per process), in rule
    order; ``progress(i, n, result)`` is called after each (``i`` counts from 0).
    ``jobs`` > 1 proves in that many worker processes (or in ``pool``, a
    :func:`~.workers.worker_pool` of ``jobs`` workers), with the same results: each
    proof is independent of the others."""
    rules = list(rules)
    check_jobs(jobs)
    if pool is None and jobs > 1 and len(rules) > 1:
        with worker_pool(min(jobs, len(rules))) as own:
            return verify_rules(rules, timeout_s, progress, jobs, float_checked, own, rlimit)
    if pool is None:
        axioms = load_axioms()
        results_iter = (prove_and_check(r, timeout_s, axioms, float_checked, rlimit) for r in rules)
    else:
        results_iter = map_in_order(pool, _prove_in_worker, [(r, timeout_s, float_checked, rlimit) for r in rules],
                                    jobs)
    results = []
    for i, res in enumerate(results_iter):
        results.append(res)
        if progress is not None:
            progress(i, len(rules), res)
    return results


def verify_file(path, timeout_s: float = 10.0, progress=None, jobs: int = 1) -> list:
    """Prove every rule of ``path`` (in ``jobs`` processes), float-check the proved
    ones, and rewrite the file with the records, all at once at the end (an
    interrupted run leaves the file as it was). Returns ``[(rule, Proof)]``."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    rules = parse_rules(text, str(path))
    results = verify_rules(rules, timeout_s, progress=progress, jobs=jobs)
    proofs, out = {}, []
    for rule, res in zip(rules, results):
        found_by = rule.proof.found_by if rule.proof and rule.proof.found_by else "hand"
        proof = Proof(res.status, found_by, tuple(res.axioms_used), round(res.seconds, 4), res.reason)
        proofs[rule.name] = proof
        out.append((rule, proof))
    write_atomically(path, lambda tmp: Path(tmp).write_text(with_proof_records(text, proofs, str(path)),
                                                            encoding="utf-8"), RuleError)
    return out


def float_check(rule: Rule, trials: int = 3, seed: int = 0) -> tuple[bool, str]:
    """True when both sides agree on random float data on the rule's :example and on
    up to ``trials`` other shapes (its dimension values re-mapped consistently into
    1..4; variants violating a guard or not type-checking are skipped). False, with
    the reason, on a disagreement or when no other shape could be checked."""
    agrees, why = _float_evidence(rule, trials, seed)
    return agrees is True, why


__all__ = ["ProofResult", "STATUSES", "DEFAULT_RLIMIT", "load_axioms", "prove_rule", "prove_and_check",
           "verify_rules", "verify_file", "float_check", "AXIOM_FILE"]
