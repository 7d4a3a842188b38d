"""Symbolic dimensions: the sizes a model is optimized at, and writing it back with
its symbolic dims.

A model whose inputs have symbolic dims (a dynamic batch, a sequence length) is
imported at representative sizes: one size per dim_param name, shared by every input
that names it; given by ``--input-shape``, else ``DEFAULT_LEADING`` for a dim that
leads an input (a batch) and ``DEFAULT_OTHER`` for the rest (a sequence length).
Everything is priced, saturated and timed there. Where a default leaves some tensor
empty (a conv stack over 64 audio samples has no frames), the defaulted sizes that do
not lead an input double until none is (``grown_sizes``).

A candidate to write is exported twice: at those sizes and at ``second_sizes`` (each
symbol moved to a prime that divides none of the first sizes, so that the ratios of
the two sizes are multiplicatively independent). Node for node the two exports agree
but for the integer constants that encode a symbolic size (Reshape targets, Expand
shapes, Slice ends, ...); each element of those is solved for the one monomial
``c * s1^e1 * s2^e2 ...`` that gives both values (unique under that independence)
and written as arithmetic on the model's own ``Shape`` of an input. The inputs and
outputs are the original's value infos: names, order, dtypes and dim_params. What
cannot be written so (a float constant that depends on a size, a size that is not a
monomial of the symbols, such as ``seq - 1``) raises ``NotSymbolic`` naming it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from ..errors import OnnxImportError, TasoEggError
from ..onnx_io.fed import FedModel, array_of, file_backed, is_stub
from ..onnx_io.validate import checker_complaint, without_weight_data

DEFAULT_LEADING = 1    # a symbolic dim at axis 0 of an input: a batch
DEFAULT_OTHER = 64     # any other symbolic dim: a sequence length, an image side
_MAX_EXPONENT = 2      # sizes up to the square of a symbol (attention's seq x seq)
_MAX_GROWN = 1 << 14   # a default grows up to this (a second of 16 kHz audio)


class NotSymbolic(TasoEggError):
    """A candidate that cannot be written with the input's symbolic dims."""


@dataclass(frozen=True)
class Interface:
    """The model's graph inputs (initializers aside) and outputs as value infos, and
    for each input its dims: an int where fixed, the symbol's name where symbolic (a
    dim with no dim_param gets a name of its own, ``?input:axis``)."""

    inputs: tuple            # ValueInfoProto, in the model's order
    outputs: tuple
    dims: dict[str, tuple]   # input name -> (int | str, ...)

    @property
    def symbols(self) -> list[str]:
        seen: dict[str, None] = {}
        for dims in self.dims.values():
            seen.update((d, None) for d in dims if isinstance(d, str))
        return list(seen)

    @property
    def symbolic(self) -> bool:
        return bool(self.symbols)

    def source(self, symbol: str) -> tuple[str, int]:
        """The first input axis that has ``symbol``: where the written model reads it."""
        return next((name, axis) for name, dims in self.dims.items()
                    for axis, d in enumerate(dims) if d == symbol)

    def shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Every input's shape with each symbol at ``sizes``."""
        return {name: tuple(sizes[d] if isinstance(d, str) else d for d in dims)
                for name, dims in self.dims.items()}


def interface(proto) -> Interface:
    initializers = {t.name for t in proto.graph.initializer}
    inputs = tuple(vi for vi in proto.graph.input if vi.name not in initializers)
    dims = {}
    for vi in inputs:
        shape = vi.type.tensor_type.shape if vi.type.HasField("tensor_type") else None
        dims[vi.name] = tuple(
            # a fixed size, even 0 (the importer refuses an empty tensor in one line)
            d.dim_value if d.HasField("dim_value") else (d.dim_param or f"?{vi.name}:{axis}")
            for axis, d in enumerate(shape.dim if shape is not None else ()))
    return Interface(inputs, tuple(proto.graph.output), dims)


def leading_symbols(iface: Interface) -> set[str]:
    """The symbols at axis 0 of an input: batches, which keep their default of 1."""
    return {dims[0] for dims in iface.dims.values() if dims and isinstance(dims[0], str)}


def representative_sizes(iface: Interface, given: Mapping[str, Sequence[int]],
                         relations: Mapping | None = None, one: Sequence[str] = ()) -> dict[str, int]:
    """One size per symbol: as ``given`` (input name -> shape, --input-shape) sets it,
    else the defaults (1 for the dims in ``one``), with each dim the graph ties to others
    (``relations``, from ``dim_relations``) computed from them. One line (OnnxImportError) when two given
    shapes set one symbol to different sizes, or the sizes given contradict a relation;
    a given shape of the wrong rank is left for the importer."""
    relations = dict(relations or {})
    sizes: dict[str, int] = {}
    setter: dict[str, str] = {}
    for name, shape in given.items():
        dims = iface.dims.get(name)
        if dims is None or len(dims) != len(shape):
            continue
        for d, size in zip(dims, shape):
            if not isinstance(d, str):
                continue
            if d in sizes and sizes[d] != int(size):
                raise OnnxImportError(f"inputs {setter[d]!r} and {name!r} share the symbolic "
                                      f"dimension {d!r}, but the shapes given (--input-shape) set it "
                                      f"to {sizes[d]} and {int(size)}")
            sizes[d], setter[d] = int(size), name
    for d, rel in relations.items():  # a tied dim given, one dim it reads not: solved for that one
        unset = [(s, k) for s, k in rel.terms if s not in sizes]
        if d in sizes and len(unset) == 1 and abs(unset[0][1]) == 1:
            s, k = unset[0]
            sizes[s] = (sizes[d] - rel.value({**sizes, s: 0})) * k
    leading = leading_symbols(iface)
    for s in iface.symbols:
        if s not in relations:
            sizes.setdefault(s, 1 if s in one else DEFAULT_LEADING if s in leading else DEFAULT_OTHER)
    return tied_sizes(sizes, relations, setter)


def tied_sizes(sizes: Mapping[str, int], relations: Mapping, setter: Mapping[str, str] = {}) -> dict[str, int]:
    """``sizes`` with every tied dim computed from the dims it reads; one line
    (OnnxImportError) where that contradicts a size given, or is negative."""
    out = dict(sizes)
    for d, rel in relations.items():
        value = rel.value(out)
        if d in setter and out[d] != value:
            raise OnnxImportError(f"the graph ties the symbolic dimension {d!r} to {rel} "
                                  f"({describe_sizes({s: out[s] for s, _ in rel.terms}) or 'constant'}: {value}), "
                                  f"but the shapes given (--input-shape) set it to {out[d]}")
        if value < 0:
            raise OnnxImportError(f"the graph ties the symbolic dimension {d!r} to {rel}, which is {value} at "
                                  f"{describe_sizes(out)}; set the dims it reads with --input-shape")
        out[d] = value
    return out


def input_types(iface: Interface, sizes: Mapping[str, int]):
    """``(name, shape, dtype)`` of every tensor input with each symbol at ``sizes``."""
    from onnx import helper

    shapes = iface.shapes(sizes)
    return [(vi.name, shapes[vi.name], helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
            for vi in iface.inputs if vi.type.HasField("tensor_type")]


def check_feeds_fit(iface: Interface, sizes: Mapping[str, int]) -> None:
    """One line (``executor.check_feed_fits``) when an input's random values at ``sizes``
    cannot be made: checked before anything is sized from them (second sizes, imports)."""
    from ..executor import check_feed_fits

    for name, shape, dtype in input_types(iface, sizes):
        check_feed_fits(name, shape, dtype)


def grown_sizes(iface: Interface, sizes: Mapping[str, int],
                given: Mapping[str, Sequence[int]], relations: Mapping | None = None) -> dict[str, int] | None:
    """``sizes`` with every symbol that no given shape sets, that leads no input and
    that the graph ties to no other doubled (the tied ones follow); None when there is
    none, or past ``_MAX_GROWN``."""
    relations = dict(relations or {})
    set_by_given = {d for name, shape in given.items() for d in iface.dims.get(name, ())
                    if isinstance(d, str)}
    leading = leading_symbols(iface)
    free = [s for s in iface.symbols if s not in set_by_given and s not in leading and s not in relations]
    if not free or any(sizes[s] * 2 > _MAX_GROWN for s in free):
        return None
    return tied_sizes({s: v * 2 if s in free else v for s, v in sizes.items()}, relations)


def import_shapes(iface: Interface, sizes: Mapping[str, int],
                  given: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """The shapes to import at: ``given`` as given (the importer checks them against the
    model), every other input with its symbols at ``sizes``."""
    symbolic = {name for name, dims in iface.dims.items() if any(isinstance(d, str) for d in dims)}
    shapes = {name: shape for name, shape in iface.shapes(sizes).items() if name in symbolic and name not in given}
    shapes.update({name: tuple(shape) for name, shape in given.items()})
    return shapes


def second_sizes(sizes: Mapping[str, int], relations: Mapping | None = None) -> dict[str, int]:
    """For each symbol the smallest prime above its size that divides no nonzero size
    and is no other symbol's, each tied dim computed from those (``relations``): the
    sizes the candidates are also written and checked at."""
    relations = dict(relations or {})
    taken: set[int] = set()
    out = {}
    for s, size in sizes.items():
        if s in relations:
            continue
        p = size + 1
        while not _is_prime(p) or p in taken or any(v and v % p == 0 for v in sizes.values()):
            p += 1
        taken.add(p)
        out[s] = p
    return tied_sizes(out, relations)


def writable_sizes(here: Mapping[str, int], there: Mapping[str, int]):
    """Whether an integer vector of sizes, ``v`` at the ``here`` sizes and ``w`` at
    ``there``, is one ``symbolize`` writes: each element a monomial of the symbols."""
    r = [here[s] for s in here]
    a = [there[s] for s in here]

    def writable(v: np.ndarray, w: np.ndarray) -> bool:
        return v.shape == w.shape and all(_monomial(x, y, r, a) is not None
                                          for x, y in zip(v.ravel().tolist(), w.ravel().tolist()))
    return writable


def describe_sizes(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{s}={v}" for s, v in sizes.items())


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % k for k in range(2, math.isqrt(n) + 1))


# --- writing a candidate with symbolic dims ---------------------------------------------

def symbolize(at_first, at_second, original, first: Mapping[str, int], second: Mapping[str, int]):
    """The candidate exported at ``first`` sizes (``at_first``) and at ``second`` sizes
    (``at_second``, node for node the same; ModelProtos or ``fed.FedModel``s) as one
    model with ``original``'s interface: a new FedModel (its large weights
    ``at_first``'s arrays); NotSymbolic naming what cannot be written so."""
    import onnx

    iface = interface(original)
    g1, g2 = at_first.graph, at_second.graph
    _same_structure(g1, g2)
    symbols = iface.symbols
    r = [first[s] for s in symbols]
    a = [second[s] for s in symbols]
    others = {t.name: t for t in g2.initializer}
    targets_only = _reshape_targets_only(g1)
    kept, sized = [], {}
    for t in g1.initializer:
        v1, v2 = array_of(at_first, t), array_of(at_second, others[t.name])
        if v1 is v2 or v1.dtype == v2.dtype and v1.shape == v2.shape and np.array_equal(v1, v2):
            kept.append(t)
            continue
        if v1.dtype.kind not in "iu" or v1.shape != v2.shape:
            raise NotSymbolic(f"constant {t.name!r} ({v1.dtype}{list(v1.shape)}) depends on the "
                              f"symbolic sizes and is not an integer vector of sizes")
        terms = [_monomial(x, y, r, a) for x, y in zip(v1.ravel().tolist(), v2.ravel().tolist())]
        if terms.count(None) == 1 and t.name in targets_only and -1 not in v1.ravel().tolist():
            # a reshape's target: the one size that is no product (frames after a conv
            # stack) is what the others leave of the element count, as -1 says
            terms[terms.index(None)] = (-1, (0,) * len(r))
        if None in terms:
            x, y = next((x, y) for x, y, term in zip(v1.ravel().tolist(), v2.ravel().tolist(), terms)
                        if term is None)
            raise NotSymbolic(f"constant {t.name!r} holds {x} at {describe_sizes(first)} and {y} at "
                              f"{describe_sizes(second)}: not a product of the symbolic sizes")
        sized[t.name] = (v1, terms)

    fed = at_first.arrays if isinstance(at_first, FedModel) else {}
    model = onnx.ModelProto()
    model.CopyFrom(at_first.model if isinstance(at_first, FedModel) else at_first)  # without fed arrays
    graph = model.graph
    emit = _SizeNodes(iface, symbols, _names_in(graph))
    for name, (value, terms) in sized.items():
        emit.constant(name, value, terms)
    nodes = emit.nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + emit.initializers)
    _set_interface(graph, iface, g2, symbols, r, a)
    del graph.value_info[:]
    # the checker reads no weight; operators it lacks that the input has were loaded in onnxruntime
    complaint = checker_complaint(without_weight_data(model), {n.op_type for n in original.graph.node})
    if complaint:
        raise NotSymbolic(f"the model with symbolic dims fails onnx.checker: {complaint}")
    return file_backed(FedModel(model, {t.name: fed[t.name] for t in graph.initializer if is_stub(t)}))


def _same_structure(g1, g2) -> None:
    if len(g1.node) != len(g2.node) or {t.name for t in g1.initializer} != {t.name for t in g2.initializer}:
        raise NotSymbolic("it exports to different graphs at the two sizes")
    for n1, n2 in zip(g1.node, g2.node):
        if (n1.op_type, n1.domain, list(n1.input), list(n1.output)) != \
                (n2.op_type, n2.domain, list(n2.input), list(n2.output)):
            raise NotSymbolic("it exports to different graphs at the two sizes")
        for a1, a2 in zip(n1.attribute, n2.attribute):
            if a1.SerializeToString(deterministic=True) != a2.SerializeToString(deterministic=True):
                raise NotSymbolic(f"node {n1.name!r} ({n1.op_type}): attribute {a1.name!r} depends "
                                  f"on the symbolic sizes")


def _reshape_targets_only(graph) -> set[str]:
    """Names of the initializers that only Reshape nodes read, as their target."""
    targets, other = set(), set()
    for n in graph.node:
        for i, name in enumerate(n.input):
            (targets if n.op_type == "Reshape" and i == 1 else other).add(name)
    return targets - other


def _monomial(x: int, y: int, r: Sequence[int], a: Sequence[int]):
    """``(c, exponents)`` with ``c * prod(r**e) == x`` and ``c * prod(a**e) == y``; None
    when no such monomial (exponents up to _MAX_EXPONENT) exists."""
    if x == y:
        return x, (0,) * len(r)
    for e in itertools.product(range(_MAX_EXPONENT + 1), repeat=len(r)):
        pr = math.prod(v ** k for v, k in zip(r, e))
        pa = math.prod(v ** k for v, k in zip(a, e))
        if any(e) and x % pr == 0 and (x // pr) * pa == y:
            return x // pr, e
    return None


def _names_in(graph) -> set[str]:
    names = {t.name for t in graph.initializer} | {v.name for v in graph.input} | \
        {v.name for v in graph.output}
    for n in graph.node:
        names.update(n.input)
        names.update(n.output)
        names.add(n.name)
    return names


class _SizeNodes:
    """The nodes that compute sized constants from the inputs' Shape, made once each."""

    def __init__(self, iface: Interface, symbols: list[str], used: set[str]):
        self.iface, self.symbols, self.used = iface, symbols, used
        self.nodes, self.initializers = [], []
        self._cache: dict = {}

    def fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.used:
            k += 1
            name = f"{hint}_{k}"
        self.used.add(name)
        return name

    def node(self, op_type: str, inputs, hint: str, out: str | None = None, **attrs) -> str:
        from onnx import helper

        out = out or self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=self.fresh(f"{hint}_node"),
                                           **attrs))
        return out

    def literal(self, values, hint: str = "size_const") -> str:
        from onnx import numpy_helper

        key = ("literal", tuple(np.asarray(values).ravel().tolist()), np.asarray(values).shape)
        if key not in self._cache:
            name = self.fresh(hint)
            self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
            self._cache[key] = name
        return self._cache[key]

    def symbol(self, s: str) -> str:
        """``s`` as an int64 [1] tensor: its input's Shape at its axis."""
        if ("symbol", s) not in self._cache:
            name, axis = self.iface.source(s)
            if ("shape", name) not in self._cache:
                self._cache[("shape", name)] = self.node("Shape", [name], f"shape_of_{name}")
            shape = self._cache[("shape", name)]
            self._cache[("symbol", s)] = self.node("Gather", [shape, self.literal([axis])],
                                                   f"size_{_safe(s)}", axis=0)
        return self._cache[("symbol", s)]

    def term(self, c: int, exponents) -> str:
        """``c * prod(symbol ** e)`` as an int64 [1] tensor."""
        key = ("term", c, tuple(exponents))
        if key not in self._cache:
            factors = [self.symbol(s) for s, e in zip(self.symbols, exponents) for _ in range(e)]
            if c != 1:
                factors.append(self.literal([c]))
            out = factors[0]
            for f in factors[1:]:
                out = self.node("Mul", [out, f], "size_product")
            self._cache[key] = out
        return self._cache[key]

    def constant(self, name: str, value: np.ndarray, terms) -> None:
        """Nodes that compute ``name`` (``value`` at the first sizes) from the symbols."""
        pieces, run = [], []
        for c, e in terms:
            if any(e):
                if run:
                    pieces.append(self.literal(run))
                    run = []
                pieces.append(self.term(c, e))
            else:
                run.append(c)
        if run:
            pieces.append(self.literal(run))
        reshape, cast = value.ndim != 1, value.dtype != np.int64
        if len(pieces) == 1 and not reshape and not cast:  # a term other constants may share
            self.node("Identity", pieces, "sizes", out=name)
            return
        vector = pieces[0] if len(pieces) == 1 else \
            self.node("Concat", pieces, "sizes", out=None if reshape or cast else name, axis=0)
        if reshape:
            vector = self.node("Reshape", [vector, self.literal(list(value.shape), "size_shape")], "sizes",
                               out=None if cast else name)
        if cast:
            from onnx import helper

            self.node("Cast", [vector], "sizes", out=name, to=helper.np_dtype_to_tensor_dtype(value.dtype))


def _safe(s: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in s)


def _set_interface(graph, iface: Interface, second, symbols, r, a) -> None:
    """The original's inputs and outputs, in its order: names, dtypes, dim_params. An
    output the original gives no shape has the exported one, each dim that differs
    at the second sizes named by its symbol (or left unnamed when it is a product)."""
    have_in = [v.name for v in graph.input]
    have_out = [v.name for v in graph.output]
    if sorted(have_in) != sorted(v.name for v in iface.inputs) or \
            have_out != [v.name for v in iface.outputs]:
        raise NotSymbolic(f"its inputs {have_in} and outputs {have_out} are not the original's")
    outputs = []
    for mine, theirs, at_second in zip(graph.output, iface.outputs, second.output):
        if theirs.type.tensor_type.HasField("shape") or not mine.type.tensor_type.HasField("shape"):
            outputs.append(theirs)
            continue
        vi = type(mine)()
        vi.CopyFrom(mine)
        for d, d2 in zip(vi.type.tensor_type.shape.dim, at_second.type.tensor_type.shape.dim):
            if d.dim_value != d2.dim_value:
                term = _monomial(d.dim_value, d2.dim_value, r, a)
                single = term is not None and term[0] == 1 and sorted(term[1]) == [0] * (len(r) - 1) + [1]
                d.Clear()
                if single and not symbols[term[1].index(1)].startswith("?"):  # a named symbol
                    d.dim_param = symbols[term[1].index(1)]
        outputs.append(vi)
    del graph.input[:]
    graph.input.extend(iface.inputs)
    del graph.output[:]
    graph.output.extend(outputs)
