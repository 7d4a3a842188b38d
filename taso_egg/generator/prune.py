"""From equal fingerprints to rules: TASO's pruning, then rules of our language.

Every pair of terms in one fingerprint class is a candidate. A candidate is dropped
when (in this order, each reason counted):

- ``transitive``: neither side is the class's representative (its first, smallest
  member): the two rules from each side to the representative imply it;
- ``weight-only``: both sides compute from weights, constants and the scalar alone;
  such sub-graphs are folded into constants at export, so the rule can never pay;

- ``renamed duplicate``: an earlier candidate is the same up to renaming inputs of one
  kind, swapping sides, and the operand order of ewadd/ewmul (whose commutativity rules
  are kept: the sorted text of a commutativity candidate is trivial, so those are kept
  before the comparison);
- ``false match``: its sides disagree on a second, real-valued draw with the real relu
  (the fingerprint's stand-in or a float32 collision made them look equal);
- ``computes a constant``: a side holds an operator whose value is the same on both
  draws though it reads an input (``x - x``, ``x / x`` and what is built on them): no
  exported graph computes one, and such rules were three in five of a size-3 run's;
- ``implied in context`` (TASO's common supergraph): both sides apply the same operator
  to children that are pairwise equal, so smaller rules in that context imply it;
- ``common subgraph``: both sides contain the same sub-graph, and replacing it by a
  fresh input still gives equal sides: the smaller, more general rule implies it;
- ``unbound variables``: neither side uses all the other side's inputs, so no direction
  is a rewrite (kept only as half of a two-output rule, below);
- ``rearranges a broadcast``: both sides one associative-commutative operator over the
  same leaves, a broadcast bias among them; ``groups convs``: a side convolves a concat
  of inputs with a concat of weights; ``moves a scalar between activations``: both sides
  a matmul of two activations and a scalar multiplication. All are sound, and each
  blows saturation or extraction up on real models for nothing measurably cheaper
  (the figures are in the functions' docstrings).

Two-output candidates pair the outputs of one split with two separate terms whose
fingerprints match them pairwise (TASO's merges: ``x.w1`` and ``x.w2`` become one
matmul with ``concat(w1, w2)``, then a split). One is dropped as ``decomposes`` when
each half is a rewrite on its own, and as ``merges no weight`` when no concat of the
merged side reads a weight: nothing folds at export, and such a rule pairs every two
same-shaped tensors of a graph (NasRNN's relus: 22,000 matches an iteration).

When candidates become rules (:func:`to_rule`), one whose split cuts elsewhere than
between two concatenated operands is dropped as ``split off a boundary``: its sizes
are the generator's numbers, not the operands' dims, so it says nothing general.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field

import numpy as np

from taso_egg.errors import RuleError, TasoEggError
from taso_egg.ops import OPS

from ..rules.instantiate import builds_on, evaluate_param
from ..rules.ast import App, Guard, Lit, ParamOp, Proj, Rule, Var, walk_vars
from .enumerate import Enumeration, Evaluator, fingerprint, integer_draw
from .shapes import ShapeFacts, form_expr, general_example, shape_guards

REASONS = ("transitive", "weight-only", "renamed duplicate", "false match", "computes a constant",
           "implied in context", "common subgraph", "unbound variables", "rearranges a broadcast",
           "groups convs", "moves a scalar between activations", "decomposes", "merges no weight",
           "split off a boundary")


@dataclass
class Candidate:
    """Single-output: ``lhs``/``rhs`` one term id each; two-output: two each."""

    lhs: tuple
    rhs: tuple
    size: int  # operators of the larger side


@dataclass
class Pruned:
    kept: list
    dropped: dict = field(default_factory=lambda: {r: 0 for r in REASONS})
    candidates: int = 0
    multi_candidates: int = 0
    seconds: float = 0.0


# --- terms as trees ------------------------------------------------------------------


_LEAF = re.compile("\x00([^\x00]+)\x00")


def _commutative(op: str) -> bool:
    """Operands of these are sorted in the canonical text: rules that differ only by the
    order of such operands follow from the kept one and the commutativity rules."""
    return op in OPS and OPS[op].commutative


def _template(e: Enumeration, tid: int) -> str:
    """The term's text with leaves as ``\\0NAME\\0`` placeholders (memoized);
    operands of commutative operators sorted."""
    cache = e.__dict__.setdefault("_templates", {})
    text = cache.get(tid)
    if text is None:
        t = e.terms[tid]
        if t.op == "leaf":
            text = f"\x00{t.leaf.name}\x00"
        elif t.op == "proj":
            text = f"(proj {t.index} {_template(e, t.children[0])})"
        else:
            kids = [_template(e, c) for c in t.children]
            if _commutative(t.op):
                kids.sort()
            text = f"({t.choice.label()} " + " ".join(kids) + ")"
        cache[tid] = text
    return text


def _pieces(e: Enumeration, tid: int) -> list:
    """The term's template split at its leaves (memoized): text at even positions,
    leaf names at odd ones."""
    cache = e.__dict__.setdefault("_template_pieces", {})
    pieces = cache.get(tid)
    if pieces is None:
        pieces = cache[tid] = _LEAF.split(_template(e, tid))
    return pieces


def _leaf_order(e: Enumeration, tids) -> list:
    return list(dict.fromkeys(n for t in tids for n in _pieces(e, t)[1::2]))


def _leaf_specs(e: Enumeration) -> dict:
    """Leaf name -> LeafSpec of the enumeration's menu (built once, kept on it)."""
    return e.__dict__.setdefault("_leaf_specs", {lf.name: lf for lf in e.menu.leaves})


def _variables(e: Enumeration, tids) -> dict:
    """Leaf name -> variable name, by first use in ``tids``; constants stay unnamed."""
    leaves = _leaf_specs(e)
    names, counters = {}, {}
    for name in _leaf_order(e, tids):
        lf = leaves[name]
        if lf.is_constant:
            continue
        k = counters.get(lf.prefix, 0)
        counters[lf.prefix] = k + 1
        names[name] = f"{lf.prefix}{k}"
    return names


def canonical(e: Enumeration, lhs: tuple, rhs: tuple) -> str:
    """The candidate's text with inputs renamed by first use, lhs first."""
    names = _variables(e, lhs + rhs)

    def text(tid):
        pieces = _pieces(e, tid)
        return "".join(names.get(p, p) if i % 2 else p for i, p in enumerate(pieces))

    return " | ".join(map(text, lhs)) + " => " + " | ".join(map(text, rhs))


def _unordered_key(e: Enumeration, a: tuple, b: tuple) -> str:
    keys = [canonical(e, a, b), canonical(e, b, a)]
    if len(a) == 2:
        keys += [canonical(e, a[::-1], b[::-1]), canonical(e, b[::-1], a[::-1])]
    return min(keys)


# --- numeric helpers -----------------------------------------------------------------


class _Substituted:
    """Evaluates terms with one sub-term replaced by a fresh random input, on both
    draws (fingerprint and check)."""

    def __init__(self, e: Enumeration, replaced: int, seed: int):
        self.e, self.replaced = e, replaced
        shape = e.terms[replaced].shape
        rng = np.random.default_rng(seed)
        self.fresh = (integer_draw(rng, shape), rng.standard_normal(shape))
        self.memo = ({}, {})

    def value(self, tid: int, draw: int):
        if tid == self.replaced:
            return self.fresh[draw]
        memo = self.memo[draw]
        if tid in memo:
            return memo[tid]
        t = self.e.terms[tid]
        if self.replaced not in t.nodes:
            v = self.e.values[tid] if draw == 0 else self.e.check_value(tid)
        elif t.op == "proj":
            v = self._outputs(t.children[0], draw)[t.index]
        else:
            v = self._outputs(tid, draw)[0]
        memo[tid] = v
        return v

    def _outputs(self, tid: int, draw: int) -> list:
        t = self.e.terms[tid]
        args = [self.value(c, draw) for c in t.children]
        with np.errstate(all="ignore"):
            return Evaluator(standin=draw == 0).apply(t, args)


def _close(a, b) -> bool:
    if a.shape != b.shape:
        return False
    # np.allclose's own test, without its overhead, for the common all-finite case;
    # np.allclose decides the rest (equal infinities count as close there)
    if (np.abs(a - b) <= 1e-9 + 1e-6 * np.abs(b)).all():
        return True
    return np.allclose(a, b, rtol=1e-6, atol=1e-9)


def _same_on_check(e: Enumeration, a: int, b: int) -> bool:
    with np.errstate(all="ignore"):
        return _close(e.check_value(a), e.check_value(b))


def _implied_in_context(e: Enumeration, a: int, b: int) -> bool:
    ta, tb = e.terms[a], e.terms[b]
    if ta.op == "proj" and tb.op == "proj":
        if ta.index != tb.index:
            return False
        ta, tb = e.terms[ta.children[0]], e.terms[tb.children[0]]
    if ta.op in ("leaf", "proj") or ta.choice != tb.choice or len(ta.children) != len(tb.children):
        return False
    return all(x == y or e.fingerprints.get(x) == e.fingerprints.get(y)
               for x, y in zip(ta.children, tb.children))


def _common_subgraph(e: Enumeration, a: int, b: int, seed: int) -> bool:
    shared = (e.terms[a].nodes & e.terms[b].nodes) - {a, b}
    for s in sorted(shared):
        if e.terms[s].op == "split":
            continue
        sub = _Substituted(e, s, seed + s)
        f0 = (fingerprint(sub.value(a, 0)), fingerprint(sub.value(b, 0)))
        if f0[0] is not None and f0[0] == f0[1] and _close(sub.value(a, 1), sub.value(b, 1)):
            return True
    return False


# --- pruning -------------------------------------------------------------------------


def prune(e: Enumeration, progress=None) -> Pruned:
    """Candidates of the enumeration, pruned; ``progress(done, total)`` per class."""
    start = time.perf_counter()
    out = Pruned(kept=[])
    seen: set = set()
    classes = [ids for ids in e.classes.values() if len(ids) > 1]
    rewrites = set()  # (lhs, rhs) ids that are rewrites on their own
    half_rules = []  # (small, merged) pairs a two-output rule may complete
    for n, ids in enumerate(classes):
        k = len(ids)
        out.candidates += k * (k - 1) // 2
        out.dropped["transitive"] += (k - 1) * (k - 2) // 2
        rep = ids[0]
        for b in ids[1:]:
            a = rep
            if e.terms[a].weight_only and e.terms[b].weight_only:
                reason = "weight-only"
            else:
                if e.terms[b].op == "proj" or e.terms[a].op == "proj":
                    # before renamed twins are dropped: a two-output rule needs both halves
                    if _same_on_check(e, a, b):
                        _note_halves(e, a, b, rewrites, half_rules)
                reason = _single_reason(e, a, b, seen)
            if reason:
                out.dropped[reason] += 1
                continue
            size = max(e.terms[a].size, e.terms[b].size)
            out.kept.append(Candidate((a,), (b,), size))
        if progress:
            progress(n + 1, len(classes))
    _multi(e, half_rules, rewrites, seen, out)
    out.seconds = round(time.perf_counter() - start, 3)
    return out


def _single_reason(e: Enumeration, a: int, b: int, seen: set) -> str | None:
    key = _unordered_key(e, (a,), (b,))
    if key in seen:
        return "renamed duplicate"
    seen.add(key)
    left, right = key.split(" => ")
    if left == right and not _plain_commutation(e, a, b):
        return "renamed duplicate"  # operands swapped somewhere: commutativity implies it
    if not _same_on_check(e, a, b):
        return "false match"
    if _computes_a_constant(e, a) or _computes_a_constant(e, b):
        return "computes a constant"
    if _implied_in_context(e, a, b):
        return "implied in context"
    if _common_subgraph(e, a, b, e.seed + 7):
        return "common subgraph"
    la, lb = e.terms[a].leaves, e.terms[b].leaves
    if not (la <= lb or lb <= la) or (la != lb and _bare_leaf(e, a if la > lb else b)):
        return "unbound variables"
    if _rearranges_broadcast(e, a) and _rearranges_broadcast(e, b):
        return "rearranges a broadcast"
    if _groups_convs(e, a) or _groups_convs(e, b):
        return "groups convs"
    if _scales_a_product_of_activations(e, a) and _scales_a_product_of_activations(e, b):
        return "moves a scalar between activations"
    return None


def _computes_a_constant(e: Enumeration, tid: int) -> bool:
    """An operator of the term that reads an input (not only generated constants) has
    the same value on the integer fingerprint draw and the real-valued check draw."""
    return any(_constant_node(e, n) for n in e.terms[tid].nodes)


def _constant_node(e: Enumeration, n: int) -> bool:
    # memoized on the enumeration: a class's representative is tested against every member
    memo = e.__dict__.setdefault("_constant_nodes", {})
    if n not in memo:
        t = e.terms[n]
        specs = _leaf_specs(e)
        if all(specs[lf].is_constant for lf in t.leaves):
            memo[n] = False
        else:
            drawn = e.values[n] if t.op == "split" else [e.values[n]]
            with np.errstate(all="ignore"):
                memo[n] = all(_close(np.asarray(a), np.asarray(b)) for a, b in zip(drawn, e.check_outputs(n)))
    return memo[n]


def _rearranges_broadcast(e: Enumeration, tid: int) -> bool:
    """The term is one associative-commutative operator over leaves, a bias among them.
    Both sides such a term: a rearrangement the hand rules' associativity and
    commutativity make for equal shapes; with a broadcast operand it multiplies every
    biased sum (MobileNet-v2's export: 497 e-nodes to the node limit, 0.3 s to 73 s),
    and the one graph it led to on the zoo and real exports (ResNet-50's residual into
    a conv's sum input) measured slower."""
    t = e.terms[tid]
    ops = {e.terms[n].op for n in t.nodes}
    specs = _leaf_specs(e)
    return len(ops) == 1 and ops <= {"ewadd", "ewmul"} and any(specs[n].role == "bias" for n in t.leaves)


def _groups_convs(e: Enumeration, tid: int) -> bool:
    """A conv of concatenated inputs and concatenated weights: two convs of different
    inputs as one grouped conv, a copy of both inputs for the same FLOPs; with the
    concat rules it pairs every two concatenated convs (SqueezeNet: 178 e-nodes to the
    ceiling)."""
    for n in e.terms[tid].nodes:
        t = e.terms[n]
        if t.op == "conv2d" and all(e.terms[c].op == "concat" for c in t.children):
            return True
    return False


def _scales_a_product_of_activations(e: Enumeration, tid: int) -> bool:
    """A matmul of two activations and a scalar multiplication, somewhere. Both sides
    such a term: the scalar moved between the product and its operands (attention's
    scale among q, k and the scores). The hand rules fold a scale into a weight
    already; between activations the move only changes which tensor is scaled, and on
    BERT-base's export the four such rules cost 28 s of ILP (the LP relaxation spreads
    over the q/k/v merges; 0.1 s without them) for a graph predicted 0.014 % cheaper."""
    t = e.terms[tid]
    specs = _leaf_specs(e)
    return sorted(e.terms[n].op for n in t.nodes) == ["matmul", "smul"] and \
        all(specs[n].role in ("activation", "scalar") for n in t.leaves)


def _plain_commutation(e: Enumeration, a: int, b: int) -> bool:
    """``op(x, y)`` against ``op(y, x)`` on two inputs: the commutativity rule itself."""
    ta, tb = e.terms[a], e.terms[b]
    return _commutative(ta.op) and ta.choice == tb.choice and \
        all(e.terms[c].op == "leaf" for c in ta.children + tb.children)


def _bare_leaf(e: Enumeration, tid: int) -> bool:
    return e.terms[tid].op == "leaf"


def _note_halves(e: Enumeration, a: int, b: int, rewrites: set, half_rules: list) -> None:
    for small, merged in ((a, b), (b, a)):
        if e.terms[merged].op == "proj" and e.terms[small].op != "leaf" \
                and not _has_split(e, small):
            if e.terms[merged].leaves <= e.terms[small].leaves:
                rewrites.add((small, merged))
            else:
                half_rules.append((small, merged))


def _has_split(e: Enumeration, tid: int) -> bool:
    return any(e.terms[n].op == "split" for n in e.terms[tid].nodes)


def _multi(e: Enumeration, half_rules: list, rewrites: set, seen: set, out: Pruned) -> None:
    """Two-output candidates: (t, t') -> (proj i S, proj j S) of one split S."""
    by_split: dict[int, list] = {}
    for small, merged in half_rules:
        by_split.setdefault(e.terms[merged].children[0], []).append((small, merged))
    for split, halves in by_split.items():
        partners = [(s, m) for s, m in _all_halves(e, split, half_rules, rewrites)]
        for (t1, u1), (t2, u2) in itertools.product(halves, partners):
            if u1 == u2 or t1 == t2 or e.terms[u1].index > e.terms[u2].index:
                continue
            if not (e.terms[u1].leaves | e.terms[u2].leaves) <= (e.terms[t1].leaves | e.terms[t2].leaves):
                continue
            if len(e.terms[t1].nodes | e.terms[t2].nodes) > e.size:
                continue
            out.multi_candidates += 1
            if not _concatenates_weight(e, u1):
                out.dropped["merges no weight"] += 1
                continue
            key = _unordered_key(e, (t1, t2), (u1, u2))
            if key in seen:
                out.dropped["renamed duplicate"] += 1
                continue
            seen.add(key)
            if (t1, u1) in rewrites and (t2, u2) in rewrites:
                out.dropped["decomposes"] += 1
                continue
            out.kept.append(Candidate((t1, t2), (u1, u2), len(e.terms[u1].nodes)))


def _concatenates_weight(e: Enumeration, tid: int) -> bool:
    """Whether a concat in the term reads a weight (or bias) leaf: a merge pays only
    when that concat folds at export; one of activations alone would pair every two
    same-shaped tensors of a graph (two relus become a relu of their concat, split)."""
    specs = _leaf_specs(e)
    t = e.terms[tid]
    if t.op == "concat" and any(specs[n].role in ("weight", "bias") for c in t.children for n in e.terms[c].leaves):
        return True
    return any(_concatenates_weight(e, c) for c in t.children)


def _all_halves(e: Enumeration, split: int, half_rules: list, rewrites: set):
    for small, merged in half_rules:
        if e.terms[merged].children[0] == split:
            yield small, merged
    for small, merged in rewrites:
        if e.terms[merged].children[0] == split:
            yield small, merged


# --- candidates -> rules -------------------------------------------------------------


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
    if t.op == "concat":
        return App("concat", (Lit(t.params["axis"]),), kids)
    params = tuple(sizes[tid] if k == "sizes" and sizes and tid in sizes else Lit(_literal(t.params[k]))
                   for k in OPS[t.op].defaults)
    return App(t.op, params, kids)


def _literal(v):
    return tuple(v) if isinstance(v, (list, tuple)) else v


def _cost(e: Enumeration, tids: tuple) -> tuple:
    nodes = frozenset().union(*(e.terms[t].nodes for t in tids))
    return (len(nodes), len(_leaf_order(e, tids)))


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
    (:mod:`.shapes`), and that their shapes agree; a split's sizes are the dims of what
    it takes apart (on the left side a parameter variable ``?szN`` that a guard ties to
    them), a constant's shape a parameter variable ``?shN`` that guards tie to the
    tensors' dims (TASO's ``const_one`` is as wide as what it multiplies), and the
    example gives dims no equation ties distinct sizes. Where typing asks of a constant
    something no guard states (a product or quotient of two varying dims), the
    constant keeps the menu's shape; where it asks that of the inputs, the guards keep
    the example's shapes (``_pinned_shape_guards``). None when a split cuts elsewhere
    than between concatenated operands (its sizes are no operand's dims: the rule would
    hold on the generator's numbers only)."""
    names = _variables(e, lhs + rhs)
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
    """The rule under the guards typing asks (:func:`~.shapes.shape_guards`), on an
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
    leaves = _leaf_specs(e)
    constants = [n for n in _leaf_order(e, tids) if leaves[n].is_constant]
    return {n: f"sh{k}" for k, n in enumerate(constants)}


def _example(e: Enumeration, tids, names: dict, leaves: dict) -> dict:
    """The menu's shapes of the named leaves: a tensor's, or a constant's shape parameter."""
    return {names[n]: tuple(leaves[n].shape) for n in _leaf_order(e, tids) if n in names}


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
    order = [n for n in _leaf_order(e, tids) if n in names]
    if any(_has_split(e, t) for t in tids):
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
            walk(c, (concatenated_here or t.op == "concat") and e.terms[c].weight_only)

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


__all__ = ["Candidate", "Pruned", "REASONS", "prune", "rules_from", "sized_rules", "to_rule",
           "orientations", "canonical", "generalize_or_pin", "pinned_to_example"]
