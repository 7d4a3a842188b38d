"""Whether a decoder export's additive attention mask is exactly its causal mask and
one integer input's zeros (the model's ``attention_mask``): proved with Z3, element for
element, at the sizes the graph has.

An exporter computes the mask a decoder adds to its scores in some twenty operators:
positions from ranges over the shapes, the causal comparison, the padding read from
``attention_mask`` by a gather over its flattened rows, their conjunction, then
``where(visible, 0, -inf)``. GroupQueryAttention applies the causal part itself; what
it still needs is which keys each row may see, which a [B, T] mask gives in four
operators. ``key_mask`` finds the input that mask is read from, and proves that

    bias[b, h, q, k] = 0 if k <= past + q and mask[b, k] != 0 else -inf

for every element, the mask's values symbolic (Z3 integers): every tensor that depends
on no input's values (shapes, ranges, constants) is computed, every one that depends on
the mask's is built as Z3 terms by the few operators a mask is made of. Anything else
(another input read by value, an operator not listed, a float computed from the mask)
is no proof, and the mask stays as exported."""

from __future__ import annotations

import numpy as np

from ..executor import call_kernel
from ..graph import Graph, Node, Tensor
from ..ops import INPUT, WEIGHT

# elements past this many are not proved (the mask stays as exported): a decode step's
# mask has a few hundred, a priced prompt's some thousands
_MAX_ELEMENTS = 1 << 16


class _NoProof(Exception):
    """The bias is not computed in a way this module evaluates."""


def key_mask(g: Graph, bias: Tensor) -> Tensor | None:
    """The [B, T] integer or bool input of ``g`` whose zeros, with the causal mask, make
    ``bias`` [B|1, H|1, S, T] (``where(visible, 0, -inf)`` of constants), proved for
    every element at ``g``'s sizes; None where it is not so proved."""
    import z3

    where = g.nodes[bias.node]
    shape = bias.shape
    if where.op != "where" or len(shape) != 4 or np.prod(shape) > _MAX_ELEMENTS:
        return None
    cone = _Cone(g, z3)
    try:
        cond = cone.value(where.inputs[0])
        branches = [cone.value(t) for t in where.inputs[1:]]
    except _NoProof:
        return None
    mask = cone.mask
    if mask is None or not isinstance(cond, _Symbolic) or any(isinstance(b, _Symbolic) for b in branches):
        return None
    batch, _, seq, total = shape
    if mask.shape != (batch, total):
        return None
    past = total - seq
    cond = np.broadcast_to(cond.terms, shape)
    open_, closed = (np.broadcast_to(b, shape) for b in branches)
    cells = cone.symbols
    claims = []
    for b, h, q, k in np.ndindex(*shape):
        seen = z3.And(k <= past + q, cells[b, k] != 0)
        if open_[b, h, q, k] == 0 and closed[b, h, q, k] == -np.inf:
            claims.append(cond[b, h, q, k] == seen)
        elif open_[b, h, q, k] == -np.inf and closed[b, h, q, k] == 0:
            claims.append(cond[b, h, q, k] == z3.Not(seen))
        else:
            return None
    solver = z3.Solver()
    solver.add(z3.Not(z3.And(claims)))
    return mask if solver.check() == z3.unsat else None


class _Symbolic:
    """A tensor that depends on the mask's values: an object array of Z3 terms."""

    def __init__(self, terms: np.ndarray):
        self.terms = terms


class _Cone:
    """The values of the tensors ``bias`` is computed from: numpy arrays where they
    depend on no input's values, ``_Symbolic`` where on the one mask's."""

    def __init__(self, g: Graph, z3):
        self.g, self.z3 = g, z3
        self.mask: Tensor | None = None
        self.symbols: np.ndarray | None = None
        self.memo: dict = {}

    def value(self, t: Tensor):
        key = (t.node, t.index)
        if key not in self.memo:
            self.memo[key] = self._compute(self.g.nodes[t.node], t)
        return self.memo[key]

    def _compute(self, n: Node, t: Tensor):
        if n.op == INPUT.name:
            return self._mask(t)
        if n.op == WEIGHT.name:
            return np.asarray(self.g.weight_array(n))
        if n.op == "opaque" and n.params["op_type"] == "Shape":  # sizes alone: not the values
            start, end = (_attrs(n).get(a) for a in ("start", "end"))
            return np.array(n.inputs[0].shape[start:end], np.int64)
        args = [self.value(u) for u in n.inputs]
        if not any(isinstance(a, _Symbolic) for a in args):
            return call_kernel(np, n, args)[t.index]
        return _Symbolic(self._symbolic(n, t, args))

    def _mask(self, t: Tensor):
        if self.mask is not None and self.mask != t:
            raise _NoProof("a second input read by value")
        if len(t.shape) != 2 or not (t.dtype.startswith("int") or t.dtype == "bool"):
            raise _NoProof("the input read is not a [B, T] integer mask")
        z3 = self.z3
        cells = np.empty(t.shape, dtype=object)
        for b, k in np.ndindex(*t.shape):
            cell = z3.Int(f"mask_{b}_{k}")
            cells[b, k] = cell if t.dtype != "bool" else cell != 0
        self.mask, self.symbols = t, cells
        return _Symbolic(cells if t.dtype != "bool" else cells)

    def _symbolic(self, n: Node, t: Tensor, args) -> np.ndarray:
        """``n``'s output ``t`` as Z3 terms, its inputs ``args`` (arrays or _Symbolic)."""
        z3 = self.z3
        terms = [a.terms if isinstance(a, _Symbolic) else _constant_terms(z3, a) for a in args]
        out_shape, dtype = t.shape, t.dtype
        op, p = n.op, n.params
        if op == "opaque":
            if p["empty_inputs"] or p["captured"]:
                raise _NoProof(n.label())
            op, p = p["op_type"], _attrs(n)
        elementwise = _ELEMENTWISE.get(op)
        if elementwise is not None:
            return np.vectorize(lambda *xs: elementwise(z3, *xs), otypes=[object])(*terms).reshape(out_shape)
        x = terms[0]
        if op in ("cast", "Cast"):
            return np.vectorize(lambda v: _cast(z3, v, dtype), otypes=[object])(x).reshape(out_shape)
        if op in ("reshape", "Reshape", "Unsqueeze", "Squeeze", "Flatten"):
            return x.reshape(out_shape)
        if op in ("expand", "Expand"):
            return np.broadcast_to(x, out_shape)
        if op in ("transpose", "Transpose"):
            return np.transpose(x, p.get("perm"))
        if op in ("concat", "Concat"):
            return np.concatenate(terms, axis=p["axis"])
        if op == "Gather" and not isinstance(args[1], _Symbolic):
            return np.take(x, np.asarray(args[1]).astype(np.int64), axis=p.get("axis", 0), mode="wrap")
        raise _NoProof(n.label())


def _attrs(n: Node) -> dict:
    import onnx

    out = {}
    for blob in n.params["attrs"]:
        a = onnx.AttributeProto()
        a.ParseFromString(blob)
        out[a.name] = onnx.helper.get_attribute_value(a)
    return out


def _constant_terms(z3, a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == bool:
        make = z3.BoolVal
    elif a.dtype.kind in "iu":
        make = lambda v: z3.IntVal(int(v))  # noqa: E731
    else:
        raise _NoProof("a float beside the mask's values")
    out = np.empty(a.shape, dtype=object)
    for i in np.ndindex(*a.shape):
        out[i] = make(a[i].item())
    return out


def _cast(z3, v, dtype: str):
    if dtype == "bool":
        return v if z3.is_bool(v) else v != 0
    if dtype.startswith("int") or dtype.startswith("uint"):
        return z3.If(v, 1, 0) if z3.is_bool(v) else v
    raise _NoProof(f"a cast of the mask to {dtype}")


def _where(z3, c, a, b):
    return z3.If(c, a, b)


# operators applied element by element (numpy broadcasting), on Z3 terms, by the names
# the graph gives them (its own and onnx's)
_ELEMENTWISE = {
    "logical_and": lambda z3, a, b: z3.And(a, b), "And": lambda z3, a, b: z3.And(a, b),
    "Or": lambda z3, a, b: z3.Or(a, b), "Xor": lambda z3, a, b: z3.Xor(a, b),
    "Not": lambda z3, a: z3.Not(a),
    "equal": lambda z3, a, b: a == b, "Equal": lambda z3, a, b: a == b,
    "Less": lambda z3, a, b: a < b, "LessOrEqual": lambda z3, a, b: a <= b,
    "Greater": lambda z3, a, b: a > b, "GreaterOrEqual": lambda z3, a, b: a >= b,
    "Add": lambda z3, a, b: a + b, "Sub": lambda z3, a, b: a - b, "Mul": lambda z3, a, b: a * b,
    "where": _where, "Where": _where,
}
