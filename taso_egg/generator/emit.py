"""From pruned candidates to rules of our language: each candidate's orientations, its
patterns, the shape guards typing asks of both sides (:mod:`.shape_guards`), the
weight guards a merge needs, and an example; then each generated rule checked on
other shapes and generalized or pinned to its example.

When candidates become rules (:func:`to_rule`), one whose split cuts elsewhere than
between two concatenated operands is dropped as ``split off a boundary``: its sizes
are the generator's numbers, not the operands' dims, so it says nothing general.
"""

from __future__ import annotations

from taso_egg.errors import RuleError, TasoEggError
from taso_egg.ops import CONCAT, OPS

from ..rules.ast import App, Guard, Lit, ParamOp, Proj, Rule, Var, walk_vars
from ..rules.instantiate import builds_on, evaluate_param
from .enumerate import Enumeration
from .prune import Candidate, Pruned, canonical, has_split, leaf_order, leaf_specs, variable_names
from .shape_guards import ShapeFacts, form_expr, general_example, shape_guards


def _pattern(e: Enumeration, tid: int, names: dict, sizes: dict | None = None):
    """``sizes``: split node -> its sizes parameter (an expression), where not literal."""
    t = e.terms[tid]
    if t.op == "leaf":
        lf = t.leaf
        if lf.is_constant:  # its shape a parameter variable where named
            shape = Var(names[lf.name]) if lf.name in names else Lit(tuple(lf.shape))
            return App(lf.role, (shape, Lit("float32")), ())
        return Var(names[lf.name])
    if t.op == "proj":
        return Proj(t.index, _pattern(e, t.children[0], names, sizes))
    kids = tuple(_pattern(e, c, names, sizes) for c in t.children)
    if t.op == CONCAT.name:
        return App("concat", (Lit(t.params["axis"]),), kids)
    params = tuple(sizes[tid] if k == "sizes" and sizes and tid in sizes else Lit(_literal(t.params[k]))
                   for k in OPS[t.op].defaults)
    return App(t.op, params, kids)


def _literal(v):
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _cost(e: Enumeration, tids: tuple) -> tuple:
    nodes = frozenset().union(*(e.terms[t].nodes for t in tids))
    return (len(nodes), len(leaf_order(e, tids)))


def orientations(e: Enumeration, c: Candidate) -> list:
    """(lhs, rhs) pairs to emit: the bigger side rewrites to the smaller; sides of
    equal size give both directions unless the reverse is the same rule renamed.
    Two-output rules go from the separate terms to the merged one."""
    if len(c.lhs) == 2:
        return [(c.lhs, c.rhs)]
    a, b = c.lhs, c.rhs
    ok = [(x, y) for x, y in ((a, b), (b, a))
          if e.terms[x[0]].op != "leaf" and e.terms[y[0]].leaves <= e.terms[x[0]].leaves]
    ca, cb = _cost(e, a), _cost(e, b)
    if ca != cb:
        big = [(x, y) for x, y in ok if _cost(e, x) > _cost(e, y)]
        if big:
            return big
    if len(ok) == 2 and canonical(e, a, b) == canonical(e, b, a):
        return ok[:1]
    return ok


def to_rule(e: Enumeration, lhs: tuple, rhs: tuple, name: str) -> Rule | None:
    """The candidate as a rule. Its shape guards are what typing asks of both sides
    (:mod:`.shape_guards`), and that their shapes agree; a split's sizes are the dims of
    what it takes apart (on the left side a parameter variable ``?szN`` that a guard
    ties to them), a constant's shape a parameter variable ``?shN`` that guards tie to the
    tensors' dims (TASO's ``const_one`` is as wide as what it multiplies), and the
    example gives dims no equation ties distinct sizes. Where typing asks of a constant
    something no guard states (a product or quotient of two varying dims), the
    constant keeps the menu's shape; where it asks that of the inputs, the guards keep
    the example's shapes (``_pinned_shape_guards``). None when a split cuts elsewhere
    than between concatenated operands (its sizes are no operand's dims: the rule would
    hold on the generator's numbers only)."""
    names = variable_names(e, lhs + rhs)
    leaves = {lf.name: lf for lf in e.menu.leaves}
    weights = _weight_guards(e, lhs, rhs, names, leaves)
    shape_vars = _shape_variables(e, lhs + rhs)
    for symbolic in (True, False) if shape_vars else (True,):
        facts = ShapeFacts(e, lhs + rhs, symbolic_constants=symbolic)
        if facts.off_boundary:
            return None
        for left, right in zip(lhs, rhs):  # the sides are equal only where their shapes are
            facts.equations += [a.plus(b.scaled(-1)) for a, b in zip(facts.forms[left], facts.forms[right])]
        rule = _general_rule(e, lhs, rhs, name, facts, {**names, **shape_vars} if symbolic else names,
                             leaves, weights)
        if rule is not None:
            return rule
    lhs_p = tuple(_pattern(e, t, names) for t in lhs)
    rhs_p = tuple(_pattern(e, t, names) for t in rhs)
    guards = list(_pinned_shape_guards(e, lhs + rhs, names, leaves))
    return Rule(name, lhs_p, rhs_p, tuple(guards + weights), _example(e, lhs + rhs, names, leaves), "",
                ("<generated>", 0), len(lhs) == 2)


def _general_rule(e: Enumeration, lhs: tuple, rhs: tuple, name: str, facts: ShapeFacts, names: dict,
                  leaves: dict, weights: list) -> Rule | None:
    """The rule under the guards typing asks (:func:`~.shape_guards.shape_guards`), on an
    example that varies the free dims or else on the menu's; None where no guard states
    what typing asks, or where neither example builds."""
    general = shape_guards(e, facts, names, leaves)
    if general is None:
        return None
    guards, uf, linear = general
    in_lhs = {n for t in lhs for n in e.terms[t].nodes}
    sizes, size_vars = {}, {}
    for k, (split, parts) in enumerate(sorted(facts.sizes.items())):
        expr = ParamOp("vec", tuple(form_expr(f, names) for f in parts))
        if split in in_lhs:
            sizes[split] = Var(f"sz{k}")
            size_vars[f"sz{k}"] = expr
            guards.append(Guard("=", (Var(f"sz{k}"), expr)))
        else:
            sizes[split] = expr
    lhs_p = tuple(_pattern(e, t, names, sizes) for t in lhs)
    rhs_p = tuple(_pattern(e, t, names, sizes) for t in rhs)
    example = _example(e, lhs + rhs, names, leaves)
    for shapes in (general_example(list(example), names, leaves, uf, linear, example), example):
        rule = Rule(name, lhs_p, rhs_p, tuple(guards + weights), _with_sizes(shapes, size_vars),
                    "", ("<generated>", 0), len(lhs) == 2)
        if builds_on(rule):
            return rule
    return None


def _shape_variables(e: Enumeration, tids) -> dict:
    """Constant leaf name -> the variable of its shape parameter (``sh0`` ...), by first use."""
    leaves = leaf_specs(e)
    constants = [n for n in leaf_order(e, tids) if leaves[n].is_constant]
    return {n: f"sh{k}" for k, n in enumerate(constants)}


def _example(e: Enumeration, tids, names: dict, leaves: dict) -> dict:
    """The menu's shapes of the named leaves: a tensor's, or a constant's shape parameter."""
    return {names[n]: tuple(leaves[n].shape) for n in leaf_order(e, tids) if n in names}


def _with_sizes(shapes: dict, size_vars: dict) -> dict:
    """The example with each split-size variable's value on those shapes."""
    out = dict(shapes)
    for v, expr in size_vars.items():
        out[v] = evaluate_param(expr, out, out.__getitem__, v)
    return out


def _pinned_shape_guards(e, tids, names, leaves):
    """Inputs keep their rank, and inputs found with one shape keep equal shapes (no
    broadcasting they were never tried on); rules with a split keep the exact shapes
    (its sizes are literal)."""
    order = [n for n in leaf_order(e, tids) if n in names]
    if any(has_split(e, t) for t in tids):
        for n in order:
            yield Guard("=", (ParamOp("shape", (Var(names[n]),)),
                              ParamOp("vec", tuple(Lit(d) for d in leaves[n].shape)) if leaves[n].shape
                              else Lit(())))
        return
    first: dict = {}
    for n in order:
        shape = leaves[n].shape
        if shape in first:
            yield Guard("=", (ParamOp("shape", (Var(names[first[shape]]),)),
                              ParamOp("shape", (Var(names[n]),))))
        else:
            first[shape] = n
            yield Guard("=", (ParamOp("rank", (Var(names[n]),)), Lit(len(shape))))


def _weight_guards(e, lhs, rhs, names, leaves):
    """A merge pays off only when the concatenated operands are weights (folded at
    export), so weights concatenated by the rhs must be weights; ``before`` applies a
    symmetric two-output merge once. A weight is concatenated where a concat's operand
    computes from weights alone and reads it: a kernel under a conv under a concat is
    not (the concat joins the conv's activations), and guarding it would keep the rule
    from every graph whose kernel is computed."""
    concatenated = []

    def walk(tid, concatenated_here):
        t = e.terms[tid]
        if t.op == "leaf":
            if concatenated_here and t.leaf.name in names and t.leaf.name not in concatenated:
                concatenated.append(t.leaf.name)
            return
        for c in t.children:
            walk(c, (concatenated_here or t.op == CONCAT.name) and e.terms[c].weight_only)

    for t in rhs:
        walk(t, False)
    weights = [n for n in concatenated if leaves[n].role in ("weight", "bias")]
    guards = [Guard("weight", (Var(names[n]),)) for n in weights]
    if len(lhs) == 2 and canonical(e, lhs, ()) == canonical(e, lhs[::-1], ()) and len(weights) >= 2:
        guards.append(Guard("before", (Var(names[weights[0]]), Var(names[weights[1]]))))
    # A normalization's parameters are its initializers in every model (and so the float
    # checks draw a variance positive, as the operator needs).
    params = sorted(n for n in names if leaves[n].role == "param" and n not in weights)
    return guards + [Guard("weight", (Var(names[n]),)) for n in params]


def rules_from(e: Enumeration, pruned: Pruned, prefix: str) -> list:
    return [r for _, r in sized_rules(e, pruned, prefix)]


def sized_rules(e: Enumeration, pruned: Pruned, prefix: str) -> list:
    """``(size, rule)`` for every orientation of every kept candidate, sizes ascending
    (single-output rules first at each size); ``size`` counts the operators of the
    candidate's larger side."""
    out = []
    for c in sorted(pruned.kept, key=lambda c: (c.size, len(c.lhs))):
        for lhs, rhs in orientations(e, c):
            rule = to_rule(e, lhs, rhs, f"{prefix}-{len(out) + 1}")
            if rule is None:
                pruned.dropped["split off a boundary"] += 1
                break
            out.append((c.size, rule))
    return out


def generalize_or_pin(rule: Rule) -> Rule:
    """Check the rule on shapes other than its example. If it fails there, pin every
    input to its example shape; if it holds, pin the sizes no other shape could vary
    (:func:`~.instantiate.unchecked_dimensions`): the parameters found on small shapes
    generalize only where checked. Sizes are the inputs' shapes and the constants'
    shape parameters that no guard ties whole (a constant's kernel size). A rule that
    fails on its own example is a RuleError."""
    from ..rules.instantiate import (check_rule_numerically, check_rule_on_other_shapes, sized_vars,
                                     unchecked_dimensions)

    try:
        check_rule_numerically(rule)
    except TasoEggError as err:
        raise RuleError(f"generated rule {rule.name} fails on its own example: {err}") from None
    tensors = rule.tensor_vars()
    sized = [v for v in sized_vars(rule) if v in tensors or not _tied(rule, v)]
    try:
        fixed = unchecked_dimensions(rule, check_rule_on_other_shapes(rule))
    except TasoEggError:
        fixed = [(v, axis, d) for v in sized for axis, d in enumerate(rule.example[v])]
    pins = []
    for v in sized:
        shape = rule.example[v]
        axes = {axis for w, axis, _ in fixed if w == v}
        if not axes or _pinned(rule, v):
            continue
        whole, at = (ParamOp("shape", (Var(v),)), "dim") if v in tensors else (Var(v), "at")
        if len(axes) == len(shape):
            pins.append(Guard("=", (whole, ParamOp("vec", tuple(Lit(d) for d in shape)))))
        else:
            pins += [Guard("=", (ParamOp(at, (Var(v), Lit(axis))), Lit(shape[axis]))) for axis in sorted(axes)]
    pins = [g for g in dict.fromkeys(pins) if g not in rule.guards]  # the shape guards may hold some
    if not pins:
        return rule
    return Rule(rule.name, rule.lhs, rule.rhs, rule.guards + tuple(pins), rule.example, rule.doc,
                rule.source, rule.multi)


def _pinned(rule: Rule, v: str) -> bool:
    """Whether a guard fixes input ``v``'s shape (or parameter ``v``) to a literal vector."""
    whole = (ParamOp("shape", (Var(v),)), Var(v))
    return any(g.kind == "=" and g.args[0] in whole and isinstance(g.args[1], ParamOp)
               and g.args[1].fn == "vec" and next(walk_vars(g.args[1]), None) is None for g in rule.guards)


def _tied(rule: Rule, v: str) -> bool:
    """Whether a guard equates parameter ``v`` whole with an expression (a split's sizes
    with the dims it takes apart, a constant's shape with a tensor's)."""
    return any(g.kind == "=" and Var(v) in g.args for g in rule.guards)


def pinned_to_example(rule: Rule) -> bool:
    """Whether the guards fix every input to its example shape."""
    return all(not rule.example[v] or _pinned(rule, v) for v in rule.tensor_vars())


__all__ = ["rules_from", "sized_rules", "to_rule", "orientations", "generalize_or_pin", "pinned_to_example"]
