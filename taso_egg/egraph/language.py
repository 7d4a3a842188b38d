"""The tensor language in egglog, generated from the operator table.

One constructor per operator (CamelCase of its table name), its parameters first
(i64, f64, String, or IVec = Vec i64), then its tensor inputs (sort T). Multi-output
operators (split, opaque) build a TTup and are read through ``Proj``. Concat is
binary here (TASO's rules are binary); n-ary concats nest on the way in and flatten
on the way out.

Analyses, all filled by rules in the ``analysis`` ruleset:
- ``shape(T) -> IVec`` with no merge: two shapes for one e-class is an "Illegal
  merge" error, a free alarm for an unsound rewrite;
- ``wlo``/``whi(T) -> i64``: the smallest/largest weight id a weight-only tensor is
  computed from. Multi-pattern rules use them to match each pair of tensors once and
  never their own output.

Rewrites never union directly: they record ``(pending old new)`` and the ``commit``
rule unions the pair only once ``new`` has a shape equal to ``old``'s, so a rewrite
whose result has no valid shape never fires.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..ops import OPS
from ..ops.base import Param
from ..ops.shapes import Case, Cond, Fn, In, Num, OutIndex, P

# Egglog sort of each parameter kind (ops.base.PARAM_KINDS); "data" never enters.
SORTS = {"int": "i64", "float": "f64", "symbol": "String", "activation": "String",
         "dtype": "String", "ints": "IVec", "dims": "IVec", "padding": "IVec"}


@dataclass(frozen=True)
class Ruleset:
    """An egglog ruleset as a value: what declares it, what runs it, and the ruleset
    of its probes (rules with its rules' queries and no actions, which count their
    matches before a step; a probe is named ``probe_name(rule)``)."""

    name: str

    def declare(self) -> str:
        return f"(ruleset {self.name})"

    def run(self) -> str:
        return f"(run {self.name})"

    def run_with(self, scheduler: str) -> str:
        """Run once under a scheduler: ``scheduler`` is its egglog expression."""
        return f"(let-scheduler cut {scheduler}) (run-with cut {self.name})"

    @property
    def probes(self) -> "Ruleset":
        return Ruleset(_PROBE + self.name)


_PROBE = "probe-"
ANALYSIS = Ruleset("analysis")   # the shape, dtype and weight-order analyses
# Rules that move a part of a split up one operator (Rule.moves_a_part_up): run to a
# fixpoint at the start of every iteration, so that a select reaches the layers it prunes
# before other rules fill the e-graph to its node limit.
SELECT = Ruleset("select")
REWRITES = Ruleset("rewrites")   # single-pattern rules
MULTI = Ruleset("multi")         # two-output rules (several left-hand patterns)
STEPS = (SELECT, REWRITES, MULTI)  # an iteration runs these, in this order


def ruleset_of(rule) -> Ruleset:
    return MULTI if rule.multi else SELECT if rule.moves_a_part_up else REWRITES


def probe_name(rule_name: str) -> str:
    return _PROBE + rule_name


def probed_rule(probe: str) -> str:
    """The rule a probe counts for."""
    return probe[len(_PROBE):]


def constructor(op: str) -> str:
    return "".join(part.capitalize() for part in op.split("_"))


OP_OF_CONSTRUCTOR = {constructor(op): op for op in OPS}


def egraph_params(op: str) -> tuple[Param, ...]:
    """The parameters of an operator's e-graph constructor, in order."""
    spec = OPS[op]
    return spec.params if spec.egraph_params is None else spec.egraph_params


def op_params(op: str) -> list[tuple[str, str]]:
    """(name, egglog sort) of an operator's parameters, in declaration order."""
    return [(p.name, SORTS[p.kind]) for p in egraph_params(op)]


def tensor_arity(op: str) -> int:
    """Tensor inputs in the e-graph: optional ones (conv bias) are left out, and the
    table says where the e-graph's form differs (concat is binary)."""
    spec = OPS[op]
    return spec.inputs[0] if spec.egraph_inputs is None else spec.egraph_inputs


def takes_list(op: str) -> bool:
    """Variadic operators without a fixed e-graph arity take a TList (opaque nodes)."""
    spec = OPS[op]
    return spec.inputs[1] is None and spec.egraph_inputs is None


def returns_tuple(op: str) -> bool:
    return OPS[op].multi_output


def _check_sorts() -> None:
    for op in OPS:
        for p in egraph_params(op):
            if p.kind not in SORTS:
                raise RuntimeError(f"{op}.{p.name}: parameter kind {p.kind!r} has no egglog sort")


_check_sorts()


# --- literals ------------------------------------------------------------------------

def encode(sort: str, value) -> str:
    """An egglog literal of sort ``sort`` (IVec, i64, f64, String)."""
    if sort == "IVec":
        return "(vec-of " + " ".join(str(int(v)) for v in value) + ")" if value else "(vec-empty)"
    if sort == "i64":
        return str(int(value))
    if sort == "f64":
        text = repr(float(value))
        return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def encode_param(param: Param, value) -> str:
    """The egglog literal of a value of operator parameter ``param``: a padding is its
    explicit pads (SAME: the empty vector, VALID: four zeros)."""
    if param.kind == "padding":
        if value == "SAME":
            return "(vec-empty)"
        value = (0, 0, 0, 0) if value == "VALID" else tuple(value)
    return encode(SORTS[param.kind], value)


def decode_padding(pads: tuple):
    if not pads:
        return "SAME"
    return "VALID" if pads == (0, 0, 0, 0) else tuple(pads)


# --- the program -----------------------------------------------------------------------

@lru_cache(maxsize=1)
def declarations() -> str:
    """The whole language: :func:`base_declarations` and every operator's analysis rules."""
    return base_declarations() + "".join(analysis_rules(op) for op in OPS)


@lru_cache(maxsize=1)
def base_declarations() -> str:
    """Sorts, constructors, analyses and rulesets, and the ``commit`` rule; no operator's
    analysis rules. Egglog compiles each rule it is given (about 0.2 s for every
    operator's), so saturation adds an operator's with :func:`analysis_rules` once the
    operator can be in the e-graph."""
    lines = [
        "(sort IVec (Vec i64))",
        "(sort T)",
        "(sort TTup)",
        "(sort TList)",
        "(constructor TNil () TList)",
        "(constructor TCons (T TList) TList)",
        "(constructor Proj (TTup i64) T)",
    ]
    for op in OPS:
        sorts = [s for _, s in op_params(op)]
        sorts += ["TList"] if takes_list(op) else ["T"] * tensor_arity(op)
        out = "TTup" if returns_tuple(op) else "T"
        lines.append(f"(constructor {constructor(op)} ({' '.join(sorts)}) {out})")
    lines += [
        "(function shape (T) IVec :no-merge)",
        "(function dtype (T) String :no-merge)",
        "(function wlo (T) i64 :merge (min old new))",
        "(function whi (T) i64 :merge (max old new))",
        "(relation pending (T T))",
        *(r.declare() for r in (ANALYSIS, *STEPS)),
        # A rewrite's result joins the class it replaces only with the same shape and dtype.
        _rule(["(pending a b)", "(= s (shape a))", "(= s (shape b))",
               "(= d (dtype a))", "(= d (dtype b))"], ["(union a b)"]),
    ]
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=None)
def analysis_rules(op: str) -> str:
    """The analysis rules of e-nodes of ``op``: its shape cases (OpSpec.shape), its
    dtype and its weight-order range (empty for operators the bridge types itself)."""
    rules = [_shape_rule(op, case) for case in OPS[op].shape]
    if not takes_list(op):
        rules += _dtype_rules(op) + _weight_order_rules(op)
    return "".join(r + "\n" for r in rules)


def _rule(facts: list[str], actions: list[str]) -> str:
    return f"(rule ({' '.join(facts)}) ({' '.join(actions)}) :ruleset {ANALYSIS.name})"


def _shape_rule(op: str, case: Case) -> str:
    pattern, tensors = _output_pattern(op)
    binds = [f"(= s{i} (shape {t}))" for i, t in enumerate(tensors)]
    guards = [_cond(c) for c in case.when + case.requires]
    return _rule([pattern] + binds + guards, [f"(set (shape x) {_expr(case.out)})"])


_SHAPE_FNS = {"+": "+", "-": "-", "*": "*", "/": "/", "%": "%", "max": "max", "len": "vec-length",
              "get": "vec-get", "set": "vec-set", "pop": "vec-pop", "remove": "vec-remove"}


def _expr(e) -> str:
    if isinstance(e, In):
        return f"s{e.index}"
    if isinstance(e, P):
        return f"p_{e.name}"
    if isinstance(e, Num):
        return str(e.value)
    if isinstance(e, OutIndex):
        return "i"
    if isinstance(e, Fn):
        args = [_expr(a) for a in e.args]
        if e.fn == "vec":
            return f"(vec-of {' '.join(args)})" if args else "(vec-empty)"
        if e.fn == "pad":  # explicit pads are the vector itself (SAME: empty)
            return f"(vec-get {args[0]} {args[1]})"
        return f"({_SHAPE_FNS[e.fn]} {' '.join(args)})"
    raise TypeError(f"not a shape expression: {e!r}")


def _cond(c: Cond) -> str:
    args = [_expr(a) for a in c.args]
    if c.kind == "bcast":  # (a-b)(a-1)(b-1) == 0: equal, or one of them 1
        a, b = args
        return f"(= (* (* (- {a} {b}) (- {a} 1)) (- {b} 1)) 0)"
    if c.kind == "pad-same":
        return f"(= (vec-length {args[0]}) 0)"
    if c.kind == "pad-explicit":
        return f"(= (vec-length {args[0]}) 4)"
    return f"({c.kind} {' '.join(args)})"


def _output_pattern(op: str) -> tuple[str, list[str]]:
    """The pattern binding ``x`` to an output of ``op`` (through Proj for a
    multi-output operator, output index ``i``) and its tensor variables."""
    params = [f"p_{p.name}" for p in egraph_params(op)]
    tensors = [f"t{i}" for i in range(tensor_arity(op))]
    term = f"({constructor(op)} {' '.join(params + tensors)})"
    return (f"(= x (Proj {term} i))" if returns_tuple(op) else f"(= x {term})"), tensors


def _dtype_rules(op: str) -> list[str]:
    """Leaves carry their dtype; other operators need one dtype on all their tensor
    inputs and keep it (ONNX's rule for most operators), unless OpSpec.out_dtype says
    otherwise (a test's bool, where's branches, cast's parameter)."""
    pattern, tensors = _output_pattern(op)
    if OPS[op].is_leaf:
        return [_rule([pattern], ["(set (dtype x) p_dtype)"])]
    how = OPS[op].out_dtype
    if how.startswith("input:"):
        return [_rule([pattern, f"(= d (dtype t{how[6:]}))"], ["(set (dtype x) d)"])]
    if how.startswith("param:"):
        return [_rule([pattern], [f"(set (dtype x) p_{how[6:]})"])]
    if how:
        return [_rule([pattern], [f"(set (dtype x) {encode('String', how)})"])]
    return [_rule([pattern] + [f"(= d (dtype {t}))" for t in tensors], ["(set (dtype x) d)"])]


def _weight_order_rules(op: str) -> list[str]:
    """wlo/whi: leaves with an id (weights) start the range; other operators take the
    smallest and largest over their inputs."""
    rules = []
    pattern, tensors = _output_pattern(op)
    if "id" in (p.name for p in egraph_params(op)):
        rules.append(_rule([pattern], ["(set (wlo x) p_id)", "(set (whi x) p_id)"]))
    if OPS[op].is_leaf or not tensors:
        return rules
    facts = [pattern] + [f"(= lo{i} (wlo {t}))" for i, t in enumerate(tensors)] + \
            [f"(= hi{i} (whi {t}))" for i, t in enumerate(tensors)]
    lo, hi = "lo0", "hi0"
    for i in range(1, len(tensors)):
        lo, hi = f"(min {lo} lo{i})", f"(max {hi} hi{i})"
    rules.append(_rule(facts, [f"(set (wlo x) {lo})", f"(set (whi x) {hi})"]))
    return rules
