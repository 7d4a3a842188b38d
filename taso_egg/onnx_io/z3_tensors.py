"""ONNX operators evaluated on tensors of symbolic shape, element by element, as Z3
terms: what ``key_masks`` proves a mask with.

A tensor is ``Small`` (a shape known as numbers, its elements Z3 terms: shape
arithmetic, constants) or ``Lazy`` (a shape of Z3 terms, and a function from a Z3 index
tuple to the element there). Each operator of ``OPS`` takes the evaluator (``value``,
``lazy``, ``small``, ``shape_of`` of a tensor name, ``equal`` of two dims, its Z3 module
``z3``, ``fresh`` integers and ``side``, the definitions of the quotients and
remainders a reshape's flattening introduces) and the ONNX node; ``NoProof`` where a node is not one these
evaluate (another op, a float, a broadcast the dims do not settle)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


class NoProof(Exception):
    """A node these operators do not evaluate."""


@dataclass
class Small:
    """A tensor of a known, small shape (shape arithmetic, constants): its elements Z3
    terms in an object array."""
    items: np.ndarray


@dataclass
class Lazy:
    """A tensor of a shape of Z3 terms: ``at`` gives the element at a Z3 index tuple."""
    shape: tuple
    at: Callable


def terms(z3, a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == bool:
        make = z3.BoolVal
    elif a.dtype.kind in "iu":
        make = lambda v: z3.IntVal(int(v))  # noqa: E731
    else:
        raise NoProof("a float beside the mask")
    out = np.empty(a.shape, dtype=object)
    for i in np.ndindex(*a.shape):
        out[i] = make(a[i].item())
    return out


def number(z3, t) -> int | None:
    t = z3.simplify(t)
    return t.as_long() if z3.is_int_value(t) else None


# --- the operators ---------------------------------------------------------------------

def _broadcast(p, shapes: list[tuple]) -> tuple:
    """numpy broadcasting of shapes of Z3 terms: a dim broadcasts where it is the number
    1; two other dims must be equal at every size."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        wide = [d for d in dims if number(p.z3, d) != 1]
        if not wide:
            out.append(p.z3.IntVal(1))
            continue
        if any(not p.equal(wide[0], d) for d in wide[1:]):
            raise NoProof("a broadcast the dims do not settle")
        out.append(wide[0])
    return tuple(out)


def _read(p, v: Lazy, idx: tuple):
    """``v``'s element at a (right-aligned, broadcast) index of the output."""
    own = idx[len(idx) - len(v.shape):]
    return v.at(tuple(p.z3.IntVal(0) if number(p.z3, d) == 1 else i for i, d in zip(own, v.shape)))


def _elementwise(fn):
    def op(p, node):
        args = [p.value(x) for x in node.input]
        if all(isinstance(a, Small) for a in args):
            items = np.vectorize(lambda *xs: p.z3.simplify(fn(p.z3, *xs)), otypes=[object])(*(a.items for a in args))
            return Small(np.asarray(items, dtype=object))
        lazies = [p.lazy(a) for a in args]
        shape = _broadcast(p, [a.shape for a in lazies])
        return Lazy(shape, lambda i: fn(p.z3, *(_read(p, a, i) for a in lazies)))
    return op


def _cast(p, node):
    to = next(a.i for a in node.attribute if a.name == "to")
    if to == 9:
        fn = lambda z, v: v if z.is_bool(v) else v != 0  # noqa: E731
    elif to in (2, 3, 4, 5, 6, 7, 12, 13):
        fn = lambda z, v: z.If(v, 1, 0) if z.is_bool(v) else v  # noqa: E731
    else:
        raise NoProof("a cast of the mask to a float")
    return _elementwise(fn)(p, node)


def _shape(p, node):
    attrs = {a.name: a.i for a in node.attribute}
    dims = p.shape_of(node.input[0])[attrs.get("start", 0):attrs.get("end")]
    return Small(np.array(list(dims) + [None], dtype=object)[:-1])


def _gather(p, node):
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    data, idx = p.value(node.input[0]), p.value(node.input[1])
    z3 = p.z3
    if isinstance(data, Small) and isinstance(idx, Small):
        numbers = [number(z3, t) for t in idx.items.ravel()]
        if None not in numbers:
            taken = np.take(data.items, np.array(numbers, dtype=np.int64).reshape(idx.items.shape), axis=axis)
            return Small(np.asarray(taken, dtype=object))
    data, idx = p.lazy(data), p.lazy(idx)
    rank = len(data.shape)
    axis %= rank
    n = data.shape[axis]
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1:]
    inner = len(idx.shape)

    def at(i):
        j = idx.at(i[axis:axis + inner])
        return data.at(i[:axis] + (z3.If(j < 0, j + n, j),) + i[axis + inner:])
    return Lazy(shape, at)


def _reshape_to(p, x: Lazy, shape: tuple) -> Lazy:
    """``x`` read in row-major order as ``shape`` (both of Z3 terms)."""
    z3 = p.z3
    if len(shape) == len(x.shape) and all(p.equal(a, b) for a, b in zip(shape, x.shape)):
        return Lazy(shape, x.at)
    kept = [d for d in x.shape if number(z3, d) != 1]
    wanted = [d for d in shape if number(z3, d) != 1]
    if len(kept) == len(wanted) and all(p.equal(a, b) for a, b in zip(kept, wanted)):
        # unit dims in and out only: the other indices carry over in order
        def at(i):
            carried = iter([a for a, d in zip(i, shape) if number(z3, d) != 1])
            return x.at(tuple(z3.IntVal(0) if number(z3, d) == 1 else next(carried) for d in x.shape))
        return Lazy(shape, at)

    def at(i):
        flat = z3.IntVal(0)
        for a, d in zip(i, shape):
            flat = flat * d + a
        out = []
        for d in reversed(x.shape):  # flat = quotient * d + remainder, 0 <= remainder < d
            quotient, remainder = p.fresh("quotient"), p.fresh("remainder")
            p.side += [flat == quotient * d + remainder, 0 <= remainder, remainder < d]
            out.append(remainder)
            flat = quotient
        return x.at(tuple(reversed(out)))
    return Lazy(shape, at)


def _reshape(p, node):
    x = p.lazy(p.value(node.input[0]))
    target = p.small(node.input[1]).ravel()
    z3 = p.z3
    if any(a.name == "allowzero" and a.i for a in node.attribute):
        raise NoProof("a reshape that allows zeros")
    shape, unknown = [], None
    for axis, t in enumerate(target):
        n = number(z3, t)
        if n == 0:
            shape.append(x.shape[axis])
        elif n == -1:
            unknown = axis
            shape.append(None)
        else:
            shape.append(t)
    if unknown is not None:
        rest = z3.Product([d for d in shape if d is not None]) if len(shape) > 1 else z3.IntVal(1)
        shape[unknown] = z3.Product(list(x.shape)) / rest if x.shape else z3.IntVal(1)
    return _reshape_to(p, x, tuple(shape))


def _axes(p, node) -> list[int]:
    if len(node.input) > 1 and node.input[1]:
        return [number(p.z3, t) for t in p.small(node.input[1]).ravel()]
    return [int(v) for a in node.attribute if a.name == "axes" for v in a.ints]


def _unsqueeze(p, node):
    v, axes = p.value(node.input[0]), _axes(p, node)
    if isinstance(v, Small):
        items = v.items
        for axis in sorted(a % (items.ndim + len(axes)) for a in axes):
            items = np.expand_dims(items, axis)
        return Small(items)
    x = p.lazy(v)
    rank = len(x.shape) + len(axes)
    axes = sorted(a % rank for a in axes)
    shape, rest = [], iter(x.shape)
    for axis in range(rank):
        shape.append(p.z3.IntVal(1) if axis in axes else next(rest))
    return _reshape_to(p, x, tuple(shape))


def _squeeze(p, node):
    x = p.lazy(p.value(node.input[0]))
    axes = [a % len(x.shape) for a in _axes(p, node)] or \
        [i for i, d in enumerate(x.shape) if number(p.z3, d) == 1]
    return _reshape_to(p, x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _flatten(p, node):
    x = p.lazy(p.value(node.input[0]))
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % (len(x.shape) + 1)
    size = lambda dims: p.z3.Product(list(dims)) if dims else p.z3.IntVal(1)  # noqa: E731
    return _reshape_to(p, x, (size(x.shape[:axis]), size(x.shape[axis:])))


def _range(p, node):
    start, limit, delta = (p.small(x).ravel()[0] for x in node.input)
    if number(p.z3, delta) != 1:
        raise NoProof("a range of step other than 1")
    length = p.z3.If(limit > start, limit - start, 0)
    return Lazy((length,), lambda i: start + i[0])


def _expand(p, node):
    x = p.lazy(p.value(node.input[0]))
    target = tuple(p.small(node.input[1]).ravel())
    shape = _broadcast(p, [x.shape, target])
    return Lazy(shape, lambda i: _read(p, x, i))


def _concat(p, node):
    axis = next(a.i for a in node.attribute if a.name == "axis")
    parts = [p.value(x) for x in node.input]
    if all(isinstance(a, Small) for a in parts):
        return Small(np.concatenate([a.items for a in parts], axis=axis))
    z3 = p.z3
    parts = [p.lazy(a) for a in parts]
    axis %= len(parts[0].shape)
    sizes = [a.shape[axis] for a in parts]
    shape = parts[0].shape[:axis] + (z3.Sum(sizes),) + parts[0].shape[axis + 1:]

    def at(i):
        out, offset = None, z3.IntVal(0)
        cases = []
        for a, size in zip(parts, sizes):
            cases.append((i[axis] < offset + size, a.at(i[:axis] + (i[axis] - offset,) + i[axis + 1:])))
            offset = offset + size
        for cond, value in reversed(cases):
            out = value if out is None else z3.If(cond, value, out)
        return out
    return Lazy(shape, at)


def _transpose(p, node):
    x = p.lazy(p.value(node.input[0]))
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), list(range(len(x.shape)))[::-1])
    shape = tuple(x.shape[a] for a in perm)

    def at(i):
        back = [None] * len(perm)
        for out_axis, in_axis in enumerate(perm):
            back[in_axis] = i[out_axis]
        return x.at(tuple(back))
    return Lazy(shape, at)


def _slice(p, node):
    z3 = p.z3
    x = p.lazy(p.value(node.input[0]))
    starts, ends = (p.small(v).ravel() for v in node.input[1:3])
    rank = len(x.shape)
    axes = ([number(z3, a) % rank for a in p.small(node.input[3]).ravel()] if len(node.input) > 3 and node.input[3]
            else list(range(len(starts))))
    if len(node.input) > 4 and node.input[4] and any(number(z3, t) != 1 for t in p.small(node.input[4]).ravel()):
        raise NoProof("a slice of step other than 1")
    shape, offsets = list(x.shape), [z3.IntVal(0)] * rank

    def bound(v, d):  # onnx's: from the end where negative, then clamped to [0, d]
        v = z3.If(v < 0, v + d, v)
        return z3.If(v < 0, 0, z3.If(v > d, d, v))
    for axis, start, end in zip(axes, starts, ends):
        d = x.shape[axis]
        first, last = bound(start, d), bound(end, d)
        shape[axis], offsets[axis] = z3.If(last > first, last - first, 0), first
    return Lazy(tuple(shape), lambda i: x.at(tuple(a + o for a, o in zip(i, offsets))))


def _constant_of_shape(p, node):
    from onnx import numpy_helper

    value = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), np.zeros(1, np.float32))
    fill = terms(p.z3, value.reshape(-1)[:1])[0]
    return Lazy(tuple(p.small(node.input[0]).ravel()), lambda i: fill)


def _identity(p, node):
    return p.value(node.input[0])


OPS = {
    "Shape": _shape, "Gather": _gather, "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Range": _range, "Expand": _expand, "Concat": _concat, "Transpose": _transpose, "Identity": _identity,
    "Slice": _slice, "ConstantOfShape": _constant_of_shape, "Flatten": _flatten,
    "Cast": _cast,
    "Add": _elementwise(lambda z3, a, b: a + b), "Sub": _elementwise(lambda z3, a, b: a - b),
    "Mul": _elementwise(lambda z3, a, b: a * b),
    "Equal": _elementwise(lambda z3, a, b: a == b), "Less": _elementwise(lambda z3, a, b: a < b),
    "LessOrEqual": _elementwise(lambda z3, a, b: a <= b), "Greater": _elementwise(lambda z3, a, b: a > b),
    "GreaterOrEqual": _elementwise(lambda z3, a, b: a >= b),
    "And": _elementwise(lambda z3, a, b: z3.And(a, b)), "Or": _elementwise(lambda z3, a, b: z3.Or(a, b)),
    "Xor": _elementwise(lambda z3, a, b: z3.Xor(a, b)), "Not": _elementwise(lambda z3, a: z3.Not(a)),
    "Where": _elementwise(lambda z3, c, a, b: z3.If(c, a, b)),
}
