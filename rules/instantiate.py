"""Concrete instances of rules: build both sides of a rule on its ``:example`` shapes
as one :class:`~taso_egg.graph.Graph`, and check numerically that they agree.

This is the cheap, always-available soundness check of the corpus (the Z3 verifier
is the other): a rule whose two sides disagree on random data is unsound.
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator, Mapping

import numpy as np

from taso_egg.errors import RuleError, TasoEggError
from taso_egg.graph import Graph, Tensor
from taso_egg.ops import CONCAT, OPS

from . import semantics
from .ast import App, Guard, Lit, ParamOp, Proj, Rule, Var, walk_vars

# The numeric checker's reading of the guards: comparisons as rules/semantics.py states
# them; `weight` holds by construction (every (weight ?v) variable is built as a weight
# leaf) and `before` orders saturation only, so both hold.
_NUMERIC = semantics.backend("numeric checker", guards={
    **{k: "evaluate" for k in semantics.COMPARISONS},
    "weight": "holds", "before": "holds"})


def example_values(rule: Rule, bindings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The rule's example with ``bindings`` laid over it (keys with or without ``?``);
    RuleError when a variable is left without a value."""
    values = dict(rule.example)
    for k, v in (bindings or {}).items():
        values[k[1:] if k.startswith("?") else k] = _freeze(v)
    tensors, params = rule.tensor_vars(), rule.param_vars()
    unknown = sorted(set(values) - set(tensors) - set(params))
    if unknown:
        raise RuleError(f"{rule.where}: bindings for unknown variable(s) "
                        f"{', '.join('?' + u for u in unknown)}")
    missing = [v for v in tensors + params if v not in values]
    if missing:
        what = "has no :example" if not rule.example else "example does not bind"
        raise RuleError(f"{rule.where}: {what} " + ", ".join("?" + m for m in missing))
    for v in tensors:
        shape = values[v]
        if not (isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise RuleError(f"{rule.where}: tensor ?{v} needs a shape (tuple of ints), got {shape!r}")
    return values


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


def evaluate_param(e, values: Mapping[str, Any], shape_of, where: str):
    """The value of parameter expression ``e`` by the Python evaluators of
    ``rules/semantics.py``: ``values`` maps parameter variables to values,
    ``shape_of(name)`` gives the shape of tensor variable ``name``. RuleError (prefixed
    with ``where``) when it is undefined there."""
    try:
        return _evaluate(e, values, shape_of)
    except semantics.Undefined as err:
        raise RuleError(f"{where}: {e}: {err}") from None


def _evaluate(e, values, shape_of):
    if isinstance(e, Lit):
        return e.value
    if isinstance(e, Var):
        return values[e.name]
    if isinstance(e, ParamOp):
        fn = semantics.PARAM_FNS[e.fn]
        args = [tuple(shape_of(a.name)) if fn.arg_kind(i) == semantics.TENSOR
                else _evaluate(a, values, shape_of) for i, a in enumerate(e.args)]
        return fn.evaluate(*args)
    raise semantics.Undefined(f"not a parameter expression: {e!r}")


def guard_holds(g: Guard, values: Mapping[str, Any], shape_of, weight_range=None) -> bool:
    """Whether guard ``g`` holds by the Python evaluators of ``rules/semantics.py``:
    ``values`` and ``shape_of`` as for :func:`evaluate_param`; ``weight_range(name)``
    gives the :func:`~.semantics.weight_ranges` entry of tensor variable ``name`` (None
    when it is not computed from weights alone), needed by ``weight`` and ``before``
    only. A guard whose arguments are undefined does not hold."""
    kind = semantics.GUARDS[g.kind]
    try:
        if kind.on_tensors:
            return bool(kind.evaluate(*(weight_range(a.name) for a in g.args)))
        return bool(kind.evaluate(*(_evaluate(a, values, shape_of) for a in g.args)))
    except semantics.Undefined:
        return False


def why_guard_fails(g: Guard, values: Mapping[str, Any], shape_of, weight_range=None) -> str:
    """Why :func:`guard_holds` is False for ``g`` (for error messages): the evaluated
    arguments, or why they are undefined."""
    kind = semantics.GUARDS[g.kind]
    try:
        if kind.on_tensors:
            ranges = [weight_range(a.name) for a in g.args]
            shown = ", ".join(f"{a} is not computed from weights alone" if r is None
                              else f"{a} reads weights {r[0]}..{r[1]}" for a, r in zip(g.args, ranges))
        else:
            args = [_evaluate(a, values, shape_of) for a in g.args]
            shown = f"({g.kind} " + " ".join(map(_show, args)) + ")"
        return f"{g} is false: {shown}"
    except semantics.Undefined as err:
        return f"{g} is undefined: {err}"


def _show(v) -> str:
    return "[" + " ".join(map(str, v)) + "]" if isinstance(v, tuple) else str(v)


class PatternBuilder:
    """Builds rule patterns into ``graph``: tensor variables are the ``tensors`` given,
    parameter variables take their ``values``; equal sub-patterns are built once."""

    def __init__(self, rule: Rule, values: dict, graph: Graph, tensors: dict[str, Tensor]):
        self.rule, self.values, self.g, self.tensors = rule, values, graph, tensors
        self.memo: dict[App, list[Tensor]] = {}

    def fail(self, msg: str) -> RuleError:
        return RuleError(f"{self.rule.where}: {msg}")

    def param(self, e):
        return evaluate_param(e, self.values, lambda name: self.tensors[name].shape,
                              self.rule.where)

    # patterns -> tensors of the graph
    def outputs(self, p: App) -> list[Tensor]:
        if p in self.memo:
            return self.memo[p]
        params = {name: self.param(e) for name, e in p.param_dict().items()} \
            if p.op != CONCAT.name else {"axis": self.param(p.params[0])}
        inputs = [self.tensor(t) for t in p.inputs]
        try:
            outs = self.g.add_node(p.op, inputs, **params)
        except TasoEggError as err:
            raise self.fail(f"{p} does not type-check on the example: {err}") from None
        self.memo[p] = outs
        return outs

    def tensor(self, p) -> Tensor:
        if isinstance(p, Var):
            return self.tensors[p.name]
        if isinstance(p, Proj):
            outs = self.outputs(p.pattern)
            index = self.param(p.index) if isinstance(p.index, Var) else p.index
            if not 0 <= index < len(outs):
                raise self.fail(f"{p}: index {index} out of range ({len(outs)} outputs)")
            return outs[index]
        if isinstance(p, App):
            return self.outputs(p)[0]
        raise self.fail(f"not a pattern: {p!r}")

    def guard(self, g: Guard) -> bool:
        """The numeric checker's reading of ``g`` (see ``_NUMERIC``)."""
        if _NUMERIC.guards[g.kind] == "holds":
            return True
        return guard_holds(g, self.values, lambda name: self.tensors[name].shape)


def _guards_hold_on(rule: Rule, values: dict) -> bool:
    """Whether the rule's guards hold, as the numeric checker reads them, on
    ``values`` (an example), judged from the shapes alone (no graph is built)."""
    tensors = set(rule.tensor_vars())

    def shape_of(name):
        if name not in tensors:
            raise semantics.Undefined(f"?{name} is not a tensor variable")
        return values[name]

    return all(_NUMERIC.guards[g.kind] == "holds" or guard_holds(g, values, shape_of)
               for g in rule.guards)


class _TypesOnly:
    """Stands in for a Graph when only the types matter: ``add_node`` runs the
    operator's shape rule and returns the output types; nothing is kept. Probing a shape
    variant this way costs a third of building it, and most variants fail to type-check."""

    @staticmethod
    def add_node(op: str, inputs, **params) -> list:
        spec = OPS[op]
        spec.check_input_count(len(inputs), f"{op}: ")
        return spec.infer(spec.normalize_params(params), list(inputs))


def builds_on(rule: Rule, bindings: Mapping[str, Any] | None = None) -> bool:
    """Whether the rule's example with ``bindings`` laid over it satisfies the guards
    and type-checks on both sides: exactly when :func:`add_rule_sides` would build it,
    but without building a graph."""
    values = example_values(rule, bindings)
    if not _guards_hold_on(rule, values):
        return False
    try:
        types = {v: OPS["input"].infer({"shape": values[v], "dtype": "float32"}, [])[0]
                 for v in rule.tensor_vars()}
        b = PatternBuilder(rule, values, _TypesOnly, types)
        for p in rule.lhs + rule.rhs:
            b.tensor(p)
    except TasoEggError:
        return False
    return True


def instantiate(rule: Rule, bindings: Mapping[str, Any] | None = None, seed: int = 0):
    """Build one Graph holding both sides of ``rule`` on its example (``bindings``
    override or complete it). Tensor variables become graph inputs named after the
    variable, or weights with random data when a ``(weight ?v)`` guard names them.
    Returns ``(graph, lhs_outputs, rhs_outputs)``; the outputs are marked
    ``lhs0``/``rhs0`` (``lhs1``/``rhs1`` for multi rules). RuleError when the example
    violates a guard or a side does not type-check."""
    g = Graph()
    lhs, rhs = add_rule_sides(g, rule, bindings, np.random.default_rng(seed))
    for i, (l, r) in enumerate(zip(lhs, rhs)):
        g.mark_output(l, f"lhs{i}")
        g.mark_output(r, f"rhs{i}")
    return g, lhs, rhs


def add_rule_sides(g: Graph, rule: Rule, bindings: Mapping[str, Any] | None = None,
                   rng=None, prefix: str = "", sides: str = "both") -> tuple[list[Tensor], list[Tensor]]:
    """Build both sides of ``rule`` into ``g`` (as :func:`instantiate` does; its inputs
    named ``prefix`` + variable, so many rules can share one graph) and return
    ``(lhs_outputs, rhs_outputs)`` unmarked. ``sides`` ``lhs`` builds the left side
    alone (the right outputs are then empty), over the same inputs and weights in the
    same order as ``both`` makes them. Weights get random data from ``rng``; with
    ``rng`` None they get none (for graphs that are never run). RuleError when the
    example violates a guard or a side does not type-check; ``g`` may then keep the
    nodes built so far (never outputs)."""
    values = example_values(rule, bindings)
    weights = set(rule.weight_vars())
    tensors: dict[str, Tensor] = {}
    for v in rule.tensor_vars():
        if v in weights:  # data below, once operators that need positive data claimed theirs
            tensors[v] = g.new_weight(values[v], name=prefix + v)
        else:
            tensors[v] = g.new_input(values[v], name=prefix + v)
    b = PatternBuilder(rule, values, g, tensors)
    for guard in rule.guards:
        if not b.guard(guard):
            raise RuleError(f"{rule.where}: the example violates guard {guard}")
    if sides not in ("both", "lhs"):
        raise ValueError(f"sides must be 'both' or 'lhs', got {sides!r}")
    lhs = [b.tensor(p) for p in rule.lhs]
    rhs = [b.tensor(p) for p in rule.rhs] if sides == "both" else []
    if rng is not None:
        for v in rule.weight_vars():
            if tensors[v].node not in g.weight_data:
                g.weight_data[tensors[v].node] = rng.standard_normal(values[v]).astype(np.float32)
    return lhs, rhs


def check_rule_numerically(rule: Rule, seed: int = 0, rtol: float = 1e-5,
                           bindings: Mapping[str, Any] | None = None) -> float:
    """Run both sides of ``rule`` on random data (``seed``) and compare ``lhs[i]``
    with ``rhs[i]``; VerificationError on a mismatch (values or shapes). Returns the
    worst relative error."""
    from taso_egg.check.tolerance import compare_outputs
    from taso_egg.executor import random_inputs, run

    g, lhs, rhs = instantiate(rule, bindings, seed)
    out = run(g, random_inputs(g, seed))
    n = len(lhs)
    expected = {f"side {i}": out[f"lhs{i}"] for i in range(n)}
    actual = {f"side {i}": out[f"rhs{i}"] for i in range(n)}
    return compare_outputs(expected, actual, rtol, what=f"{rule.where}: rhs")


# Parameters that hold tensor dimensions: varied together with the shapes, so that a
# variant keeps e.g. split sizes equal to the dims they cut.
_DIMENSION_PARAMS = {(op, p.name) for op in OPS for p in OPS[op].params if p.kind == "dims"}


def _dimension_param_vars(rule: Rule) -> set[str]:
    names: set[str] = set()

    def walk(p):
        if isinstance(p, Proj):
            walk(p.pattern)
        elif isinstance(p, App):
            for name, e in p.param_dict().items():
                if isinstance(e, Var) and (p.op, name) in _DIMENSION_PARAMS:
                    names.add(e.name)
            for t in p.inputs:
                walk(t)

    for p in rule.lhs:
        walk(p)
    return names


def sized_vars(rule: Rule, base: dict | None = None) -> list[str]:
    """The variables whose example values are sizes: the tensors (their shapes), then
    the parameters that hold dimensions as vectors (split sizes, reshape and constant
    shapes)."""
    base = example_values(rule) if base is None else base
    dim_params = _dimension_param_vars(rule)
    return list(rule.tensor_vars()) + [v for v in rule.param_vars()
                                       if v in dim_params and isinstance(base[v], tuple)]


def other_examples(rule: Rule, seed: int = 0, dims=(1, 2, 3, 4)) -> Iterator[dict]:
    """Endless variants of the rule's example, never equal to it and never repeated:
    each distinct dimension value (of the tensor shapes and of the parameters that
    hold dimensions: split sizes, reshape and constant shapes, pool kernels) is mapped
    consistently to a random value of ``dims``; other parameters keep their example
    values. Sizes that guards pin to literals (``(= (shape ?x) (vec 2 4))``,
    ``(= (dim ?x 1) 4)``) keep their value, since moving them breaks the guard; other
    guards and typing are not checked. Stops when no further variant is left."""
    base = example_values(rule)
    keys = sized_vars(rule, base)
    pinned = _pinned_sizes(rule, base)
    values = sorted({d for k in keys for d in base[k]} - pinned)
    example = tuple(base[k] for k in keys)
    # Each rule's own sequence (its patterns seed it too): with one sequence for all,
    # every rule with as many distinct sizes was checked on the same images of them.
    rng = np.random.default_rng([seed, zlib.crc32(" ".join(map(str, rule.lhs + rule.rhs)).encode())])
    for image in _distinct_images(rng, len(values), tuple(dims)):
        mapping = dict(zip(values, image))
        mapping.update((d, d) for d in pinned)
        variant = tuple(tuple(mapping[d] for d in base[k]) for k in keys)
        if variant != example:
            yield dict(zip(keys, variant))


def _pinned_sizes(rule: Rule, base: dict) -> set:
    """The example's sizes that equality guards tie to constants: a ``shape``, ``dim``
    or ``at`` query on one side, an expression without variables on the other, equal on
    the example (``(= (shape ?x) (vec 2 4))``, ``(= (dim ?x 1) 4)``, ``(= (at ?sh 2) 3)``)."""
    pinned = set()
    for g in rule.guards:
        if g.kind != "=":
            continue
        for query, constant in (g.args, g.args[::-1]):
            if not (isinstance(query, ParamOp) and query.fn in ("shape", "dim", "at")) \
                    or next(walk_vars(constant), None) is not None:
                continue
            try:
                value = evaluate_param(query, base, base.__getitem__, rule.where)
                if value == evaluate_param(constant, base, base.__getitem__, rule.where):
                    pinned.update(value if query.fn == "shape" else (value,))
            except RuleError:
                continue  # an axis out of range: the guard pins nothing
    return pinned


def _distinct_images(rng, count: int, dims: tuple) -> Iterator[tuple]:
    """Every tuple of ``count`` values of ``dims``, once each, in random order. Small
    spaces are permuted whole: drawing with replacement would redraw nearly every time
    once most of the space is seen, and rules with few distinct sizes ask for much of it."""
    m = len(dims)
    possible = m ** count
    if possible <= 4096:
        for index in rng.permutation(possible).tolist():
            digits = []
            for _ in range(count):
                index, d = divmod(index, m)
                digits.append(dims[d])
            yield tuple(digits)
        return
    seen: set = set()
    while True:  # a space this large is never exhausted by the callers' few hundred draws
        for row in rng.integers(0, m, size=(64, count)).tolist():
            image = tuple(dims[d] for d in row)
            if image not in seen:
                seen.add(image)
                yield image


def check_rule_on_other_shapes(rule: Rule, trials: int = 3, seed: int = 0,
                               attempts: int = 100) -> list[dict]:
    """Check ``rule`` numerically on up to ``trials`` variants of its example
    (:func:`other_examples`) that satisfy its guards and type-check on both sides,
    drawing at most ``attempts`` variants. Returns the variants checked (empty when
    none was valid); VerificationError on the first disagreement."""
    from itertools import islice

    checked = []
    for i, variant in enumerate(islice(other_examples(rule, seed), attempts)):
        if _holds_on(rule, variant, seed + i):
            checked.append(variant)
            if len(checked) == trials:
                break
    return checked


def _holds_on(rule: Rule, variant: dict, seed: int) -> bool:
    """True when both sides build on ``variant`` and agree; False when it violates a
    guard or a side does not type-check; VerificationError when they disagree."""
    if not builds_on(rule, variant):
        return False  # most variants fail here, before any graph is built
    try:
        check_rule_numerically(rule, seed=seed, bindings=variant)
    except RuleError:
        return False
    return True


def unchecked_dimensions(rule: Rule, checked: list[dict], seed: int = 0,
                         dims=(1, 2, 3, 4)) -> list[tuple[str, int, int]]:
    """The ``(variable, axis, size)`` positions of the example's sizes (of
    :func:`sized_vars`) that the checks never varied: no variant in ``checked`` changed
    that size, and no variant that changes only that size (to another value of
    ``dims``) builds, so the rule is known to hold there at the example's size alone.
    This is how a size tied to a constant's literal shape (a channel count equal to
    ``const_iconv [4 4 3 3]``'s) shows. A variant that builds and disagrees is a
    VerificationError."""
    base = example_values(rule)
    tensors = sized_vars(rule, base)
    # the example sizes some variant moved (a size moves with all its positions: one mapping)
    moved = {e for variant in checked for v in tensors if v in variant
             for d, e in zip(variant[v], base[v]) if d != e}
    stuck = sorted({d for v in tensors for d in base[v]} - moved)
    fixed = []
    for size in stuck:
        for i, other in enumerate(x for x in dims if x != size):
            variant = {v: tuple(other if d == size else d for d in base[v]) for v in tensors}
            if _holds_on(rule, variant, seed + i):
                break  # holds with another size too
        else:
            fixed += [(v, axis, size) for v in tensors for axis, d in enumerate(base[v]) if d == size]
    return fixed


__all__ = ["instantiate", "add_rule_sides", "builds_on", "check_rule_numerically", "example_values", "evaluate_param",
           "guard_holds", "why_guard_fails", "PatternBuilder", "other_examples", "check_rule_on_other_shapes",
           "unchecked_dimensions", "sized_vars"]
