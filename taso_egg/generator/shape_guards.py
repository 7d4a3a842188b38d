"""What an enumerated graph's typing asks of its inputs' shapes, as rule guards.

The enumerator runs every graph on one shape per input kind, so a rule read off it
holds on those shapes; how far it generalizes is what typing needs. This module runs
the operator table's shape cases (``ops/shapes.py``) on both the example's numbers and,
alongside, on *linear forms* over the inputs' dimensions (``(dim ?x0 1)`` ...): every
equality a case's conditions check becomes an equation between forms, so that the guards
state exactly the equalities typing needs (``x2`` concatenated to ``x0`` along axis 0
keeps its own row count), and a split's sizes become the dims of what was concatenated
(``(split 1 (vec (dim ?w0 1) (dim ?w1 1)) ...)``), not the generator's numbers.

Non-linear dimension arithmetic (a stride-2 window, a division by a non-constant)
becomes an opaque atom; an equation that still holds one after simplification cannot be
stated as a guard, and :func:`shape_guards` then returns None (the caller keeps the
example's shapes, as before).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from taso_egg.ops import OPS, SPLIT
from taso_egg.ops import shapes as sh

from ..rules.ast import Guard, Lit, ParamOp, Var


# --- linear forms -------------------------------------------------------------------------


@dataclass(frozen=True)
class Form:
    """``sum(coeff * atom) + const``; ``terms`` keep first-use order (a concat's form
    lists its operands in order, which a split's sizes follow). ``value`` is the number
    on the example."""

    terms: tuple  # ((atom, coeff), ...), no zero coefficients
    const: int
    value: int

    @staticmethod
    def constant(v: int) -> Form:
        return Form((), v, v)

    @property
    def is_constant(self) -> bool:
        return not self.terms

    def scaled(self, k: int) -> Form:
        if k == 0:
            return Form.constant(0)
        return Form(tuple((a, c * k) for a, c in self.terms), self.const * k, self.value * k)

    def plus(self, other: Form) -> Form:
        coeffs: dict = {}
        for a, c in self.terms + other.terms:
            coeffs[a] = coeffs.get(a, 0) + c
        return Form(tuple((a, c) for a, c in coeffs.items() if c), self.const + other.const,
                    self.value + other.value)


# A dimension atom: ("dim", leaf, axis) of a tensor input, ("at", leaf, axis) of a
# constant's shape parameter (a ``const_one ?sh0`` is as wide as typing lets it be).
DIMENSIONS = ("dim", "at")


def leaf_atom(leaf, axis: int) -> tuple:
    """The dimension atom of axis ``axis`` of menu leaf ``leaf`` (a LeafSpec)."""
    return ("at" if leaf.is_constant else "dim", leaf.name, axis)


def _opaque(fn: str, args: tuple, value: int) -> Form:
    return Form(((("opaque", fn, args), 1),), 0, value)


class _Fail(Exception):
    """A case does not apply on the example."""


class _Concolic:
    """Evaluates shape cases on forms (ints), tuples of forms (vectors) and plain
    parameter values; ``equations`` collects the forms (lhs - rhs) a taken case's
    conditions set to zero."""

    def __init__(self, params: dict, shapes: list, output: int):
        self.params, self.shapes, self.output = params, shapes, output
        self.equations: list = []

    def value(self, e):
        if isinstance(e, sh.Num):
            return Form.constant(e.value)
        if isinstance(e, sh.In):
            if e.index >= len(self.shapes):
                raise _Fail
            return self.shapes[e.index]
        if isinstance(e, sh.P):
            return _lift(self.params[e.name])
        if isinstance(e, sh.OutIndex):
            return Form.constant(self.output)
        if e.fn == "pad":
            padding = self.params[e.args[0].name]
            pads = (0, 0, 0, 0) if padding == "VALID" else padding
            if not isinstance(pads, tuple) or len(pads) != 4:
                raise _Fail
            return Form.constant(pads[e.args[1].value])
        args = [self.value(a) for a in e.args]
        return getattr(self, "_" + {"+": "add", "-": "sub", "*": "mul", "/": "div", "%": "mod"}
                       .get(e.fn, e.fn))(*args)

    # arithmetic
    def _add(self, a, b):
        return a.plus(b)

    def _sub(self, a, b):
        return a.plus(b.scaled(-1))

    def _mul(self, a, b):
        if a.is_constant:
            return b.scaled(a.const)
        if b.is_constant:
            return a.scaled(b.const)
        return _opaque("*", (a, b), a.value * b.value)

    def _quotient(self, a, b):
        if b.value == 0:
            raise _Fail
        q = abs(a.value) // abs(b.value)
        q = q if (a.value >= 0) == (b.value >= 0) else -q
        return q, a.value - q * b.value

    def _div(self, a, b):
        q, r = self._quotient(a, b)
        if b.is_constant and b.const == 1:
            return a
        if b.value == 1 and not a.is_constant:
            # a divisor of 1 on the example (a depth-wise kernel's one channel per group):
            # held at 1, the quotient stays a form of the dividend, not the example's number
            self.equations.append(self._sub(b, Form.constant(1)))
            return a
        if a.is_constant and b.is_constant:
            return Form.constant(q)
        if b.is_constant:
            return _opaque("/", (a, b.const), q)
        # a divisor that varies (a conv's groups: in-channels over the weight's): the
        # example's quotient, which then holds by an equation (a = q b + r)
        self.equations.append(self._sub(a, b.scaled(q).plus(Form.constant(r))))
        return Form.constant(q)

    def _mod(self, a, b):
        q, r = self._quotient(a, b)
        if (a.is_constant and b.is_constant) or (b.is_constant and b.const == 1):
            return Form.constant(r)
        if b.value == 1 and not a.is_constant:  # held at 1, as in _div
            self.equations.append(self._sub(b, Form.constant(1)))
            return Form.constant(0)
        if b.is_constant:
            return _opaque("%", (a, b.const), r)
        self.equations.append(self._sub(a, b.scaled(q).plus(Form.constant(r))))
        return Form.constant(r)

    def _max(self, a, b):
        if a.is_constant and b.is_constant:
            return Form.constant(max(a.const, b.const))
        # a broadcast's dim: the example's larger side, with an equation that keeps it so
        # (equal sides stay equal, a side of 1 stays 1)
        if a.value == b.value:
            self.equations.append(self._sub(a, b))
            return a
        if min(a.value, b.value) == 1:
            one, other = (a, b) if a.value == 1 else (b, a)
            self.equations.append(self._sub(one, Form.constant(1)))
            return other
        return _opaque("max", (a, b), max(a.value, b.value))

    # vectors
    def _len(self, v):
        return Form.constant(len(v))

    def _vec(self, *items):
        return tuple(items)

    def _index(self, v, i):
        if not isinstance(v, tuple) or not i.is_constant or not 0 <= i.const < len(v):
            raise _Fail
        return i.const

    def _get(self, v, i):
        return v[self._index(v, i)]

    def _set(self, v, i, x):
        k = self._index(v, i)
        return v[:k] + (x,) + v[k + 1:]

    def _pop(self, v):
        if not v:
            raise _Fail
        return v[:-1]

    def _remove(self, v, i):
        k = self._index(v, i)
        return v[:k] + v[k + 1:]

    # conditions: the example decides; equalities also become equations
    def holds(self, c: sh.Cond, found: list) -> bool:
        if c.kind == "pad-same":
            return self.params[c.args[0].name] == "SAME"
        if c.kind == "pad-explicit":
            v = self.params[c.args[0].name]
            return v == "VALID" or (isinstance(v, tuple) and len(v) == 4)
        a, b = (self.value(x) for x in c.args)
        if isinstance(a, tuple) != isinstance(b, tuple) or (isinstance(a, tuple) and len(a) != len(b)):
            return c.kind == "!="
        pairs = list(zip(a, b)) if isinstance(a, tuple) else [(a, b)]
        if c.kind == "bcast":
            (x, y), = pairs
            if x.value == y.value:
                found.append(self._sub(x, y))
            elif x.value == 1 or y.value == 1:  # the broadcast side stays 1
                found.append(self._sub(x if x.value == 1 else y, Form.constant(1)))
            else:
                return False
            return True
        ok = sh._COMPARE[c.kind](tuple(x.value for x, _ in pairs), tuple(y.value for _, y in pairs)) \
            if isinstance(a, tuple) else sh._COMPARE[c.kind](a.value, b.value)
        if ok and c.kind == "=":
            found += [self._sub(x, y) for x, y in pairs]
        return ok


def _lift(v):
    if isinstance(v, bool) or v is None or isinstance(v, (str, float)):
        return v
    if isinstance(v, int):
        return Form.constant(v)
    if isinstance(v, tuple) and all(isinstance(x, (int, Form)) and not isinstance(x, bool) for x in v):
        return tuple(x if isinstance(x, Form) else Form.constant(x) for x in v)
    return v


def output_forms(op: str, params: dict, shapes: list, output: int = 0):
    """``(shape forms, equations)`` of output ``output`` of ``op`` on input shapes given
    as tuples of forms; None when no case applies on the example."""
    for case in OPS[op].shape:
        env = _Concolic(params, shapes, output)
        found: list = []
        try:
            if not all(env.holds(c, found) for c in case.when + case.requires):
                continue
            out = env.value(case.out)
        except _Fail:
            continue
        if isinstance(out, tuple):
            return out, found + env.equations
    return None


# --- a rule's shapes -----------------------------------------------------------------------


class ShapeFacts:
    """The forms of every tensor of an enumerated rule's terms and the equations typing
    sets, with each split's sizes read off its input's form where they are a prefix of
    its operands (``sizes`` maps a split node to the two size forms). A constant's dims
    are atoms of its shape parameter (``symbolic_constants``) or the menu's numbers."""

    def __init__(self, e, tids, symbolic_constants: bool = True):
        self.e, self.tids, self.symbolic_constants = e, tuple(tids), symbolic_constants
        self.forms: dict = {}
        self.equations: list = []
        self.sizes: dict = {}
        self.ok = True
        self.off_boundary = False  # a split cuts elsewhere than between concatenated operands
        for t in tids:
            self.form(t)

    def form(self, tid: int):
        if tid in self.forms:
            return self.forms[tid]
        t = self.e.terms[tid]
        if t.op == "leaf":
            if t.leaf.is_constant and not self.symbolic_constants:
                out = tuple(Form.constant(d) for d in t.shape)
            else:
                out = tuple(Form(((leaf_atom(t.leaf, i), 1),), 0, d) for i, d in enumerate(t.shape))
        elif t.op == "proj":
            self.form(t.children[0])
            out = self.forms[("outs", t.children[0])][t.index]
        else:
            ins = [self.form(c) for c in t.children]
            params = dict(t.params)
            if t.op == SPLIT.name:
                params["sizes"] = self._split_sizes(tid, ins[0], params)
            outs = []
            for i in range(len(self._outputs(t))):
                r = output_forms(t.op, params, ins, i)
                if r is None:
                    self.ok = False
                    r = (tuple(Form.constant(d) for d in self._outputs(t)[i]), [])
                outs.append(r[0])
                self.equations += r[1] if i == 0 else []
            self.forms[("outs", tid)] = outs
            out = outs[0]
        self.forms[tid] = out
        return out

    def _outputs(self, t):
        if t.op == SPLIT.name:
            axis = t.params["axis"]
            return [tuple(s if i != axis else size for i, s in enumerate(self.e.terms[t.children[0]].shape))
                    for size in t.params["sizes"]]
        return [t.shape]

    def _split_sizes(self, tid, x, params):
        """The sizes as forms: a prefix of the input's operands along the axis and the
        rest; the example's numbers (and ``ok`` False) where they are not one."""
        sizes = params["sizes"]
        whole = x[params["axis"]]
        units = [a for a, c in whole.terms for _ in range(c)] if all(
            c > 0 and a[0] in DIMENSIONS for a, c in whole.terms) and whole.const == 0 else None
        if units is not None:
            values = [self._atom_value(a) for a in units]
            for k in range(1, len(units)):
                if sum(values[:k]) == sizes[0] and sum(values[k:]) == sum(sizes[1:]) and len(sizes) == 2:
                    parts = (_sum_form(units[:k], values[:k]), _sum_form(units[k:], values[k:]))
                    self.sizes[tid] = parts
                    return parts
        self.ok, self.off_boundary = False, True
        return tuple(Form.constant(s) for s in sizes)

    def _atom_value(self, atom) -> int:
        _, leaf, axis = atom
        return next(lf.shape[axis] for lf in self.e.menu.leaves if lf.name == leaf)


def _sum_form(atoms, values) -> Form:
    out = Form.constant(0)
    for a, v in zip(atoms, values):
        out = out.plus(Form(((a, 1),), 0, v))
    return out


class _Union:
    def __init__(self):
        self.parent: dict = {}
        self.const: dict = {}  # root -> the constant its class equals

    def find(self, a):
        self.parent.setdefault(a, a)
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a, b, order) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if order(rb) < order(ra):
            ra, rb = rb, ra
        self.parent[rb] = ra
        if rb in self.const:
            self.const.setdefault(ra, self.const.pop(rb))

    def normal(self, f: Form) -> Form:
        out = Form((), f.const, f.value)
        for a, c in f.terms:
            if a[0] in DIMENSIONS:
                r = self.find(a)
                term = Form.constant(self.const[r] * c) if r in self.const else Form(((r, c),), 0, 0)
            else:
                term = Form(((a, c),), 0, 0)
            out = out.plus(term)
        return Form(out.terms, out.const, f.value)


def _reduced(f: Form) -> Form:
    """``f = 0`` divided by the gcd of its coefficients and constant, leading sign +."""
    g = math.gcd(f.const, *(c for _, c in f.terms))
    if g == 0:
        return f
    if f.terms and f.terms[0][1] < 0:
        g = -g
    return Form(tuple((a, c // g) for a, c in f.terms), f.const // g, 0)


def solve(equations, order):
    """Equations (forms = 0) as a union-find of dims, the constants some dims equal, and
    the equations left; None when one left holds an opaque atom."""
    uf = _Union()
    pending = list(equations)
    changed = True
    while changed:
        changed, rest = False, []
        for f in pending:
            f = _reduced(uf.normal(f))
            if not f.terms:
                continue  # the example satisfies every equation, so this is 0 = 0
            if f in rest:
                continue
            if len(f.terms) == 2 and f.const == 0 and {c for _, c in f.terms} == {1, -1} \
                    and all(a[0] in DIMENSIONS for a, _ in f.terms):
                uf.union(f.terms[0][0], f.terms[1][0], order)
                changed = True
            elif len(f.terms) == 1 and f.terms[0][0][0] in DIMENSIONS and f.const % f.terms[0][1] == 0:
                uf.const[uf.find(f.terms[0][0])] = -f.const // f.terms[0][1]
                changed = True
            else:
                rest.append(f)
        pending = rest
    if any(a[0] not in DIMENSIONS for f in pending for a, _ in f.terms):
        return None
    return uf, pending


# --- guards --------------------------------------------------------------------------------


def _dim_expr(atom, names):
    return ParamOp(atom[0], (Var(names[atom[1]]), Lit(atom[2])))


def form_expr(f: Form, names):
    """A non-negative form as a parameter expression (``+`` and ``*`` of dims)."""
    parts = []
    for a, c in f.terms:
        x = _dim_expr(a, names)
        parts.append(x if c == 1 else ParamOp("*", (Lit(c), x)))
    if f.const or not parts:
        parts.append(Lit(f.const))
    out = parts[0]
    for p in parts[1:]:
        out = ParamOp("+", (out, p))
    return out


def shape_guards(e, facts: ShapeFacts, names, leaves):
    """``(guards, union-find, equations left)`` for the rule over ``facts`` (its
    variables ``names``: leaf name -> variable, a constant's naming its shape parameter),
    or None where typing asks something no guard states. The guards: each input's rank
    (a constant's shape's length; unless its shape equals an earlier input's), equal dims
    (a whole shape where they all are), dims fixed to constants, and the linear
    equations left. Tensors come before constants, so a constant's sizes read as the
    tensors' dims they equal."""
    tids = facts.tids
    if not facts.ok:
        return None
    order = [n for n in dict.fromkeys(n for t in tids for n in _leaf_names(e, t)) if n in names]
    order.sort(key=lambda n: leaves[n].is_constant)  # stable: first use within each
    rank_of = {n: len(leaves[n].shape) for n in order}
    index = {leaf_atom(leaves[n], i): (k, i) for k, n in enumerate(order) for i in range(rank_of[n])}
    solved = solve(facts.equations, lambda a: index.get(a, (len(order), 0)))
    if solved is None:
        return None
    uf, linear = solved

    def whole(n):  # a tensor's shape, or a constant's shape parameter itself
        return Var(names[n]) if leaves[n].is_constant else ParamOp("shape", (Var(names[n]),))

    in_linear = {a for f in linear for a, _ in f.terms}
    guards = []
    for n in order:
        reps = [uf.find(leaf_atom(leaves[n], i)) for i in range(rank_of[n])]
        same = next((m for m in order[:order.index(n)] if rank_of[m] == rank_of[n]
                     and reps == [uf.find(leaf_atom(leaves[m], i)) for i in range(rank_of[m])]), None)
        if same is not None and rank_of[n]:
            guards.append(Guard("=", (whole(same), whole(n))))
            continue
        length = ParamOp("len" if leaves[n].is_constant else "rank", (Var(names[n]),))
        guards.append(Guard("=", (length, Lit(rank_of[n]))))
        for i, r in enumerate(reps):
            a = leaf_atom(leaves[n], i)
            if r != a:
                guards.append(Guard("=", (_dim_expr(r, names), _dim_expr(a, names))))
            elif r in uf.const:
                guards.append(Guard("=", (_dim_expr(a, names), Lit(uf.const[r]))))
            elif a[0] == "at" and a not in in_linear:
                # a constant's size that typing ties to no tensor (a window's height:
                # the constant's values depend on it, the output's shape does not)
                guards.append(Guard("=", (_dim_expr(a, names), Lit(leaves[n].shape[i]))))
    for f in linear:
        pos = Form(tuple((a, c) for a, c in f.terms if c > 0), max(f.const, 0), 0)
        neg = Form(tuple((a, -c) for a, c in f.terms if c < 0), max(-f.const, 0), 0)
        guards.append(Guard("=", (form_expr(pos, names), form_expr(neg, names))))
    return guards, uf, linear


def _leaf_names(e, tid):
    t = e.terms[tid]
    if t.op == "leaf":
        return [t.leaf.name]
    return [n for c in t.children for n in _leaf_names(e, c)]


def general_example(rule_vars, names, leaves, uf, linear, base):
    """An example where dims that no equation ties take distinct values (so that the
    float checks vary them apart): ``{variable: shape}``; ``base`` is the old one."""
    fixed = {a for f in linear for a, _ in f.terms}
    taken: dict = {}
    used = set()
    out = {}
    inverse = {v: n for n, v in names.items()}
    for v in rule_vars:
        n = inverse[v]
        shape = []
        for i, d in enumerate(base[v]):
            r = uf.find(leaf_atom(leaves[n], i))
            if r in uf.const:
                shape.append(uf.const[r])
                continue
            if r not in taken:
                if r in fixed or d not in used:
                    taken[r] = d
                else:
                    taken[r] = next(x for x in range(2, 64) if x not in used)
                used.add(taken[r])
            shape.append(taken[r])
        out[v] = tuple(shape)
    return out


__all__ = ["Form", "ShapeFacts", "output_forms", "solve", "shape_guards", "form_expr", "general_example",
           "leaf_atom", "DIMENSIONS"]
