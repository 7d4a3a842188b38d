"""TASO-style rule discovery: enumerate every small graph over a menu of operators on
small symbolic inputs, fingerprint each by running it through the operator table's
kernels on random integer-valued tensors, and group graphs with equal fingerprints.

Graphs are enumerated bottom-up as hash-consed terms (a shared sub-term is one
operator, so terms are DAGs): a term of size ``s`` has ``s`` distinct operators. Each
term's value is computed once from its children's memoized values. Only the first
term found for a value (its *representative*) is used as a child of bigger terms: a
graph built on another member of the class is equal to one built on the
representative by a smaller rule in context, so no rule is lost modulo implication,
and the enumeration stays small.

Fingerprints: inputs hold small random nonzero integers in float64; relu (and fused RELU
activations) is replaced by ``x*(x+1)+1`` so that zeros produce no false matches
(REFERENCE.md). The value is hashed after rounding to float32, which absorbs the
rounding-order differences of float64 sums; every candidate pair is then confirmed
on a second, real-valued draw with the real relu.
"""

from __future__ import annotations

import itertools
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from taso_egg.errors import TasoEggError
from taso_egg.ops import OPS, TensorType, menus
from taso_egg.ops import shapes as shape_cases
from taso_egg.ops.menus import ENUMERATED, STACKED

# --- the menu ----------------------------------------------------------------------


@dataclass(frozen=True)
class LeafSpec:
    """A symbolic input. ``role`` is "activation", "weight", "bias" (a weight that
    element-wise operators broadcast: never a kernel), "scalar", "param" (a
    normalization's per-feature vector: only ever an operand a choice names, drawn
    positive where the operator needs it, as a variance) or a constant
    operator (``const_imm`` ...). Leaves of one ``kind`` (role and shape) are
    interchangeable: rules equal up to renaming them are duplicates. ``prefix`` names
    the rule variables made from the class."""

    name: str
    shape: tuple
    role: str
    prefix: str

    @property
    def kind(self) -> tuple:
        return (self.role, self.shape)

    @property
    def is_constant(self) -> bool:
        """One of TASO's generated constants (``const_one`` ...), not an input."""
        return self.role.startswith("const_")


@dataclass(frozen=True)
class OpChoice:
    """One operator with fixed parameters. ``split`` takes its sizes from the input:
    two halves along ``axis``. ``operands`` restricts each input to "data" (computed
    from an activation), "weight" (from weights, constants and the scalar only),
    "leaf" (a weight itself), as a real model feeds a convolution, an operator's name
    (computed through that operator: as in TASO, a split only takes apart what a concat
    put together),
    "matrix" (rank 2) or "=NAME", that leaf of the menu and nothing else (a
    normalization's parameters: in a model they are always its own initializers, so
    enumerating other terms there only multiplies graphs); None allows anything."""

    op: str
    params: tuple  # sorted (name, value) pairs, the operator's own parameters
    operands: tuple | None = None

    def param_dict(self) -> dict:
        return dict(self.params)

    def fixed(self, index: int) -> str | None:
        """The leaf operand ``index`` is fixed to, if any."""
        role = self.operands[index] if self.operands and index < len(self.operands) else ""
        return role[1:] if role.startswith("=") else None

    def label(self) -> str:
        if not self.params:
            return self.op
        return self.op + "(" + ",".join(f"{k}={v}" for k, v in self.params) + ")"


def choice(op: str, operands: tuple | None = None, **params) -> OpChoice:
    if op not in OPS:
        raise TasoEggError(f"menu: unknown operator {op!r}")
    unknown = set(params) - set(OPS[op].defaults)
    if unknown:
        raise TasoEggError(f"menu: {op} has no parameter(s) {sorted(unknown)}")
    return OpChoice(op, tuple(sorted(params.items())), operands)


@dataclass(frozen=True)
class Menu:
    """``max_weight_ops`` caps the operators of a weight-only sub-graph: such a
    sub-graph is folded into a constant at export, so rules about bigger ones only
    reshuffle constants."""

    name: str
    leaves: tuple
    ops: tuple
    max_weight_ops: int = 2


def _leaves_2d(activations: int, weights: int, biases: int = 0) -> list:
    out = [LeafSpec(f"x{i}", (2, 4), "activation", "x") for i in range(activations)]
    out += [LeafSpec(f"w{i}", (4, 4), "weight", "w") for i in range(weights)]
    # a per-column bias, which element-wise operators broadcast over a 2x4 activation
    out += [LeafSpec(f"b{i}", (1, 4), "bias", "b") for i in range(biases)]
    return out


def _leaves_4d(activations: int, kernels: int, channels: int = 0) -> list:
    out = [LeafSpec(f"X{i}", (2, 4, 5, 5), "activation", "X") for i in range(activations)]
    out += [LeafSpec(f"K{i}", (4, 4, 3, 3), "weight", "K") for i in range(kernels)]
    out += [LeafSpec("H0", (4, 4, 1, 3), "weight", "H"), LeafSpec("V0", (4, 4, 3, 1), "weight", "V"),
            LeafSpec("D0", (4, 1, 3, 3), "weight", "D")]
    # a per-channel constant (a folded batchnorm's scale or shift), broadcast over NCHW
    out += [LeafSpec(f"C{i}", (1, 4, 1, 1), "bias", "C") for i in range(channels)]
    return out


def _scalars(n: int) -> list:
    # two, for the scalar algebra's rules of two scalars (smul associativity)
    return [LeafSpec("s" if i == 0 else f"s{i}", (), "scalar", "s") for i in range(n)]


def _norm_params() -> list:
    """Layer norm's scale and bias over a 2x4 matrix's rows and batchnorm's four
    per-channel vectors over the 4 channels of the 4-D activations (one set: the
    operand positions are fixed, so sharing them conflates nothing)."""
    return [LeafSpec(f"p{i}", (4,), "param", "p") for i in range(3)] + [LeafSpec("v0", (4,), "param", "v")]


def _constants() -> list:
    return [LeafSpec("imm", (4, 4), "const_imm", "imm"), LeafSpec("one", (2, 4), "const_one", "one"),
            LeafSpec("iconv", (4, 4, 3, 3), "const_iconv", "iconv"),
            LeafSpec("idw", (4, 1, 3, 3), "const_iconv", "idw"),
            LeafSpec("pool", (4, 1, 3, 3), "const_pool", "pool")]


def menu_choices(menu: str) -> tuple:
    """The operator choices of ``menu``, as the operator table declares them
    (ops/menus.py), in its order."""
    return tuple(choice(op, e.operands, **e.params) for op, builds in ENUMERATED.items()
                 for e in builds if menu in e.menus)


def default_menu() -> Menu:
    """TASO's menu (REFERENCE.md) and real models' operators: 2-D 2x4 activations,
    4x4 weights and a 1x4 per-column bias, 4-D 2x4x5x5 activations with 3x3/1x3/3x1 and
    depth-wise kernels and a 1x4x1x1 per-channel constant, two scalars, the constants,
    and layer norm (on matrices) and batchnorm with their parameter vectors.
    Three 2-D activations (three-input associativity, concat distributing over
    element-wise operators) and two of every other kind, which size 3 needs at most for
    a rule's interesting variables: the 4-D kinds multiply the convolutions' graphs."""
    leaves = (_leaves_2d(3, 2, biases=1) + _leaves_4d(2, 2, channels=1) + _scalars(2)
              + _norm_params() + _constants())
    return Menu("taso", tuple(leaves), menu_choices("taso"))


def reduced_menu() -> Menu:
    """For size 4: 2-D graphs over two activations and two weights with ewadd, relu,
    transpose, matmul, concat and split (the matmul/concat/split algebra of TASO's
    merges); the 4-D and constant part would multiply the graphs beyond what this
    pure-Python enumerator does in minutes."""
    return Menu("reduced", tuple(_leaves_2d(2, 2)), menu_choices("reduced"))


def matrix_menu(activations: int = 3, weights: int = 3) -> Menu:
    """2-D operators only: small and fast (tests, quick experiments)."""
    leaves = _leaves_2d(activations, weights) + [LeafSpec("s", (), "scalar", "s"),
                                                 LeafSpec("imm", (4, 4), "const_imm", "imm")]
    return Menu("matrix", tuple(leaves), menu_choices("matrix"))


MENUS: dict[str, Callable[[], Menu]] = {"taso": default_menu, "reduced": reduced_menu,
                                        "matrix": matrix_menu}
if tuple(MENUS) != menus.MENUS:
    raise RuntimeError("generator: the operator table's menus and the leaves' menus differ")


# --- terms -------------------------------------------------------------------------


@dataclass(slots=True)
class Term:
    """A tensor of an enumerated graph: a leaf, an operator output, or output
    ``index`` of a split (``op == "proj"``, child 0 the split node)."""

    id: int
    op: str  # "leaf", "proj", an operator name, or "split" for the (non-tensor) split node
    choice: OpChoice | None
    children: tuple
    shape: tuple
    nodes: frozenset  # ids of the operator nodes (not leaves, not projections)
    leaves: frozenset
    leaf: LeafSpec | None = None
    weight_only: bool = False
    index: int = 0  # output of a split
    params: dict = field(default_factory=dict)  # full operator parameters

    @property
    def size(self) -> int:
        return len(self.nodes)


_WEIGHT_ROLES = {"data": False, "weight": True, "leaf": True}  # role -> weight-only


def _role_fails(role: str, kid: Term, terms: list, biases: frozenset) -> bool:
    if role in ("weight", "leaf") and kid.leaves & biases:
        return True
    if role == "leaf":
        return kid.op != "leaf"
    if role in OPS and role not in _WEIGHT_ROLES:  # computed through that operator
        return not any(terms[n].op == role for n in kid.nodes)
    return False


_CHUNK = 256


def relu_standin(x):
    """Zero-free stand-in for relu in fingerprints (REFERENCE.md)."""
    return x * (x + 1) + 1


class Evaluator:
    """Runs a term's operator through the table's kernels. ``fingerprint`` mode feeds
    integer-valued data and uses the relu stand-in; the other mode uses real relu."""

    def __init__(self, standin: bool):
        self.standin = standin

    def apply(self, term: Term, args: list) -> list:
        return self.run(term.op, term.params, args)

    def run(self, op: str, params: dict, args: list) -> list:
        p = dict(params)
        act = p.get("activation", "NONE")
        if OPS[op].activation == "RELU":  # relu itself
            return [relu_standin(args[0])] if self.standin else OPS[op].kernel(np, p, *args)
        if self.standin and act == "RELU":
            p["activation"] = "NONE"
            (y,) = OPS[op].kernel(np, p, *args)
            return [relu_standin(y)]
        return OPS[op].kernel(np, p, *args)

    def run_many(self, op: str, params: dict, arg_lists: list) -> list:
        """``run`` over many argument lists of equal shapes, in few kernel calls (the
        kernels' Python loops over kernel taps then run once per chunk, not once per
        graph). Pools stack their inputs along the batch axis; convolutions stack
        inputs along channels and weights along output channels, which makes one
        grouped convolution whose groups are the separate ones."""
        stacked = STACKED.get(op)
        if not stacked or len(arg_lists) < 2:
            return [self.run(op, params, args) for args in arg_lists]
        out = []
        for lo in range(0, len(arg_lists), _CHUNK):
            chunk = arg_lists[lo:lo + _CHUNK]
            if stacked == "groups":
                (y,) = self.run(op, params, [np.concatenate([a[0] for a in chunk], axis=1),
                                             np.concatenate([a[1] for a in chunk], axis=0)])
                width = chunk[0][1].shape[0]
                out += [[y[:, i * width:(i + 1) * width]] for i in range(len(chunk))]
            else:
                (y,) = self.run(op, params, [np.concatenate([a[0] for a in chunk], axis=0)])
                width = chunk[0][0].shape[0]
                out += [[y[i * width:(i + 1) * width]] for i in range(len(chunk))]
        return out


def integer_draw(rng, shape):
    """Small nonzero integers in float64: a fingerprint draw (without zeros, a division
    by an input is finite)."""
    v = rng.integers(-3, 3, size=shape)
    return np.where(v >= 0, v + 1, v).astype(np.float64)


def positive_leaves(menu) -> frozenset:
    """Leaves a choice fixes as an input its operator needs positive (a variance)."""
    return frozenset(c.fixed(i) for c in menu.ops for i in OPS[c.op].positive_inputs if c.fixed(i))


def leaf_value(leaf: LeafSpec, rng, integer: bool, positive: bool = False):
    if leaf.is_constant:
        (v,) = OPS[leaf.role].kernel(np, {"shape": leaf.shape, "dtype": "float64"})
        return v
    v = integer_draw(rng, leaf.shape) if integer else rng.standard_normal(leaf.shape)
    return np.abs(v) + (0 if integer else 0.5) if positive else v


def fingerprint(value) -> tuple | None:
    """Shape and float32 bytes of the value; None when it overflowed."""
    v = np.asarray(value, dtype=np.float32) + np.float32(0)  # -0.0 hashes as 0.0
    if not np.isfinite(v).all():
        return None
    return (v.shape, v.tobytes())


# --- enumeration -------------------------------------------------------------------


def _with_fixed(c: OpChoice, leaf_ids: dict, arity: int, kid_tuples):
    """``kid_tuples`` over the enumerated operands of ``c``, with the leaves it fixes
    put in their places."""
    fixed = {i: leaf_ids[c.fixed(i)] for i in range(arity) if c.fixed(i)}
    if not fixed:
        yield from kid_tuples
        return
    for kids in kid_tuples:
        it = iter(kids)
        yield tuple(fixed[i] if i in fixed else next(it) for i in range(arity))


def _child_tuples(pool, containing, terms, shapes, want):
    """Child id tuples with the given types (shape, weight-only) whose operators number exactly ``want``
    together: disjoint children whose sizes add up, or children sharing operators
    (found through ``containing``, the terms of each type that hold a node, so the
    quadratic scan is avoided)."""
    if len(shapes) == 1:
        yield from ((t,) for t in pool.get(want, {}).get(shapes[0], ()))
        return
    if len(shapes) != 2:
        raise TasoEggError(f"generator: operators with {len(shapes)} inputs are not supported")
    sa, sb = shapes
    for a in range(want + 1):
        left = pool.get(a, {}).get(sa, ())
        right = pool.get(want - a, {}).get(sb, ())
        if not left or not right:
            continue
        if a == 0 or a == want:  # one side is a leaf: no operators to overlap
            yield from itertools.product(left, right)
            continue
        for x in left:
            nx = terms[x].nodes
            for y in right:
                if nx.isdisjoint(terms[y].nodes):
                    yield (x, y)
    # shared operators: y holds one of x's nodes, and the union has ``want`` nodes
    for a in range(1, want + 1):
        for x in pool.get(a, {}).get(sa, ()):
            nx = terms[x].nodes
            seen = set()
            for n in nx:
                for y in containing.get((n, sb), ()):
                    if y in seen:
                        continue
                    seen.add(y)
                    if len(nx | terms[y].nodes) == want:
                        yield (x, y)


@dataclass
class Enumeration:
    menu: Menu
    size: int
    terms: list  # every Term, id == index
    values: dict  # term id -> fingerprint-mode value (tensor terms and split nodes)
    checks: dict  # term id -> real-valued value (second draw), computed lazily
    classes: dict  # fingerprint -> [tensor term ids], first one the representative
    fingerprints: dict  # term id -> fingerprint
    stats: dict
    seed: int

    def check_value(self, tid: int):
        """The term's value on the second, real-valued draw (real relu)."""
        if tid not in self.checks:
            t = self.terms[tid]
            if t.op == "leaf":
                self.checks[tid] = leaf_value(t.leaf, self._check_rng(t.leaf), integer=False,
                                              positive=t.leaf.name in positive_leaves(self.menu))
            elif t.op == "proj":
                self.checks[tid] = self.check_outputs(t.children[0])[t.index]
            else:
                self.checks[tid] = self.check_outputs(tid)[0]
        return self.checks[tid]

    def check_outputs(self, tid: int) -> list:
        key = ("outs", tid)
        if key not in self.checks:
            t = self.terms[tid]
            args = [self.check_value(c) for c in t.children]
            self.checks[key] = Evaluator(standin=False).apply(t, args)
        return self.checks[key]

    def _check_rng(self, leaf: LeafSpec):
        # crc32, not hash(): string hashes change from process to process
        return np.random.default_rng([self.seed + 1, zlib.crc32(leaf.name.encode())])


def enumerate_terms(menu: Menu, size: int = 3, seed: int = 0, progress=None,
                    representatives_only: bool = True) -> Enumeration:
    """Every term of up to ``size`` operators over ``menu``. ``progress(done, total)``
    is called once per operator choice and size level."""
    if size < 1:
        raise TasoEggError(f"generator size must be at least 1, got {size}")
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    ev = Evaluator(standin=True)
    terms: list[Term] = []
    values: dict = {}
    fps: dict = {}
    classes: dict = {}
    infer_cache: dict = {}
    counts = {"terms": 0, "non_finite": 0}
    # tensor terms usable as children, by size then type (shape, weight-only)
    usable: dict[int, dict[tuple, list]] = {}

    def add_tensor(t: Term, value, fp) -> None:
        terms.append(t)
        values[t.id] = value
        fps[t.id] = fp
        members = classes.setdefault(fp, [])
        members.append(t.id)
        if not representatives_only or len(members) == 1:
            usable.setdefault(t.size, {}).setdefault((t.shape, t.weight_only), []).append(t.id)

    leaf_ids: dict = {}
    biases = frozenset(lf.name for lf in menu.leaves if lf.role == "bias")
    positive = positive_leaves(menu)
    for leaf in menu.leaves:
        if leaf.name in leaf_ids:
            raise TasoEggError(f"menu {menu.name!r}: leaf name {leaf.name!r} used twice")
        t = Term(len(terms), "leaf", None, (), leaf.shape, frozenset(), frozenset([leaf.name]), leaf,
                 weight_only=leaf.role != "activation")
        leaf_ids[leaf.name] = t.id
        value = leaf_value(leaf, rng, integer=True, positive=leaf.name in positive)
        if leaf.role == "param":  # an operand only where a choice names it
            terms.append(t)
            values[t.id] = value
            fps[t.id] = fingerprint(value)
        else:
            add_tensor(t, value, fingerprint(value))
    for c in menu.ops:
        for i in range(OPS[c.op].inputs[0]):
            if c.fixed(i) and c.fixed(i) not in leaf_ids:
                raise TasoEggError(f"menu {menu.name!r}: {c.label()} names leaf {c.fixed(i)!r}, not in the menu")

    def out_types(c: OpChoice, shapes: tuple):
        key = (c, shapes)
        if key not in infer_cache:
            params = dict(OPS[c.op].defaults)
            params.update(c.params)
            if OPS[c.op].multi_output:  # its output sizes are the generator's: two halves
                dim = shapes[0][c.param_dict()["axis"]] if len(shapes[0]) > c.param_dict()["axis"] else 0
                if dim < 2 or dim % 2:
                    infer_cache[key] = None
                    return None
                params["sizes"] = (dim // 2, dim // 2)
            try:
                outs = OPS[c.op].infer(params, [TensorType(s) for s in shapes])
                infer_cache[key] = (params, tuple(o.shape for o in outs))
            except TasoEggError:
                infer_cache[key] = None
            # Only what the e-graph holds: an application in one of the operator's shape
            # cases (a batched matmul broadcasting its batch dims runs, but is in none;
            # the verifier, which types left sides by the cases, would prove its rules
            # from contradicting hypotheses).
            if infer_cache[key] is not None and OPS[c.op].shape and \
                    shape_cases.evaluate(OPS[c.op].shape, params, list(shapes)) is None:
                infer_cache[key] = None
        return infer_cache[key]

    def build_all(c: OpChoice, kid_tuples, params: dict, shapes: tuple) -> None:
        todo = []
        for kids in kid_tuples:  # each tuple comes once: its operator count fixes its level
            kid_terms = [terms[k] for k in kids]
            if c.operands and any(_role_fails(role, k, terms, biases) for role, k in zip(c.operands, kid_terms)
                                  if not role.startswith("=")):
                continue
            weight_only = all(k.weight_only for k in kid_terms)
            if weight_only and len(frozenset().union(*(k.nodes for k in kid_terms))) >= menu.max_weight_ops:
                continue
            todo.append(kids)
        results = ev.run_many(c.op, params, [[values[k] for k in kids] for kids in todo])
        for kids, outs in zip(todo, results):
            build(c, kids, params, shapes, outs)

    def build(c: OpChoice, kids: tuple, params: dict, shapes: tuple, outs: list) -> None:
        kid_terms = [terms[k] for k in kids]
        nodes = frozenset().union(*(k.nodes for k in kid_terms))
        leaves = frozenset().union(*(k.leaves for k in kid_terms))
        weight_only = all(k.weight_only for k in kid_terms)
        node = Term(len(terms), c.op, c, kids, shapes[0] if len(shapes) == 1 else (),
                    nodes | {len(terms)}, leaves, params=params, weight_only=weight_only)
        prints = [fingerprint(o) for o in outs]
        if any(fp is None for fp in prints):
            counts["non_finite"] += 1
            return
        counts["terms"] += 1
        if OPS[c.op].multi_output:
            terms.append(node)
            values[node.id] = outs
            for i, (o, s, fp) in enumerate(zip(outs, shapes, prints)):
                add_tensor(Term(len(terms), "proj", None, (node.id,), s, node.nodes, leaves,
                                index=i, weight_only=weight_only), o, fp)
        else:
            add_tensor(node, outs[0], prints[0])

    total = size * len(menu.ops)
    done = 0
    for s in range(1, size + 1):
        # children: terms below size s, by (size, shape); and who contains each node
        pool = {k: {sh: list(ids) for sh, ids in by_shape.items()}
                for k, by_shape in usable.items() if k < s}
        containing: dict[tuple, list] = {}  # (node, type) -> terms of that type holding it
        for k, by_shape in pool.items():
            for ty, ids in by_shape.items():
                for tid in ids:
                    for n in terms[tid].nodes:
                        containing.setdefault((n, ty), []).append(tid)
        types = sorted({ty for by_type in pool.values() for ty in by_type})
        for c in menu.ops:
            arity = OPS[c.op].egraph_inputs or OPS[c.op].inputs[0]
            free = [i for i in range(arity) if not c.fixed(i)]
            for combo in itertools.product(types, repeat=len(free)):
                if c.operands and any(_WEIGHT_ROLES.get(c.operands[i], wo) != wo
                                      or (c.operands[i] == "matrix" and len(sh) != 2)
                                      for i, (sh, wo) in zip(free, combo)):
                    continue
                if OPS[c.op].broadcasts and len({len(sh) for sh, _ in combo}) > 1:
                    continue  # the bridge reshapes a lower-rank operand first: no graph has these
                shapes = dict(zip(free, (sh for sh, _ in combo)))
                typed = out_types(c, tuple(shapes[i] if i in shapes else terms[leaf_ids[c.fixed(i)]].shape
                                           for i in range(arity)))
                if typed is None:
                    continue
                with np.errstate(all="ignore"):
                    build_all(c, _with_fixed(c, leaf_ids, arity, _child_tuples(pool, containing, terms, combo, s - 1)),
                              *typed)
            done += 1
            if progress:
                progress(done, total)
    stats = {"menu": menu.name, "size": size, "seed": seed, "leaves": len(menu.leaves),
             "op_choices": len(menu.ops), "graphs_enumerated": counts["terms"],
             "non_finite": counts["non_finite"],
             "value_classes": len(classes),
             "enumeration_seconds": round(time.perf_counter() - start, 3)}
    return Enumeration(menu, size, terms, values, {}, classes, fps, stats, seed)


__all__ = ["LeafSpec", "OpChoice", "Menu", "MENUS", "choice", "default_menu", "reduced_menu",
           "matrix_menu", "Term", "Enumeration", "enumerate_terms", "relu_standin",
           "fingerprint", "integer_draw"]
