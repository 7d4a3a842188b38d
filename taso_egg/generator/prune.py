"""From equal fingerprints to candidate rules: TASO's pruning.

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

The kept candidates become rules in :mod:`.emit`.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field

import numpy as np

from taso_egg.ops import CONCAT, CONV2D, OPS, SPLIT

from .enumerate import Enumeration, Evaluator, fingerprint, integer_draw

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


def leaf_order(e: Enumeration, tids) -> list:
    return list(dict.fromkeys(n for t in tids for n in _pieces(e, t)[1::2]))


def leaf_specs(e: Enumeration) -> dict:
    """Leaf name -> LeafSpec of the enumeration's menu (built once, kept on it)."""
    return e.__dict__.setdefault("leaf_specs", {lf.name: lf for lf in e.menu.leaves})


def variable_names(e: Enumeration, tids) -> dict:
    """Leaf name -> variable name, by first use in ``tids``; constants stay unnamed."""
    leaves = leaf_specs(e)
    names, counters = {}, {}
    for name in leaf_order(e, tids):
        lf = leaves[name]
        if lf.is_constant:
            continue
        k = counters.get(lf.prefix, 0)
        counters[lf.prefix] = k + 1
        names[name] = f"{lf.prefix}{k}"
    return names


def canonical(e: Enumeration, lhs: tuple, rhs: tuple) -> str:
    """The candidate's text with inputs renamed by first use, lhs first."""
    names = variable_names(e, lhs + rhs)

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
        if e.terms[s].op == SPLIT.name:
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
        specs = leaf_specs(e)
        if all(specs[lf].is_constant for lf in t.leaves):
            memo[n] = False
        else:
            drawn = e.values[n] if t.op == SPLIT.name else [e.values[n]]
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
    specs = leaf_specs(e)
    return len(ops) == 1 and ops <= {"ewadd", "ewmul"} and any(specs[n].role == "bias" for n in t.leaves)


def _groups_convs(e: Enumeration, tid: int) -> bool:
    """A conv of concatenated inputs and concatenated weights: two convs of different
    inputs as one grouped conv, a copy of both inputs for the same FLOPs; with the
    concat rules it pairs every two concatenated convs (SqueezeNet: 178 e-nodes to the
    ceiling)."""
    for n in e.terms[tid].nodes:
        t = e.terms[n]
        if t.op == CONV2D.name and all(e.terms[c].op == CONCAT.name for c in t.children):
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
    specs = leaf_specs(e)
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
                and not has_split(e, small):
            if e.terms[merged].leaves <= e.terms[small].leaves:
                rewrites.add((small, merged))
            else:
                half_rules.append((small, merged))


def has_split(e: Enumeration, tid: int) -> bool:
    return any(e.terms[n].op == SPLIT.name for n in e.terms[tid].nodes)


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
    specs = leaf_specs(e)
    t = e.terms[tid]
    if t.op == CONCAT.name and any(specs[n].role in ("weight", "bias") for c in t.children for n in e.terms[c].leaves):
        return True
    return any(_concatenates_weight(e, c) for c in t.children)


def _all_halves(e: Enumeration, split: int, half_rules: list, rewrites: set):
    for small, merged in half_rules:
        if e.terms[merged].children[0] == split:
            yield small, merged
    for small, merged in rewrites:
        if e.terms[merged].children[0] == split:
            yield small, merged


__all__ = ["Candidate", "Pruned", "REASONS", "prune", "canonical", "leaf_order", "leaf_specs", "variable_names",
           "has_split"]
