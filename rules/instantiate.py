"""Concrete instances of rules: build both sides of a rule on its ``:example`` shapes
as one :class:`~taso_egg.graph.Graph`, and check numerically that they agree.

This is the cheap, always-available soundness check of the corpus (the Z3 verifier
is the other): a rule whose two sides disagree on random data is unsound.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from taso_egg.errors import RuleError, TasoEggError
from taso_egg.graph import Graph, Tensor

from .lang import App, Guard, Lit, ParamOp, Proj, Rule, Var

_COMPARE = {
    "=": lambda a, b: a == b, "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
}


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


class _Builder:
    def __init__(self, rule: Rule, values: dict, graph: Graph, tensors: dict[str, Tensor]):
        self.rule, self.values, self.g, self.tensors = rule, values, graph, tensors
        self.memo: dict[App, list[Tensor]] = {}

    def fail(self, msg: str) -> RuleError:
        return RuleError(f"{self.rule.where}: {msg}")

    # parameter expressions -> concrete values
    def param(self, e):
        if isinstance(e, Lit):
            return e.value
        if isinstance(e, Var):
            return self.values[e.name]
        if isinstance(e, ParamOp):
            fn, args = e.fn, e.args
            if fn in ("dim", "rank", "shape"):
                shape = self.tensors[args[0].name].shape
                if fn == "rank":
                    return len(shape)
                if fn == "shape":
                    return tuple(shape)
                i = self.param(args[1])
                if not isinstance(i, int) or not -len(shape) <= i < len(shape):
                    raise self.fail(f"{e}: axis {i!r} out of range for ?{args[0].name} of shape "
                                    f"{list(shape)}")
                return shape[i]
            vals = [self.param(a) for a in args]
            try:
                if fn == "len":
                    return len(vals[0])
                if fn == "at":
                    return vals[0][vals[1]]
                if fn == "vec":
                    return tuple(int(v) for v in vals)
                a, b = vals
                if fn == "+":
                    return a + b
                if fn == "-":
                    return a - b
                if fn == "*":
                    return a * b
                if fn == "/":
                    return a // b
            except (TypeError, IndexError, ZeroDivisionError, ValueError) as err:
                raise self.fail(f"cannot evaluate {e} on the example: {err}") from None
        raise self.fail(f"not a parameter expression: {e!r}")

    # patterns -> tensors of the graph
    def outputs(self, p: App) -> list[Tensor]:
        if p in self.memo:
            return self.memo[p]
        params = {name: self.param(e) for name, e in p.param_dict().items()} \
            if p.op != "concat" else {"axis": self.param(p.params[0])}
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
            if p.index >= len(outs):
                raise self.fail(f"{p}: index {p.index} out of range ({len(outs)} outputs)")
            return outs[p.index]
        if isinstance(p, App):
            return self.outputs(p)[0]
        raise self.fail(f"not a pattern: {p!r}")

    def guard(self, g: Guard) -> bool:
        if g.kind in ("weight", "before"):
            return True  # weights are built as weights; `before` only orders saturation
        return bool(_COMPARE[g.kind](self.param(g.args[0]), self.param(g.args[1])))


def instantiate(rule: Rule, bindings: Mapping[str, Any] | None = None, seed: int = 0):
    """Build one Graph holding both sides of ``rule`` on its example (``bindings``
    override or complete it). Tensor variables become graph inputs named after the
    variable, or weights with random data when a ``(weight ?v)`` guard names them.
    Returns ``(graph, lhs_outputs, rhs_outputs)``; the outputs are marked
    ``lhs0``/``rhs0`` (``lhs1``/``rhs1`` for multi rules). RuleError when the example
    violates a guard or a side does not type-check."""
    values = example_values(rule, bindings)
    rng = np.random.default_rng(seed)
    g = Graph()
    weights = set(rule.weight_vars())
    tensors: dict[str, Tensor] = {}
    for v in rule.tensor_vars():
        shape = values[v]
        if v in weights:
            data = rng.standard_normal(shape).astype(np.float32)
            tensors[v] = g.new_weight(shape, data=data, name=v)
        else:
            tensors[v] = g.new_input(shape, name=v)
    b = _Builder(rule, values, g, tensors)
    for guard in rule.guards:
        if not b.guard(guard):
            raise RuleError(f"{rule.where}: the example violates guard {guard}")
    lhs = [b.tensor(p) for p in rule.lhs]
    rhs = [b.tensor(p) for p in rule.rhs]
    for i, (l, r) in enumerate(zip(lhs, rhs)):
        g.mark_output(l, f"lhs{i}")
        g.mark_output(r, f"rhs{i}")
    return g, lhs, rhs


def check_rule_numerically(rule: Rule, seed: int = 0, rtol: float = 1e-5,
                           bindings: Mapping[str, Any] | None = None) -> float:
    """Run both sides of ``rule`` on random data (``seed``) and compare ``lhs[i]``
    with ``rhs[i]``; VerificationError on a mismatch (values or shapes). Returns the
    worst relative error."""
    from taso_egg.executor import random_inputs, run
    from taso_egg.verify import compare_outputs

    g, lhs, rhs = instantiate(rule, bindings, seed)
    out = run(g, random_inputs(g, seed))
    n = len(lhs)
    expected = {f"side {i}": out[f"lhs{i}"] for i in range(n)}
    actual = {f"side {i}": out[f"rhs{i}"] for i in range(n)}
    return compare_outputs(expected, actual, rtol, what=f"{rule.where}: rhs")


__all__ = ["instantiate", "check_rule_numerically", "example_values"]
