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

from functools import lru_cache

from ..ops import OPS

MAX_RANK = 6
LEAVES = ("input", "weight")


def constructor(op: str) -> str:
    return "".join(part.capitalize() for part in op.split("_"))


OP_OF_CONSTRUCTOR = {constructor(op): op for op in OPS}


def param_kind(op: str, name: str, default) -> str:
    if name == "padding" or isinstance(default, tuple):
        return "IVec"
    if isinstance(default, bool) or isinstance(default, int):
        return "i64"
    if isinstance(default, float):
        return "f64"
    return "String"


def op_params(op: str) -> list[tuple[str, str]]:
    """(name, egglog sort) of an operator's parameters, in declaration order."""
    spec = OPS[op]
    if op == "opaque":
        return [("key", "String")]
    params = [(k, param_kind(op, k, v)) for k, v in spec.defaults.items()]
    if op == "weight":
        params.insert(0, ("id", "i64"))
    return params


def tensor_arity(op: str) -> int:
    """Tensor inputs in the e-graph: optional ones (conv bias) are left out and binary
    concat takes two."""
    if op == "concat":
        return 2
    return OPS[op].inputs[0]


def returns_tuple(op: str) -> bool:
    return op in ("split", "opaque")


# --- literals ------------------------------------------------------------------------

def encode(kind: str, value, name: str = "") -> str:
    if name == "padding":
        if value == "SAME":
            return "(vec-empty)"
        value = (0, 0, 0, 0) if value == "VALID" else tuple(value)
    if kind == "IVec":
        return "(vec-of " + " ".join(str(int(v)) for v in value) + ")" if value else "(vec-empty)"
    if kind == "i64":
        return str(int(value))
    if kind == "f64":
        text = repr(float(value))
        return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def decode_padding(pads: tuple):
    if not pads:
        return "SAME"
    return "VALID" if pads == (0, 0, 0, 0) else tuple(pads)


# --- the program -----------------------------------------------------------------------

@lru_cache(maxsize=1)
def declarations() -> str:
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
        if op == "opaque":
            sorts.append("TList")
        else:
            sorts += ["T"] * tensor_arity(op)
        out = "TTup" if returns_tuple(op) else "T"
        lines.append(f"(constructor {constructor(op)} ({' '.join(sorts)}) {out})")
    lines += [
        "(function shape (T) IVec :no-merge)",
        "(function dtype (T) String :no-merge)",
        "(function wlo (T) i64 :merge (min old new))",
        "(function whi (T) i64 :merge (max old new))",
        "(relation pending (T T))",
        "(ruleset analysis)",
        "(ruleset rewrites)",
        "(ruleset multi)",
    ]
    return "\n".join(lines) + "\n" + "\n".join(_analysis_rules()) + "\n"


def term_pattern(op: str, out: str = "x") -> tuple[str, list[str], list[str]]:
    """``(= x (Op p_a p_b t0 t1))`` and the names of its param and tensor variables."""
    params = [f"p_{name}" for name, _ in op_params(op)]
    tensors = [f"t{i}" for i in range(tensor_arity(op))]
    return f"(= {out} ({constructor(op)} {' '.join(params + tensors)}))", params, tensors


def _rule(facts: list[str], actions: list[str]) -> str:
    return f"(rule ({' '.join(facts)}) ({' '.join(actions)}) :ruleset analysis)"


def _shape_rule(op: str, guards: list[str], shape: str) -> str:
    pattern, _, tensors = term_pattern(op)
    binds = [f"(= s{i} (shape {t}))" for i, t in enumerate(tensors)]
    return _rule([pattern] + binds + guards, [f"(set (shape x) {shape})"])


def _g(v, i):
    return f"(vec-get {v} {i})"


def _conv_like(op: str, kernel_from_weight: bool, summand: bool = False) -> list[str]:
    """Conv and pooling output shapes for SAME (empty pads) and explicit pads; with
    ``summand`` the third input must have the output's shape (conv2d_sum)."""
    if kernel_from_weight:
        kh, kw, ch = _g("s1", 2), _g("s1", 3), _g("s1", 0)
        guards = ["(= (vec-length s1) 4)",
                  f"(> {_g('s1', 1)} 0)", f"(= (% {_g('s0', 1)} {_g('s1', 1)}) 0)",
                  f"(= (% {ch} (/ {_g('s0', 1)} {_g('s1', 1)})) 0)"]
    else:
        kh, kw, ch = _g("p_kernel", 0), _g("p_kernel", 1), _g("s0", 1)
        guards = []
    guards = ["(= (vec-length s0) 4)"] + guards
    sh, sw = _g("p_strides", 0), _g("p_strides", 1)
    h, w = _g("s0", 2), _g("s0", 3)
    same = f"(vec-of {_g('s0', 0)} {ch} (/ (+ {h} (- {sh} 1)) {sh}) (/ (+ {w} (- {sw} 1)) {sw}))"
    oh = f"(+ (/ (- (+ {h} (+ {_g('p_padding', 0)} {_g('p_padding', 2)})) {kh}) {sh}) 1)"
    ow = f"(+ (/ (- (+ {w} (+ {_g('p_padding', 1)} {_g('p_padding', 3)})) {kw}) {sw}) 1)"
    explicit = f"(vec-of {_g('s0', 0)} {ch} {oh} {ow})"
    fits = [f"(>= (+ {h} (+ {_g('p_padding', 0)} {_g('p_padding', 2)})) {kh})",
            f"(>= (+ {w} (+ {_g('p_padding', 1)} {_g('p_padding', 3)})) {kw})"]
    return [
        _shape_rule(op, guards + ["(= (vec-length p_padding) 0)"] + ([f"(= s2 {same})"] if summand else []),
                    same),
        _shape_rule(op, guards + ["(= (vec-length p_padding) 4)"] + fits +
                    ([f"(= s2 {explicit})"] if summand else []), explicit),
    ]


def _broadcast_rules(op: str) -> list[str]:
    """Equal-rank NumPy broadcasting, one rule per rank (the bridge inserts reshapes
    so both operands have the same rank). A dim pair is valid when equal or one is 1:
    (a-b)(a-1)(b-1) == 0."""
    rules = []
    for r in range(MAX_RANK + 1):
        guards = [f"(= (vec-length s0) {r})", f"(= (vec-length s1) {r})"]
        dims = []
        for i in range(r):
            a, b = _g("s0", i), _g("s1", i)
            guards.append(f"(= (* (* (- {a} {b}) (- {a} 1)) (- {b} 1)) 0)")
            dims.append(f"(max {a} {b})")
        rules.append(_shape_rule(op, guards, f"(vec-of {' '.join(dims)})" if dims else "(vec-empty)"))
    return rules


def _shape_rules() -> list[str]:
    rules = []
    for leaf in ("input", "weight") + tuple(op for op in OPS if op.startswith("const_")):
        rules.append(_shape_rule(leaf, [], "p_shape"))
    for op in ("relu", "sigmoid", "tanh", "batchnorm"):
        rules.append(_shape_rule(op, [], "s0"))
    rules.append(_shape_rule("smul", ["(= (vec-length s1) 0)"], "s0"))
    for op in ("bn_factor", "bn_shift"):  # per-channel vectors of one length
        rules.append(_shape_rule(op, ["(= (vec-length s0) 1)"] + [
            f"(= s0 s{i})" for i in range(1, tensor_arity(op))], "s0"))
    rules += _broadcast_rules("ewadd") + _broadcast_rules("ewmul")
    rules += _conv_like("conv2d", True) + _conv_like("conv2d_sum", True, summand=True)
    rules += _conv_like("maxpool2d", False) + _conv_like("avgpool2d", False)
    rules.append(_shape_rule("global_avgpool", ["(= (vec-length s0) 4)"],
                             f"(vec-of {_g('s0', 0)} {_g('s0', 1)} 1 1)"))
    # matmul: equal ranks with equal batch dims, or a 2-D right operand (x @ W)
    rules.append(_shape_rule("matmul", [
        "(= r (vec-length s0))", "(= r (vec-length s1))", "(>= r 2)",
        "(= (vec-pop (vec-pop s0)) (vec-pop (vec-pop s1)))",
        f"(= {_g('s0', '(- r 1)')} {_g('s1', '(- r 2)')})"],
        f"(vec-set s0 (- r 1) {_g('s1', '(- r 1)')})"))
    rules.append(_shape_rule("matmul", [
        "(= r (vec-length s0))", "(> r 2)", "(= (vec-length s1) 2)",
        f"(= {_g('s0', '(- r 1)')} {_g('s1', 0)})"],
        f"(vec-set s0 (- r 1) {_g('s1', 1)})"))
    rules.append(_shape_rule("concat", [
        "(= (vec-length s0) (vec-length s1))", "(>= p_axis 0)", "(< p_axis (vec-length s0))",
        "(= (vec-remove s0 p_axis) (vec-remove s1 p_axis))"],
        f"(vec-set s0 p_axis (+ {_g('s0', 'p_axis')} {_g('s1', 'p_axis')}))"))
    rules.append(_rule(
        ["(= x (Proj (Split p_axis p_sizes t0) i))", "(= s0 (shape t0))",
         "(>= i 0)", "(< i (vec-length p_sizes))"],
        ["(set (shape x) (vec-set s0 p_axis (vec-get p_sizes i)))"]))
    rules.append(_shape_rule("reshape", [], "p_shape"))
    for r in range(1, MAX_RANK + 1):
        rules.append(_shape_rule("transpose", [f"(= (vec-length s0) {r})", f"(= (vec-length p_perm) {r})"],
                                 "(vec-of " + " ".join(_g("s0", _g("p_perm", i)) for i in range(r)) + ")"))
    rules.append(_shape_rule("enlarge", [
        "(= (vec-length s0) 4)", "(= (vec-length s1) 4)",
        f"(>= {_g('s1', 2)} {_g('s0', 2)})", f"(>= {_g('s1', 3)} {_g('s0', 3)})",
        f"(= (% (- {_g('s1', 2)} {_g('s0', 2)}) 2) 0)", f"(= (% (- {_g('s1', 3)} {_g('s0', 3)}) 2) 0)"],
        f"(vec-of {_g('s0', 0)} {_g('s0', 1)} {_g('s1', 2)} {_g('s1', 3)})"))
    rules.append(_shape_rule("merge_gconv", [
        "(= (vec-length s0) 4)", "(> p_count 0)", "(= (% p_groups p_count) 0)"],
        f"(vec-of {_g('s0', 0)} (* {_g('s0', 1)} p_count) {_g('s0', 2)} {_g('s0', 3)})"))
    return rules


def _dtype_rules() -> list[str]:
    """Leaves carry their dtype; every other operator needs one dtype on all its
    tensor inputs and keeps it (ONNX's rule for every operator of the table)."""
    rules = []
    for op in OPS:
        if op == "opaque" or returns_tuple(op):
            continue  # opaque outputs get theirs from the bridge; split's below
        pattern, _, tensors = term_pattern(op)
        if OPS[op].is_leaf:
            rules.append(_rule([pattern], ["(set (dtype x) p_dtype)"]))
            continue
        rules.append(_rule([pattern] + [f"(= d (dtype {t}))" for t in tensors], ["(set (dtype x) d)"]))
    rules.append(_rule(["(= x (Proj (Split p_axis p_sizes t0) i))", "(= d (dtype t0))"],
                       ["(set (dtype x) d)"]))
    return rules


def _weight_order_rules() -> list[str]:
    rules = [_rule(["(= x (Weight p_id p_name p_shape p_dtype))"],
                   ["(set (wlo x) p_id)", "(set (whi x) p_id)"])]
    for op in OPS:
        if OPS[op].is_leaf or op == "opaque" or returns_tuple(op):
            continue
        pattern, _, tensors = term_pattern(op)
        if not tensors:
            continue
        facts = [pattern] + [f"(= lo{i} (wlo {t}))" for i, t in enumerate(tensors)] + \
                [f"(= hi{i} (whi {t}))" for i, t in enumerate(tensors)]
        lo, hi = "lo0", "hi0"
        for i in range(1, len(tensors)):
            lo, hi = f"(min {lo} lo{i})", f"(max {hi} hi{i})"
        rules.append(_rule(facts, [f"(set (wlo x) {lo})", f"(set (whi x) {hi})"]))
    rules.append(_rule(["(= x (Proj (Split p_axis p_sizes t0) i))", "(= lo (wlo t0))", "(= hi (whi t0))"],
                       ["(set (wlo x) lo)", "(set (whi x) hi)"]))
    return rules


def _analysis_rules() -> list[str]:
    # A rewrite's result joins the class it replaces only with the same shape and dtype.
    commit = _rule(["(pending a b)", "(= s (shape a))", "(= s (shape b))",
                    "(= d (dtype a))", "(= d (dtype b))"], ["(union a b)"])
    return _shape_rules() + _dtype_rules() + _weight_order_rules() + [commit]
