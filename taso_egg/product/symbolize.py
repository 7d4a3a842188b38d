"""A candidate written back with the input's symbolic dims (``symbolize``).

The candidate is exported twice: at the first sizes and at the second ones
(``dims.second_sizes``: each symbol moved to a prime that divides none of the first
sizes, so that the ratios of the two sizes are multiplicatively independent). Node for
node the two exports agree but for the integer constants that encode a symbolic size
(Reshape targets, Expand shapes, Slice ends, ...); each element of those is solved for
the one monomial ``c * s1^e1 * s2^e2 ...`` that gives both values (unique under that
independence) and written as arithmetic on the model's own ``Shape`` of an input. The
inputs and outputs are the original's value infos: names, order, dtypes and
dim_params. What cannot be written so (a float constant that depends on a size, a size
that is not a monomial of the symbols, such as ``seq - 1``) raises ``NotSymbolic``
naming it.
"""

from __future__ import annotations

import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from ..errors import TasoEggError
from ..onnx_io.fed import FedModel, array_of, file_backed, is_stub
from ..onnx_io.validate import checker_complaint, without_weight_data
from .dims import Interface, describe_sizes, interface

_MAX_EXPONENT = 2      # sizes up to the square of a symbol (attention's seq x seq)


class NotSymbolic(TasoEggError):
    """A candidate that cannot be written with the input's symbolic dims."""


def writable_sizes(here: Mapping[str, int], there: Mapping[str, int]):
    """Whether an integer vector of sizes, ``v`` at the ``here`` sizes and ``w`` at
    ``there``, is one ``symbolize`` writes: each element a monomial of the symbols."""
    r = [here[s] for s in here]
    a = [there[s] for s in here]

    def writable(v: np.ndarray, w: np.ndarray) -> bool:
        return v.shape == w.shape and all(_monomial(x, y, r, a) is not None
                                          for x, y in zip(v.ravel().tolist(), w.ravel().tolist()))
    return writable


def symbolize(at_first, at_second, original, first: Mapping[str, int], second: Mapping[str, int],
              shapes: tuple[Mapping, Mapping] = ({}, {}), may_be_empty: frozenset = frozenset()):
    """The candidate exported at ``first`` sizes (``at_first``) and at ``second`` sizes
    (``at_second``, node for node the same; ModelProtos or ``fed.FedModel``s) as one
    model with ``original``'s interface: a new FedModel (its large weights
    ``at_first``'s arrays); NotSymbolic naming what cannot be written so. A Reshape's
    target takes the sizes its input has at the same axes from it (``_ReshapeInputs``;
    ``shapes``: tensor name -> shape in each export, where known; the symbols in
    ``may_be_empty`` may be 0 at run time)."""
    import onnx
    from onnx import numpy_helper

    iface = interface(original)
    g1, g2 = at_first.graph, at_second.graph
    _same_structure(g1, g2)
    symbols = iface.symbols
    r = [first[s] for s in symbols]
    a = [second[s] for s in symbols]
    others = {t.name: t for t in g2.initializer}
    targets_only = _reshape_targets_only(g1)
    copies = _ReshapeInputs(g1, targets_only, shapes, symbols, may_be_empty)
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
        terms = copies.copied_sizes(t.name, v1, v2, terms)
        if not any(any(e) for _, e in terms):  # every size copied or inferred: a constant target
            kept.append(numpy_helper.from_array(np.array([c for c, _ in terms], v1.dtype).reshape(v1.shape), t.name))
            continue
        sized[t.name] = (v1, terms)

    fed = at_first.arrays if isinstance(at_first, FedModel) else {}
    model = onnx.ModelProto()
    model.CopyFrom(at_first.model if isinstance(at_first, FedModel) else at_first)  # without fed arrays
    graph = model.graph
    emit = _SizeNodes(iface, symbols, _names_in(graph))
    for name, (value, terms) in sized.items():
        emit.constant(name, value, terms)
    nodes, read = _without_identity_expands(emit.nodes + list(graph.node), shapes, {o.name for o in graph.output})
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(t for t in kept + emit.initializers if t.name in read)
    _set_interface(graph, iface, g2, symbols, r, a)
    del graph.value_info[:]
    # the checker reads no weight; operators it lacks that the input has were loaded in onnxruntime
    complaint = checker_complaint(without_weight_data(model), {n.op_type for n in original.graph.node})
    if complaint:
        raise NotSymbolic(f"the model with symbolic dims fails onnx.checker: {complaint}")
    return file_backed(FedModel(model, {t.name: fed[t.name] for t in graph.initializer if is_stub(t)}))


def _without_identity_expands(nodes: list, shapes: tuple[Mapping, Mapping], outputs: set) -> tuple[list, set]:
    """``nodes`` (in topological order) without each Expand whose output has its input's
    shape at both sizes (so at every size: both shapes are the same monomials of the
    dims), its readers reading its input; then without the nodes nothing reads any more
    (the shape arithmetic such an Expand was given: a decoder's mask is expanded to the
    shape it has by a dozen kernels). Also the names the nodes kept read."""
    from onnx import helper

    # what a subgraph reads keeps its name (only the top level's inputs are renamed)
    in_branches = {name for n in nodes if n.attribute for name in _node_reads(n) - set(n.input)}
    renamed: dict[str, str] = {}
    kept = []
    for n in nodes:
        same = [(sh.get(n.input[0]), sh.get(n.output[0])) for sh in shapes] if n.op_type == "Expand" else []
        if same and all(a is not None and a == b for a, b in same):
            if n.output[0] in outputs or n.output[0] in in_branches:
                kept.append(helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name))
            else:
                renamed[n.output[0]] = renamed.get(n.input[0], n.input[0])
            continue
        kept.append(n)
    # one sweep from the outputs back: a node is kept where one of its outputs is read
    read, alive = set(outputs), []
    for n in reversed(kept):
        for i, name in enumerate(n.input):
            if name in renamed:
                n.input[i] = renamed[name]
        if any(o in read for o in n.output if o):
            alive.append(n)
            read |= _node_reads(n)
    return alive[::-1], read


def _node_reads(node) -> set[str]:
    """The names a node reads, those of its subgraphs (an If's branches) included."""
    from onnx import AttributeProto

    names = set(node.input)
    for a in node.attribute:
        graphs = [a.g] if a.type == AttributeProto.GRAPH else list(a.graphs) if a.type == AttributeProto.GRAPHS \
            else []
        for g in graphs:
            for n in g.node:
                names |= _node_reads(n)
    return names


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


class _ReshapeInputs:
    """A Reshape target's sizes as ONNX lets a target say them without computing them:
    0, the input's size at the same axis (allowzero 0), where the input has it at both
    sizes, and one -1, what the other sizes leave of the element count. Each saves the
    ``Shape``, ``Gather`` and ``Concat`` kernels that would compute the size at every
    run: a decoder's step computes a dozen so."""

    def __init__(self, graph, targets: set, shapes: tuple[Mapping, Mapping], symbols: Sequence[str],
                 may_be_empty: frozenset):
        self.readers: dict[str, list] = {}
        for n in graph.node:
            if n.op_type == "Reshape" and n.input[1] in targets:
                self.readers.setdefault(n.input[1], []).append(n)
        self.shapes = shapes
        self.empty_axes = [s in may_be_empty for s in symbols]

    def copied_sizes(self, name: str, v1: np.ndarray, v2: np.ndarray, terms: list) -> list:
        """``terms`` (``(c, exponents)`` for each element of a Reshape target) with a
        size every reader's input has at that axis at both sizes written 0, and then
        the one size left (if one is) written -1 where no other can be 0 at run time
        (onnxruntime infers no -1 beside a 0)."""
        readers = self.readers.get(name)
        if not readers or v1.ndim != 1 or any(int(x) in (0, -1) for x in v1.tolist()) or \
                any(a.name == "allowzero" and a.i for n in readers for a in n.attribute):
            return terms
        ins = [[shapes.get(n.input[0]) for shapes in self.shapes] for n in readers]
        if any(shape is None for both in ins for shape in both):
            return terms
        copied = [any(e) and all(i < len(s1) and (s1[i], s2[i]) == (int(v1[i]), int(v2[i])) for s1, s2 in ins)
                  for i, (_, e) in enumerate(terms)]
        left = [i for i, (_, e) in enumerate(terms) if any(e) and not copied[i]]
        minus_one = len(left) == 1 and not any(
            copied[i] and any(k and empty for k, empty in zip(e, self.empty_axes))
            for i, (_, e) in enumerate(terms) if i != left[0])
        zero = (0,) * len(self.empty_axes)
        return [(0, zero) if copied[i] else (-1, zero) if minus_one and i == left[0] else term
                for i, term in enumerate(terms)]


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
