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
Z3 term; the few operators masks are made of are evaluated so (``OPS``). Anything
else (another input read by value, an operator not listed, a float beside the mask,
a broadcast the dims do not settle) is no proof, and that mask stays as exported. The
claim is for every size, not for the sizes a model is priced at: a sliding window,
which hides keys only once the cache is longer than it, is proved as one (``k > T - S +
q - width`` too, the width one of the integers the mask is computed with; the kernel's
``local_window_size``), or not at all."""

from __future__ import annotations

import logging

import numpy as np

from .z3_tensors import OPS, Lazy, NoProof, Small, number, terms

log = logging.getLogger("taso_egg.onnx")

MAX_SMALL = 64         # constants of at most this many elements are read as values

# Z3's deterministic budget a check (a wall-clock limit would answer differently under
# load, and the two imports of one model must agree): a mask's proof takes under 7
# million, a broadcast's a few thousand
_Z3_RLIMIT = 40_000_000
_CACHE: dict = {}      # the model's fingerprint -> its proved masks (a model is imported at several sizes)
_MAX_WINDOWS = 4       # window widths tried a mask


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
    key = hash((tuple(n.SerializeToString() for n in graph.node),
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
        except Exception as e:  # noqa: BLE001 - whatever stops the evaluation (NoProof, an index the
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
    """The graph's small constants (initializers and Constant nodes' values) by name."""
    from onnx import numpy_helper

    tensors = [(t.name, t) for t in graph.initializer]
    tensors += [(n.output[0], a.t) for n in graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                for a in n.attribute if a.name == "value"]
    out = {}
    for name, t in tensors:
        if np.prod(t.dims, dtype=np.int64) <= MAX_SMALL:
            try:
                out[name] = numpy_helper.to_array(t)
            except Exception:  # noqa: BLE001 - data held elsewhere, or malformed: not a constant read here
                continue
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
        self.count = 0             # integers made fresh in this proof
        self.answers: dict = {}    # a question's text -> Z3's answer

    # --- the claim --------------------------------------------------------------------

    def prove(self, where) -> tuple[str, int] | None:
        """(the mask input, the window: -1 for none) where proved, else None."""
        z3 = self.z3
        self.mask, self.memo, self.side, self.numbers, self.count = None, {}, [], set(), 0
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
            # the mask is [B, T] for the scores' B and T (a batch of 1 would not follow the rows)
            question = [*self.facts, *self.side, *within,
                        z3.Not(z3.And(claim, mask_shape[0] == batch, mask_shape[1] == total))]
            if self._unsat(question):
                return self.mask, window
        return None

    def _unsat(self, question: list) -> bool:
        """Whether Z3 finds the assertions unsatisfiable; asked once for each distinct
        question (the layers of a decoder ask the same one under other tensor names)."""
        z3 = self.z3
        key = z3.And(question).sexpr()
        if key not in self.answers:
            solver = z3.Solver()
            solver.set("rlimit", _Z3_RLIMIT)
            solver.add(*question)
            self.answers[key] = solver.check() == z3.unsat
        return self.answers[key]

    def fresh(self, hint: str):
        """A new integer, named by its order in this proof (so that equal questions read
        equal)."""
        self.count += 1
        return self.z3.Int(f"{hint}_{self.count}")

    def _cell(self, mask_vi, b, k):
        z3 = self.z3
        cells = self.symbols.setdefault(("cells", mask_vi.name), z3.Function(
            "mask_" + mask_vi.name.replace(".", "_"), z3.IntSort(), z3.IntSort(), z3.IntSort()))
        return cells(b, k)

    # --- dims ---------------------------------------------------------------------------

    def dims(self, name: str) -> tuple:
        vi = self.infos.get(name) or self.inputs.get(name)
        if vi is None or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            raise NoProof(f"no shape for {name}")
        return tuple(self._dim(d) for d in vi.type.tensor_type.shape.dim)

    def _dim(self, d):
        z3 = self.z3
        if d.HasField("dim_value"):
            return z3.IntVal(d.dim_value)
        if not d.dim_param:
            raise NoProof("an unnamed dim")
        return self._expression(d.dim_param)

    def _expression(self, text: str):
        """A dim_param as a Z3 term, made once: a name (at least 0), or an expression of
        names (``a + b``)."""
        import sympy

        if text in self.symbols:
            return self.symbols[text]
        z3 = self.z3
        try:
            expr = sympy.sympify(text.replace(".", "_"), evaluate=True) if any(c in text for c in "+-*") else None
        except (sympy.SympifyError, TypeError, SyntaxError):
            expr = None
        if expr is None or not expr.free_symbols:
            term = z3.Int(text)
            self.facts.append(term >= 0)
        else:
            term = _sympy_to_z3(expr, {s: self._expression(str(s)) for s in expr.free_symbols}, z3)
        self.symbols[text] = term
        return term

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
            return Small(terms(z3, value))
        if name in self.inputs:
            vi = self.inputs[name]
            elem = vi.type.tensor_type.elem_type
            if self.mask not in (None, name) or elem not in (6, 7, 9) or len(self.dims(name)) != 2:
                raise NoProof(f"input {name} read by value")  # int32, int64, bool [B, T] only
            self.mask = name
            return Lazy(self.dims(name), lambda i: (self._cell(vi, *i) if elem != 9
                                                     else self._cell(vi, *i) != 0))
        node = self.made.get(name)
        if node is None or node.domain not in ("", "ai.onnx"):
            raise NoProof(f"{name} is made by no standard operator")
        op = OPS.get(node.op_type)
        if op is None:
            raise NoProof(f"{node.op_type} is not evaluated")
        return op(self, node)

    def shape_of(self, name: str) -> tuple:
        """A tensor's shape: its value's where this module computes it, else inference's."""
        try:
            v = self.value(name)
        except NoProof:
            return self.dims(name)
        return tuple(self.z3.IntVal(d) for d in v.items.shape) if isinstance(v, Small) else v.shape

    def lazy(self, v) -> Lazy:
        if isinstance(v, Lazy):
            return v
        items, z3 = v.items, self.z3

        def at(i):
            out = None
            for pos in reversed(list(np.ndindex(*items.shape))):
                hit = z3.And([a == p for a, p in zip(i, pos)]) if pos else z3.BoolVal(True)
                out = items[pos] if out is None else z3.If(hit, items[pos], out)
            return out
        return Lazy(tuple(z3.IntVal(d) for d in items.shape), at)

    def small(self, name: str) -> np.ndarray:
        """The elements of a small tensor (a target shape, axes), Z3 terms."""
        v = self.value(name)
        if isinstance(v, Small):
            return v.items
        dims = [number(self.z3, d) for d in v.shape]
        if None in dims or int(np.prod(dims)) > MAX_SMALL:
            raise NoProof(f"{name} is not a small tensor")
        items = np.empty(dims, dtype=object)
        for i in np.ndindex(*dims):  # (a shape vector made by broadcasting: read element by element)
            items[i] = self.z3.simplify(v.at(tuple(self.z3.IntVal(a) for a in i)))
        return items

    def equal(self, a, b) -> bool:
        """Whether two dims are equal for every value of the dims."""
        return self._unsat([*self.facts, a != b])


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
    raise NoProof(f"dim expression {expr}")
