"""Which of an ONNX decoder's attention masks are exactly the causal mask and one
integer input's zeros (the model's ``attention_mask``), proved with Z3 for every size
its symbolic dims can take.

An exporter computes the additive mask a decoder's scores get in some twenty
operators: positions from ranges over the shapes, the causal comparison, the padding
read from ``attention_mask`` (by a gather over its flattened rows), their conjunction,
``where(seen, 0, -inf)``. GroupQueryAttention applies the causal part itself; all it
still needs is which keys each row may see, which the [B, T] mask says in four
operators (``ops/attention.py``, ``gqa`` with ``key_mask``). ``key_masks`` proves, for
each such ``where`` of a 0 and a -inf,

    where(...)[b, h, q, k] = 0 if k <= T - S + q and mask[b, k] != 0 else -inf

for every b, h, q, k of its [B|1, 1|H, S, T] shape at every value of the dims (the
model's dim_params as Z3 integers, a dim written as an expression of others, such as
``past + seq``, as that expression; the mask an uninterpreted function). Each tensor
of the mask's computation is a shape of Z3 terms and a function from a Z3 index to a
Z3 term; the few operators masks are made of are evaluated so (``_OPS``). Anything
else (another input read by value, an operator not listed, a float beside the mask,
a broadcast the dims do not settle) is no proof, and that mask stays as exported. The
claim is for every size, not for the sizes a model is priced at: a sliding window,
which hides keys only once the cache is longer than it, is proved as one (``k > T - S +
q - width`` too, the width one of the integers the mask is computed with; the kernel's
``local_window_size``), or not at all."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

log = logging.getLogger("taso_egg.onnx")

_MAX_SMALL = 64        # constants of at most this many elements are read as values
# Z3's deterministic budget a check (a wall-clock limit would answer differently under
# load, and the two imports of one model must agree): a mask's proof takes under 7
# million, a broadcast's a few thousand
_Z3_RLIMIT = 40_000_000
_CACHE: dict = {}      # the model's fingerprint -> its proved masks (a model is imported at several sizes)
_MAX_WINDOWS = 4       # window widths tried a mask


class _NoProof(Exception):
    """The mask is not computed in a way this module evaluates."""


@dataclass
class _Small:
    """A tensor of a known, small shape (shape arithmetic, constants): its elements Z3
    terms in an object array."""
    items: np.ndarray


@dataclass
class _Lazy:
    """A tensor of a shape of Z3 terms: ``at`` gives the element at a Z3 index tuple."""
    shape: tuple
    at: Callable


def key_masks(model) -> dict[str, tuple[str, int]]:
    """ONNX ``Where`` output name -> (the name of the input whose zeros, with the causal
    mask, it is: 0 where a key is seen, -inf elsewhere; the width of the sliding window
    that also hides the keys before ``k > T - S + q - width``, -1 for none), for every
    mask of ``model`` (a ModelProto, its dims symbolic or not) so proved."""
    import z3

    graph = model.graph
    consts = _constants(graph)
    wanted = set(mask_wheres(graph, consts))
    wheres = [n for n in graph.node if n.output and n.output[0] in wanted]
    if not wheres:
        return {}
    key = hash((tuple((n.op_type, tuple(n.input), tuple(n.output), n.SerializeToString()) for n in graph.node),
                tuple((name, a.tobytes()) for name, a in sorted(consts.items())),
                tuple(vi.SerializeToString() for vi in graph.input)))
    if key not in _CACHE:
        _CACHE.clear()  # (one model at a time)
        _CACHE[key] = _proved(model, consts, wheres, z3)
    return dict(_CACHE[key])


def _proved(model, consts, wheres, z3) -> dict[str, tuple[str, int]]:
    proof = _Proof(model, consts, z3)
    proved = {}
    for n in wheres:
        try:
            mask = proof.prove(n)
        except Exception as e:  # noqa: BLE001 - whatever stops the evaluation (_NoProof, an index the
            # model would refuse, Z3 giving up) leaves the export's mask, which is always right
            log.debug("mask %s: no proof (%s)", n.output[0], e)
            continue
        if mask is not None:
            proved[n.output[0]] = mask
    return proved


def _symbolic_types(model) -> list:
    """Every tensor's type with its dims as expressions of the inputs' (onnxruntime's
    symbolic shape inference, which also equates the dims a model needs equal to run:
    the claim is for every input the model runs on); onnx's inference where it fails."""
    from onnx import shape_inference

    from .validate import without_weight_data

    light = without_weight_data(model)
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        inferred = SymbolicShapeInference.infer_shapes(light, int_max=2**31 - 1, auto_merge=True,
                                                       guess_output_rank=False, verbose=0).graph
    except Exception:  # noqa: BLE001 - its errors carry no common type
        try:
            inferred = shape_inference.infer_shapes(light, data_prop=False).graph
        except Exception:  # noqa: BLE001 - inference is a help: the shapes it gives are read
            inferred = light.graph
    return list(inferred.value_info) + list(inferred.input) + list(inferred.output)


def mask_wheres(graph, consts: dict | None = None) -> list[str]:
    """The outputs of the graph's ``Where`` nodes of a 0 and a -inf: the additive masks
    ``key_masks`` may prove."""
    consts = _constants(graph) if consts is None else consts
    return [n.output[0] for n in graph.node if n.op_type == "Where" and n.domain in ("", "ai.onnx")
            and len(n.input) == 3 and sorted(_mask_values(consts.get(x)) or "" for x in n.input[1:])
            == ["closed", "open"]]


def _constants(graph) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    out = {}
    for t in graph.initializer:
        if np.prod(t.dims, dtype=np.int64) <= _MAX_SMALL:
            try:
                out[t.name] = numpy_helper.to_array(t)
            except Exception:  # noqa: BLE001 - data held elsewhere: not a constant read here
                continue
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value" and np.prod(a.t.dims, dtype=np.int64) <= _MAX_SMALL:
                    out[n.output[0]] = numpy_helper.to_array(a.t)
    return out


def _mask_values(a) -> str | None:
    """"open" where ``a`` is all 0, "closed" where all -inf, else None."""
    if a is None or a.dtype.kind != "f" or a.size == 0:
        return None
    if np.all(a == 0):
        return "open"
    if np.all(a == -np.inf):
        return "closed"
    return None


class _Proof:
    def __init__(self, model, consts, z3):
        self.z3, self.consts = z3, consts
        graph = model.graph
        self.made = {o: n for n in graph.node for o in n.output if o}
        self.inputs = {vi.name: vi for vi in graph.input if vi.name not in consts}
        self.infos = {vi.name: vi for vi in _symbolic_types(model)}
        self.symbols: dict = {}
        self.facts: list = []     # what the dims are known to satisfy (each at least 0)
        self.side: list = []      # what defines the quotients and remainders of reshapes
        self.mask: str | None = None
        self.memo: dict = {}
        self.numbers: set = set()  # the integer constants read: a window's width is one

    # --- the claim --------------------------------------------------------------------

    def prove(self, where) -> tuple[str, int] | None:
        """(the mask input, the window: -1 for none) where proved, else None."""
        z3 = self.z3
        self.mask, self.memo, self.side, self.numbers = None, {}, [], set()
        cond = self.lazy(self.value(where.input[0]))
        polarity = _mask_values(self.consts[where.input[1]]), _mask_values(self.consts[where.input[2]])
        if polarity not in (("open", "closed"), ("closed", "open")) or len(cond.shape) != 4 or self.mask is None:
            return None
        mask = self.inputs[self.mask]
        mask_shape = self.dims(self.mask)
        batch, _, seq, total = cond.shape
        idx = z3.Ints("b h q k")
        within = [z3.And(0 <= i, i < d) for i, d in zip(idx, cond.shape)]
        b, _, q, k = idx
        found = cond.at(tuple(idx))
        # no window, else a window of one of the numbers the mask is computed with
        for window in [-1] + sorted(w for w in self.numbers if w > 0)[:_MAX_WINDOWS]:
            seen = z3.And(k <= total - seq + q, self._cell(mask, b, k) != 0)
            if window > 0:  # the keys within the window: k > its own position - window
                seen = z3.And(seen, k > total - seq + q - window)
            claim = found == (seen if polarity[0] == "open" else z3.Not(seen))
            solver = z3.Solver()
            solver.set("rlimit", _Z3_RLIMIT)
            solver.add(*self.facts, *self.side, *within)
            # the mask is [B, T] for the scores' B and T (a batch of 1 would not follow the rows)
            solver.add(z3.Not(z3.And(claim, mask_shape[0] == batch, mask_shape[1] == total)))
            if solver.check() == z3.unsat:
                return self.mask, window
        return None

    def _cell(self, mask_vi, b, k):
        z3 = self.z3
        cells = self.symbols.setdefault(("cells", mask_vi.name), z3.Function(
            "mask_" + mask_vi.name.replace(".", "_"), z3.IntSort(), z3.IntSort(), z3.IntSort()))
        return cells(b, k)

    # --- dims ---------------------------------------------------------------------------

    def dims(self, name: str) -> tuple:
        vi = self.infos.get(name) or self.inputs.get(name)
        if vi is None or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            raise _NoProof(f"no shape for {name}")
        return tuple(self._dim(d) for d in vi.type.tensor_type.shape.dim)

    def _dim(self, d):
        z3 = self.z3
        if d.HasField("dim_value"):
            return z3.IntVal(d.dim_value)
        if not d.dim_param:
            raise _NoProof("an unnamed dim")
        if d.dim_param not in self.symbols:
            self.symbols[d.dim_param] = self._expression(d.dim_param)
        return self.symbols[d.dim_param]

    def _expression(self, text: str):
        """A dim_param as a Z3 term: a name, or an expression of names (``a + b``)."""
        import sympy

        z3 = self.z3
        try:
            expr = sympy.sympify(text.replace(".", "_"), evaluate=True) if any(c in text for c in "+-*") else None
        except (sympy.SympifyError, TypeError, SyntaxError):
            expr = None
        if expr is None or not expr.free_symbols:
            sym = z3.Int(text)
            self.facts.append(sym >= 0)
            return sym
        names = {s: self._expression(str(s)) for s in expr.free_symbols}
        return _sympy_to_z3(expr, names, z3)

    # --- values ---------------------------------------------------------------------------

    def value(self, name: str):
        if name not in self.memo:
            self.memo[name] = self._compute(name)
        return self.memo[name]

    def _compute(self, name: str):
        z3 = self.z3
        if name in self.consts:
            value = self.consts[name]
            if value.size == 1 and value.dtype.kind in "iu":
                self.numbers.add(int(value.reshape(-1)[0]))
            return _Small(_terms(z3, value))
        if name in self.inputs:
            vi = self.inputs[name]
            elem = vi.type.tensor_type.elem_type
            if self.mask not in (None, name) or elem not in (6, 7, 9) or len(self.dims(name)) != 2:
                raise _NoProof(f"input {name} read by value")  # int32, int64, bool [B, T] only
            self.mask = name
            return _Lazy(self.dims(name), lambda i: (self._cell(vi, *i) if elem != 9
                                                     else self._cell(vi, *i) != 0))
        node = self.made.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            raise _NoProof(f"{name} is made by no standard operator")
        op = _OPS.get(node.op_type)
        if op is None:
            raise _NoProof(f"{node.op_type} is not evaluated")
        return op(self, node)

    def shape_of(self, name: str) -> tuple:
        """A tensor's shape: its value's where this module computes it, else inference's."""
        try:
            v = self.value(name)
        except _NoProof:
            return self.dims(name)
        return tuple(self.z3.IntVal(d) for d in v.items.shape) if isinstance(v, _Small) else v.shape

    def lazy(self, v) -> _Lazy:
        if isinstance(v, _Lazy):
            return v
        items, z3 = v.items, self.z3

        def at(i):
            out = None
            for pos in reversed(list(np.ndindex(*items.shape))):
                hit = z3.And([a == p for a, p in zip(i, pos)]) if pos else z3.BoolVal(True)
                out = items[pos] if out is None else z3.If(hit, items[pos], out)
            return out
        return _Lazy(tuple(z3.IntVal(d) for d in items.shape), at)

    def small(self, name: str) -> np.ndarray:
        """The elements of a small tensor (a target shape, axes), Z3 terms."""
        v = self.value(name)
        if isinstance(v, _Small):
            return v.items
        dims = [_number(self.z3, d) for d in v.shape]
        if None in dims or int(np.prod(dims)) > _MAX_SMALL:
            raise _NoProof(f"{name} is not a small tensor")
        items = np.empty(dims, dtype=object)
        for i in np.ndindex(*dims):  # (a shape vector made by broadcasting: read element by element)
            items[i] = self.z3.simplify(v.at(tuple(self.z3.IntVal(a) for a in i)))
        return items

    def equal(self, a, b) -> bool:
        """Whether two dims are equal for every value of the dims."""
        z3 = self.z3
        solver = z3.Solver()
        solver.set("rlimit", _Z3_RLIMIT)
        solver.add(*self.facts, a != b)
        return solver.check() == z3.unsat


def _terms(z3, a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == bool:
        make = z3.BoolVal
    elif a.dtype.kind in "iu":
        make = lambda v: z3.IntVal(int(v))  # noqa: E731
    else:
        raise _NoProof("a float beside the mask")
    out = np.empty(a.shape, dtype=object)
    for i in np.ndindex(*a.shape):
        out[i] = make(a[i].item())
    return out


def _sympy_to_z3(expr, names, z3):
    import sympy

    if expr.is_Symbol:
        return names[expr]
    if expr.is_Integer:
        return z3.IntVal(int(expr))
    args = [_sympy_to_z3(a, names, z3) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return z3.Sum(args)
    if isinstance(expr, sympy.Mul):
        return z3.Product(args)
    raise _NoProof(f"dim expression {expr}")


def _number(z3, t) -> int | None:
    t = z3.simplify(t)
    return t.as_long() if z3.is_int_value(t) else None


# --- the operators ---------------------------------------------------------------------

def _broadcast(p: _Proof, shapes: list[tuple]) -> tuple:
    """numpy broadcasting of shapes of Z3 terms: a dim broadcasts where it is the number
    1; two other dims must be equal at every size."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        wide = [d for d in dims if _number(p.z3, d) != 1]
        if not wide:
            out.append(p.z3.IntVal(1))
            continue
        if any(not p.equal(wide[0], d) for d in wide[1:]):
            raise _NoProof("a broadcast the dims do not settle")
        out.append(wide[0])
    return tuple(out)


def _read(p: _Proof, v: _Lazy, idx: tuple):
    """``v``'s element at a (right-aligned, broadcast) index of the output."""
    own = idx[len(idx) - len(v.shape):]
    return v.at(tuple(p.z3.IntVal(0) if _number(p.z3, d) == 1 else i for i, d in zip(own, v.shape)))


def _elementwise(fn):
    def op(p: _Proof, node):
        args = [p.value(x) for x in node.input]
        if all(isinstance(a, _Small) for a in args):
            items = np.vectorize(lambda *xs: p.z3.simplify(fn(p.z3, *xs)), otypes=[object])(*(a.items for a in args))
            return _Small(np.asarray(items, dtype=object))
        lazies = [p.lazy(a) for a in args]
        shape = _broadcast(p, [a.shape for a in lazies])
        return _Lazy(shape, lambda i: fn(p.z3, *(_read(p, a, i) for a in lazies)))
    return op


def _cast(p: _Proof, node):
    to = next(a.i for a in node.attribute if a.name == "to")
    z3 = p.z3
    if to == 9:
        fn = lambda z, v: v if z3.is_bool(v) else v != 0  # noqa: E731
    elif to in (2, 3, 4, 5, 6, 7, 12, 13):
        fn = lambda z, v: z3.If(v, 1, 0) if z3.is_bool(v) else v  # noqa: E731
    else:
        raise _NoProof("a cast of the mask to a float")
    return _elementwise(fn)(p, node)


def _shape(p: _Proof, node):
    attrs = {a.name: a.i for a in node.attribute}
    dims = p.shape_of(node.input[0])[attrs.get("start", 0):attrs.get("end")]
    return _Small(np.array(list(dims) + [None], dtype=object)[:-1])


def _gather(p: _Proof, node):
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    data, idx = p.value(node.input[0]), p.value(node.input[1])
    z3 = p.z3
    if isinstance(data, _Small) and isinstance(idx, _Small):
        numbers = [_number(z3, t) for t in idx.items.ravel()]
        if None not in numbers:
            taken = np.take(data.items, np.array(numbers, dtype=np.int64).reshape(idx.items.shape), axis=axis)
            return _Small(np.asarray(taken, dtype=object))
    data, idx = p.lazy(data), p.lazy(idx)
    rank = len(data.shape)
    axis %= rank
    n = data.shape[axis]
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1:]
    inner = len(idx.shape)

    def at(i):
        j = idx.at(i[axis:axis + inner])
        return data.at(i[:axis] + (z3.If(j < 0, j + n, j),) + i[axis + inner:])
    return _Lazy(shape, at)


def _reshape_to(p: _Proof, x: _Lazy, shape: tuple) -> _Lazy:
    """``x`` read in row-major order as ``shape`` (both of Z3 terms)."""
    z3 = p.z3
    if len(shape) == len(x.shape) and all(p.equal(a, b) for a, b in zip(shape, x.shape)):
        return _Lazy(shape, x.at)
    kept = [d for d in x.shape if _number(z3, d) != 1]
    wanted = [d for d in shape if _number(z3, d) != 1]
    if len(kept) == len(wanted) and all(p.equal(a, b) for a, b in zip(kept, wanted)):
        # unit dims in and out only: the other indices carry over in order
        def at(i):
            carried = iter([a for a, d in zip(i, shape) if _number(z3, d) != 1])
            return x.at(tuple(z3.IntVal(0) if _number(z3, d) == 1 else next(carried) for d in x.shape))
        return _Lazy(shape, at)

    def at(i):
        flat = z3.IntVal(0)
        for a, d in zip(i, shape):
            flat = flat * d + a
        out = []
        for d in reversed(x.shape):  # flat = quotient * d + remainder, 0 <= remainder < d
            quotient, remainder = z3.FreshInt("quotient"), z3.FreshInt("remainder")
            p.side += [flat == quotient * d + remainder, 0 <= remainder, remainder < d]
            out.append(remainder)
            flat = quotient
        return x.at(tuple(reversed(out)))
    return _Lazy(shape, at)


def _reshape(p: _Proof, node):
    x = p.lazy(p.value(node.input[0]))
    target = p.small(node.input[1]).ravel()
    z3 = p.z3
    if any(a.name == "allowzero" and a.i for a in node.attribute):
        raise _NoProof("a reshape that allows zeros")
    shape, unknown = [], None
    for axis, t in enumerate(target):
        n = _number(z3, t)
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


def _axes(p: _Proof, node) -> list[int]:
    if len(node.input) > 1 and node.input[1]:
        return [_number(p.z3, t) for t in p.small(node.input[1]).ravel()]
    return [int(v) for a in node.attribute if a.name == "axes" for v in a.ints]


def _unsqueeze(p: _Proof, node):
    v, axes = p.value(node.input[0]), _axes(p, node)
    if isinstance(v, _Small):
        items = v.items
        for axis in sorted(a % (items.ndim + len(axes)) for a in axes):
            items = np.expand_dims(items, axis)
        return _Small(items)
    x = p.lazy(v)
    rank = len(x.shape) + len(axes)
    axes = sorted(a % rank for a in axes)
    shape, rest = [], iter(x.shape)
    for axis in range(rank):
        shape.append(p.z3.IntVal(1) if axis in axes else next(rest))
    return _reshape_to(p, x, tuple(shape))


def _squeeze(p: _Proof, node):
    x = p.lazy(p.value(node.input[0]))
    axes = [a % len(x.shape) for a in _axes(p, node)] or \
        [i for i, d in enumerate(x.shape) if _number(p.z3, d) == 1]
    return _reshape_to(p, x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def _flatten(p: _Proof, node):
    x = p.lazy(p.value(node.input[0]))
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % (len(x.shape) + 1)
    size = lambda dims: p.z3.Product(list(dims)) if dims else p.z3.IntVal(1)  # noqa: E731
    return _reshape_to(p, x, (size(x.shape[:axis]), size(x.shape[axis:])))


def _range(p: _Proof, node):
    start, limit, delta = (p.small(x).ravel()[0] for x in node.input)
    if _number(p.z3, delta) != 1:
        raise _NoProof("a range of step other than 1")
    length = p.z3.If(limit > start, limit - start, 0)
    return _Lazy((length,), lambda i: start + i[0])


def _expand(p: _Proof, node):
    x = p.lazy(p.value(node.input[0]))
    target = tuple(p.small(node.input[1]).ravel())
    shape = _broadcast(p, [x.shape, target])
    return _Lazy(shape, lambda i: _read(p, x, i))


def _concat(p: _Proof, node):
    axis = next(a.i for a in node.attribute if a.name == "axis")
    parts = [p.value(x) for x in node.input]
    if all(isinstance(a, _Small) for a in parts):
        return _Small(np.concatenate([a.items for a in parts], axis=axis))
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
    return _Lazy(shape, at)


def _transpose(p: _Proof, node):
    x = p.lazy(p.value(node.input[0]))
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), list(range(len(x.shape)))[::-1])
    shape = tuple(x.shape[a] for a in perm)

    def at(i):
        back = [None] * len(perm)
        for out_axis, in_axis in enumerate(perm):
            back[in_axis] = i[out_axis]
        return x.at(tuple(back))
    return _Lazy(shape, at)


def _slice(p: _Proof, node):
    z3 = p.z3
    x = p.lazy(p.value(node.input[0]))
    starts, ends = (p.small(v).ravel() for v in node.input[1:3])
    rank = len(x.shape)
    axes = ([_number(z3, a) % rank for a in p.small(node.input[3]).ravel()] if len(node.input) > 3 and node.input[3]
            else list(range(len(starts))))
    if len(node.input) > 4 and node.input[4] and any(_number(z3, t) != 1 for t in p.small(node.input[4]).ravel()):
        raise _NoProof("a slice of step other than 1")
    shape, offsets = list(x.shape), [z3.IntVal(0)] * rank

    def bound(v, d):  # onnx's: from the end where negative, then clamped to [0, d]
        v = z3.If(v < 0, v + d, v)
        return z3.If(v < 0, 0, z3.If(v > d, d, v))
    for axis, start, end in zip(axes, starts, ends):
        d = x.shape[axis]
        first, last = bound(start, d), bound(end, d)
        shape[axis], offsets[axis] = z3.If(last > first, last - first, 0), first
    return _Lazy(tuple(shape), lambda i: x.at(tuple(a + o for a, o in zip(i, offsets))))


def _constant_of_shape(p: _Proof, node):
    from onnx import numpy_helper

    value = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"), np.zeros(1, np.float32))
    fill = _terms(p.z3, value.reshape(-1)[:1])[0]
    return _Lazy(tuple(p.small(node.input[0]).ravel()), lambda i: fill)


def _identity(p: _Proof, node):
    return p.value(node.input[0])


_OPS = {
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
