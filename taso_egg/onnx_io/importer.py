"""ONNX -> Graph.

Every node ends up somewhere: mapped onto the operator table, folded into a constant
(when all its inputs are known before run time, as exporters' shape arithmetic is
once shapes are fixed), removed when it is an identity (Identity, inference
Dropout), or kept as an opaque operator with its inferred output types.

A model imported at sizes of its symbolic dims that it keeps (``OtherSizes``: the
same inputs at other sizes) folds a value that depends on those sizes only when it
is a small integer vector of sizes (a reshape target, which ``symbolic.symbolize``
writes as arithmetic on the input's Shape); the rest (attention masks, position
ranges, a slice's bounds) stays in the graph as opaque nodes down from the Shape of
the run-time tensor, so that the written model computes it at any size.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import CannotRun, NotModelled, OnnxImportError, ShapeError, TasoEggError, first_line
from ..executor import check_feed_fits
from ..graph import Graph, Tensor
from ..ops import ONNX_IMPORTERS, TensorType
from ..ops.opaque import outer_reads, run_node
from ..ops.precision import is_quantizing, quantized_operators, widens_stored
from .fed import FedModel, is_stub
from .key_masks import mask_wheres
from .onnx_nodes import attr_blobs, attr_value, constant_value, empty_positions, in_topological_order, static_type
from .reading import default_opset, read_model, upgraded

log = logging.getLogger("taso_egg.onnx")

# Ops that are never folded even with constant inputs: their value is not a
# function of their inputs.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli"}
# Folding a constant bigger than this (elements) into the file would bloat it more
# than running the node costs: keep such nodes in the graph instead.
_FOLD_LIMIT = 1 << 24
# Mapped ops that fold anyway when all their inputs are known: no rewrite sees
# through them (a lookup in a known table, as position embeddings are, or a slice of
# known position ids; the mask operators, which rules leave out), so a known result
# is just data.
_FOLD_ANYWAY = {"Gather", "GatherND", "Slice", "Expand", "Cast", "Equal", "And", "Where", "IsNaN"}
# A value that depends on symbolic sizes folds only as a vector of sizes: an integer
# (or bool, between Equal and Where) vector at most this long, as a shape is.
_SIZES_VECTOR = 8
_INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class OtherSizes:
    """The model at other sizes of the symbolic dims it keeps: the type there of each
    value computed at run time (``value_types``), and whether an integer vector of
    sizes, given its values at the sizes imported and at these, can be written as
    arithmetic on the inputs' Shape (``writable``)."""

    types: Mapping[str, TensorType]
    writable: Callable[[np.ndarray, np.ndarray], bool]


def load_onnx(model, input_shapes: Mapping[str, Sequence[int]] | None = None,
              other_sizes: OtherSizes | None = None) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a Graph.

    ``input_shapes`` fixes symbolic dimensions (e.g. a dynamic batch) by input name.
    ``other_sizes``: the symbolic dims are kept (the graph is written back with them):
    what depends on them stays computed at run time (see the module's doc).
    """
    proto = upgraded(read_model(model))
    return _Importer(proto, dict(input_shapes or {}), other_sizes).run()


def value_types(model, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, TensorType]:
    """The type of each value of the model that is computed at run time when its
    inputs have ``input_shapes`` (by ONNX name; ONNX's own shape inference loses
    track where a sized slice feeds a broadcast)."""
    importer = _Importer(upgraded(read_model(model)), dict(input_shapes))
    importer.run()
    return importer.types



@dataclass
class _Importer:
    proto: object
    input_shapes: dict
    other_sizes: OtherSizes | None = None
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    # constants that depend on the kept symbolic sizes: value at the other sizes (None
    # where unknown), and the ONNX node that computes it (run when the graph needs it)
    sized: dict[str, np.ndarray | None] = field(default_factory=dict)
    sized_by: dict[str, object] = field(default_factory=dict)
    values: dict[str, Tensor] = field(default_factory=dict)
    types: dict[str, TensorType] = field(default_factory=dict)
    opaque_seen: set = field(default_factory=set)
    readers_of: dict[str, list] = field(default_factory=dict)  # value name -> the nodes reading it

    def run(self) -> Graph:
        graph = self.proto.graph
        for node in graph.node:
            for name in dict.fromkeys(node.input):
                self.readers_of.setdefault(name, []).append(node)
        self.opset = default_opset(self.proto)
        self.domain_opsets = {o.domain: o.version for o in self.proto.opset_import}
        self.g = Graph(opset=self.opset)
        self.g.ir_version = self.proto.ir_version
        initializers = {t.name for t in graph.initializer}
        self._read_initializers()
        for vi in graph.input:
            if vi.name not in initializers:
                self._add_input(vi)
        unknown = sorted(set(self.input_shapes) - set(self.types))
        if unknown:
            raise OnnxImportError(f"a shape is given (--input-shape, input_shapes) for "
                                  f"{', '.join(map(repr, unknown))}, which is not an input of "
                                  f"the model (its inputs: "
                                  f"{', '.join(repr(n) for n in self.types) or 'none'})")
        self.inferred = self._infer_types(self.types)
        self.quantized = quantized_operators(graph.node)
        for node in in_topological_order(graph.node):
            self._import_node(node)
        for vi in graph.output:
            if vi.name not in self.values and vi.name not in self.consts:
                raise OnnxImportError(f"graph output {vi.name!r} is produced by no node")
            self.g.mark_output(self.tensor(vi.name), vi.name)
        for where in mask_wheres(graph, self.consts):  # (the constants read once, above)
            t = self.values.get(where)
            if t is not None and self.g.nodes[t.node].op == "where":
                self.g.masks[(t.node, t.index)] = where
        if self.g.masks:
            self.g.source = self.proto.model if isinstance(self.proto, FedModel) else self.proto
        return self.g

    # --- set-up --------------------------------------------------------------------

    def _read_initializers(self):
        from onnx import numpy_helper

        for t in self.proto.graph.initializer:
            if is_stub(t):  # a FedModel's: the array itself, not a copy
                self.consts[t.name] = self.proto.arrays[t.name]
                continue
            if t.data_location == 1 and not t.raw_data:  # EXTERNAL, not loaded
                raise OnnxImportError(f"initializer {t.name!r} keeps its data in an external "
                                      f"file that was not loaded; pass the model's path")
            try:
                self.consts[t.name] = numpy_helper.to_array(t)
            except Exception as e:
                raise OnnxImportError(f"initializer {t.name!r} is unreadable: {e}") from None

    def _add_input(self, vi):
        from onnx import helper

        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise OnnxImportError(f"input {vi.name!r} is not a tensor (sequences and maps are "
                                  f"not supported)")
        dtype = str(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        override = self.input_shapes.get(vi.name)
        if override is not None:
            shape = tuple(int(d) for d in override)
            if len(shape) != len(tt.shape.dim):
                raise OnnxImportError(f"input {vi.name!r}: the shape given for it has rank "
                                      f"{len(shape)}, the model says rank {len(tt.shape.dim)}")
            for axis, (d, size) in enumerate(zip(tt.shape.dim, shape)):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != size:
                    raise OnnxImportError(
                        f"input {vi.name!r}: the shape given for it (--input-shape, input_shapes) "
                        f"has {size} at axis {axis}, where the model fixes {d.dim_value}; only "
                        f"symbolic dimensions can be set")
                if size < 1:
                    raise OnnxImportError(f"input {vi.name!r}: the shape given for it has {size} "
                                          f"at axis {axis}; sizes must be >= 1")
        else:
            shape = []
            for axis, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value") and d.dim_value > 0:
                    shape.append(d.dim_value)
                elif d.HasField("dim_value"):
                    raise OnnxImportError(f"input {vi.name!r} has size {d.dim_value} at axis {axis}: "
                                          f"an empty tensor, which the operator table does not model")
                else:
                    what = f"a symbolic dimension {d.dim_param!r}" if d.dim_param else \
                        "an unnamed symbolic dimension"
                    raise OnnxImportError(
                        f"input {vi.name!r} has {what} at axis {axis}; pass --input-shape "
                        f"{vi.name}=... to fix it (Python: input_shapes={{'{vi.name}': (...)}})")
            shape = tuple(shape)
        check_feed_fits(vi.name, shape, dtype)
        t = self.g.new_input(shape, name=vi.name, dtype=dtype)
        self.values[vi.name] = t
        self.types[vi.name] = t.type

    def _infer_types(self, input_types: Mapping[str, TensorType]) -> dict[str, TensorType]:
        """ONNX shape inference with the inputs fixed at ``input_types``, for opaque
        nodes' outputs."""
        import onnx
        from onnx import helper

        model = onnx.ModelProto()
        model.CopyFrom(self.proto.model if isinstance(self.proto, FedModel) else self.proto)
        for vi in model.graph.input:
            if vi.name in input_types:
                t = input_types[vi.name]
                vi.CopyFrom(helper.make_tensor_value_info(
                    vi.name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape)))
        del model.graph.value_info[:]
        # Initializer data is not needed for inference; dropping it keeps this cheap.
        for init in model.graph.initializer:
            init.ClearField("raw_data")
            for fld in ("float_data", "int64_data", "int32_data", "double_data"):
                if len(getattr(init, fld)) > 64:
                    init.ClearField(fld)
        # What inference cannot type (a custom domain's operator) the model may declare.
        types = {vi.name: t for vi in self.proto.graph.value_info if (t := static_type(vi)) is not None}
        types.update(input_types)
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception as e:  # inference is a help, not a requirement
            log.debug("ONNX shape inference failed: %s", e)
            return types
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            t = static_type(vi)
            if t is not None:
                types[vi.name] = t
        return types


    # --- per node ------------------------------------------------------------------

    def _import_node(self, node):
        from onnx import helper

        captured = outer_reads(node)  # what its bodies read from this graph
        for name in (*node.input, *captured):
            if name and name not in self.values and name not in self.consts:
                raise OnnxImportError(f"node {node.name or node.op_type!r} ({node.op_type}): "
                                      f"input {name!r} is neither a graph input, an initializer "
                                      f"nor produced by an earlier node")
        attrs = {a.name: attr_value(helper.get_attribute_value(a)) for a in node.attribute}
        where = f"node {node.name or node.output[0]!r} ({node.op_type})"
        try:
            if self._alias(node):
                return
            if self._keeps_precision(node, attrs):
                outs = self._opaque(node, "the model's precision: never folded, a barrier to rewrites")
            elif tuple(node.output) in self.quantized:
                outs = self._opaque(node, "between DequantizeLinear and QuantizeLinear, a quantized "
                                          "operator as onnxruntime runs it")
            elif not captured and self._fold(node, attrs):
                return
            else:
                outs = None
            if outs is None and self.sized:
                node = self._counted_from_end(node, attrs)
            if (outs is None and node.domain in ("", "ai.onnx") and node.op_type in ONNX_IMPORTERS
                    and self._mappable(node)):
                outs = ONNX_IMPORTERS[node.op_type](self, node, attrs)
            if outs is None:
                outs = self._opaque(node)
        except ShapeError as e:
            raise ShapeError(f"{where}: {e}") from None
        except KeyError as e:
            raise OnnxImportError(f"{where}: missing attribute or input {e}") from None
        for name, t in zip(node.output, outs):
            if name:
                self.values[name] = t
                self.types[name] = t.type
                self.g.nodes[t.node].name = self.g.nodes[t.node].name or node.name

    def _alias(self, node) -> bool:
        """Identity and inference-mode Dropout forward their input."""
        if node.op_type not in ("Identity", "Dropout") or node.domain not in ("", "ai.onnx"):
            return False
        if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1]:
            return False  # the mask is consumed: keep the node
        src = node.input[0]
        if src in self.consts:
            self.consts[node.output[0]] = self.consts[src]
            if src in self.sized:
                self.sized[node.output[0]], self.sized_by[node.output[0]] = self.sized[src], node
        else:
            self.values[node.output[0]] = self.values[src]
            self.types[node.output[0]] = self.types[src]
        return True

    def _keeps_precision(self, node, attrs) -> bool:
        """Nodes that quantize, and casts that would store a narrow weight wider, stay
        as the input has them (ops/precision.py): folding them would widen the
        model's weights."""
        if is_quantizing(node.op_type, node.domain):
            return True
        if node.op_type not in ("Cast", "CastLike") or node.input[0] not in self.consts:
            return False
        from onnx import helper

        weight = self.consts[node.input[0]]
        target = (self.type(node.input[1]).dtype if node.op_type == "CastLike"
                  else helper.tensor_dtype_to_np_dtype(attrs["to"]))
        return widens_stored(weight.dtype, target, weight.size)

    def _fold(self, node, attrs) -> bool:
        """Evaluate nodes whose result is known before run time."""
        if node.op_type == "Constant":
            self.consts[node.output[0]] = constant_value(node, attrs)
            return True
        if node.op_type in ("Shape", "Size") and node.input[0] in self.types:
            value = _shape_value(node.op_type, attrs, self.types[node.input[0]].shape)
            self.consts[node.output[0]] = value
            if self.other_sizes is not None and node.input[0] not in self.consts:  # a run-time tensor
                other = self.other_sizes.types.get(node.input[0])
                other = None if other is None else _shape_value(node.op_type, attrs, other.shape)
                if other is None or not np.array_equal(other, value):
                    self.sized[node.output[0]], self.sized_by[node.output[0]] = other, node
            return True
        if node.op_type == "CastLike" and node.input[0] in self.consts:
            # only the dtype of the second input matters, and it is known here
            target = self.type(node.input[1]).dtype
            return self._keep_folded(node, [self.consts[node.input[0]].astype(target)],
                                     lambda arrays: [arrays[0].astype(target)], [node.input[0]])
        present = [n for n in node.input if n]
        if not present or not all(n in self.consts for n in present) \
                or node.op_type in _NONDETERMINISTIC:
            return False
        if node.op_type in ONNX_IMPORTERS and node.op_type not in _FOLD_ANYWAY and any(
                self.consts[n].dtype.kind == "f" and self.consts[n].size > 1 for n in present):
            # Weight-only arithmetic of mapped ops stays in the graph (folded at export),
            # so rewrites can still see it; only shape arithmetic folds here.
            return False

        def run(arrays):
            return run_node(node.op_type, node.domain, self._opset_of(node), attr_blobs(node),
                            tuple((a.shape, str(a.dtype)) for a in arrays), len(node.output), arrays,
                            empty_positions(node))

        outs = run([self.consts[n] for n in present])
        if any(o.size > _FOLD_LIMIT for o in outs):
            return False
        return self._keep_folded(node, outs, run, present)

    def _keep_folded(self, node, outs, run, present) -> bool:
        """Record ``node``'s folded outputs, unless one depends on kept symbolic sizes
        and is no vector of sizes (it is computed at run time then: False). ``run``
        computes the outputs from the ``present`` inputs' values."""
        if any(n in self.sized for n in present):
            others = None
            if not any(n in self.sized and self.sized[n] is None for n in present):
                try:
                    others = run([self.sized.get(n, self.consts[n]) for n in present])
                except TasoEggError:
                    pass  # unknown at the other sizes
            changed = [i for i, v in enumerate(outs)
                       if others is None or v.shape != others[i].shape or not np.array_equal(v, others[i])]
            if any(not _sizes_vector(outs[i], None if others is None else others[i]) for i in changed):
                return False
            for i in changed:
                self.sized[node.output[i]] = None if others is None else others[i]
                self.sized_by[node.output[i]] = node
        for name, value in zip(node.output, outs):
            self.consts[name] = value
        return True

    def _mappable(self, node) -> bool:
        """Whether the operator table may take ``node``: it reads no value that depends
        on kept symbolic sizes, but for a reshape's target that ``symbolize`` can write,
        or an expand's that repeats static axes alone (``_repeats_static_axes``).
        (A table operator's parameters are sizes at the sizes imported: an expand to its
        own shape would vanish at a batch of 1, and so would not be there at another.)"""
        sized = [n for n in node.input if n in self.sized]
        if not sized:
            return True
        target = node.input[1] if node.op_type in ("Reshape", "Expand") and len(node.input) > 1 else None
        if sized != [target]:
            return False
        if self.sized[target] is None:
            return node.op_type == "Reshape"
        if not self.other_sizes.writable(self.consts[target], self.sized[target]):
            return False
        return node.op_type == "Reshape" or self._repeats_static_axes(node.input[0], self.consts[target],
                                                                      self.sized[target])

    def _repeats_static_axes(self, x: str, here: np.ndarray, there: np.ndarray) -> bool:
        """Whether an Expand of ``x`` to ``here`` (``there`` at the other sizes) repeats
        it along axes of one size at both (repeat_kv's group of heads) and keeps the
        axes whose sizes vary: such an expand is there at every size. One along a size
        that varies (a batch) vanishes where that size is 1, so the two imports differ."""
        x_here, x_there = self.type(x).shape, self._other_shape(x)
        if x_there is None or not (len(x_here) == len(x_there) == len(here) == len(there)):
            return False
        return all((c, d) == (a, b) if a != b else c == d
                   for a, b, c, d in zip(here.tolist(), there.tolist(), x_here, x_there))

    def _counted_from_end(self, node, attrs):
        """``node`` with a Slice's bounds or a Gather's index that depend on kept sizes
        but sit a fixed distance from the end of their axis at both (the last position,
        ``seq - 1``) written as that distance, negative (an end past the axis: INT64_MAX),
        as an exporter writes ``x[:, -1]``; ``node`` itself where they do not."""
        if node.op_type not in ("Slice", "Gather") or len(node.input) < 2 or node.input[0] in self.sized:
            return node
        here, other = self.type(node.input[0]).shape, self._other_shape(node.input[0])
        if other is None or len(other) != len(here):
            return node
        inputs = list(node.input)
        if node.op_type == "Gather":
            axes, bounds = None, {1: "start"}
            axis = int(attrs.get("axis", 0))
        else:
            fixed = [n for n in inputs[3:5] if n]
            if any(n in self.sized or n not in self.consts for n in fixed):
                return node
            if len(inputs) > 4 and inputs[4] and np.any(self.consts[inputs[4]] != 1):
                return node
            bounds = {1: "start", 2: "end"}
            axes = self.consts[inputs[3]].reshape(-1) if len(inputs) > 3 and inputs[3] else None
        for i, kind in bounds.items():
            name = inputs[i]
            if name not in self.sized:
                continue
            v, w = self.consts[name], self.sized[name]
            if w is None or w.shape != v.shape or v.dtype.kind not in "iu":
                return node
            flat_axes = [axis] * v.size if axes is None else list(axes) if len(axes) == v.size else None
            if flat_axes is None or (node.op_type == "Gather" and v.ndim > 1):
                return node
            out = []
            for x, y, ax in zip(v.reshape(-1).tolist(), w.reshape(-1).tolist(), flat_axes):
                n, m = here[int(ax)], other[int(ax)]
                if kind == "end" and x >= n and y >= m:
                    out.append(_INT64_MAX)
                    continue
                x, y = x + n if x < 0 else x, y + m if y < 0 else y
                if x - n != y - m or x - n >= 0 or x < 0:
                    return node
                out.append(x - n)
            inputs[i] = self._new_const(np.array(out, dtype=v.dtype).reshape(v.shape), name)
        if inputs == list(node.input):
            return node
        from onnx import NodeProto

        rewritten = NodeProto()
        rewritten.CopyFrom(node)
        del rewritten.input[:]
        rewritten.input.extend(inputs)
        return rewritten

    def _other_shape(self, name: str):
        """The shape of value ``name`` at the other sizes; None where unknown."""
        if name in self.consts:
            value = self.sized.get(name, self.consts[name])
            return None if value is None else tuple(value.shape)
        t = self.other_sizes.types.get(name)
        return None if t is None else t.shape

    def _new_const(self, value: np.ndarray, hint: str) -> str:
        name, k = f"{hint}_from_end", 0
        while name in self.consts or name in self.values:
            k += 1
            name = f"{hint}_from_end_{k}"
        self.consts[name] = value
        return name

    def _at_run_time(self, name: str) -> None:
        """The folded value ``name``, which depends on kept sizes, as the opaque nodes
        that compute it from the Shape of a run-time tensor."""
        node = self.sized_by[name]
        if node.op_type in ("Identity", "Dropout"):
            self.values[name] = self.tensor(node.input[0])
        else:
            outs = self._opaque(node, out_types=[self.type(o) for o in node.output], quiet=True)
            for o, t in zip(node.output, outs):
                if o:
                    self.values[o] = t
        self.types[name] = self.values[name].type

    def _opaque(self, node, why: str = "not optimized", out_types: Sequence[TensorType] | None = None,
                quiet: bool = False):
        """``node`` carried as an opaque operator (``out_types``: its outputs' types
        where known; ``quiet``: no notice, it is shape arithmetic kept on purpose)."""
        if node.op_type not in self.opaque_seen and not quiet:
            self.opaque_seen.add(node.op_type)
            log.warning("notice: ONNX operator %s%s is kept as an opaque node (carried "
                        "through unchanged: %s)", node.op_type,
                        f" (domain {node.domain})" if node.domain else "", why)
        if out_types is None:
            out_types = []
            for name in node.output:
                t = self.inferred.get(name)
                if t is None:
                    try:
                        t = self._probe_output_types(node)[list(node.output).index(name)]
                    except CannotRun as e:
                        raise NotModelled(f"node {node.name or name!r} ({node.op_type}"
                                          f"{', domain ' + node.domain if node.domain else ''}): the type of its "
                                          f"output {name!r} is unknown: ONNX shape inference cannot type it, the "
                                          f"model declares none (value_info), and {first_line(e)}") from None
                out_types.append(t)
        out_types = [(t.shape, t.dtype) for t in out_types]
        captured = outer_reads(node)
        ins = [self.tensor(n) for n in (*node.input, *captured) if n]
        return self.g.add_node("opaque", ins, node.name, op_type=node.op_type,
                               domain=node.domain, opset=self._opset_of(node),
                               attrs=attr_blobs(node), out_types=tuple(out_types),
                               empty_inputs=empty_positions(node), captured=captured)

    def _probe_output_types(self, node) -> list[TensorType]:
        """Neither shape inference nor the model's own value_info types the outputs: run
        the node once on zeros to learn them."""
        captured = outer_reads(node)
        arrays = [self.consts[n] if n in self.consts else
                  np.zeros(self.types[n].shape, dtype=self.types[n].dtype)
                  for n in (*node.input, *captured) if n]
        outs = run_node(node.op_type, node.domain, self._opset_of(node), attr_blobs(node),
                        tuple((a.shape, str(a.dtype)) for a in arrays), len(node.output), arrays,
                        empty_positions(node), captured)
        return [TensorType(tuple(o.shape), str(o.dtype)) for o in outs]

    def _opset_of(self, node) -> int:
        return self.domain_opsets.get(node.domain or "", self.opset)

    # --- what op importers call ------------------------------------------------------

    def type(self, name: str) -> TensorType:
        if name in self.consts:
            a = self.consts[name]
            return TensorType(tuple(a.shape), str(a.dtype))
        return self.types[name]

    def const(self, name: str):
        return self.consts.get(name)

    def readers(self, name: str) -> list:
        """The ONNX nodes that read value ``name``."""
        return self.readers_of.get(name, [])

    def tensor(self, name: str) -> Tensor:
        """The graph tensor for an ONNX value; constants become weights on first use."""
        if name not in self.values and name in self.sized:
            self._at_run_time(name)
        if name not in self.values:
            data = self.consts[name]
            t = self.g.new_weight(data.shape, data=data, name=_weight_name(self.g, name))
            self.values[name] = t
            self.types[name] = t.type
        return self.values[name]


def _weight_name(g: Graph, name: str) -> str:
    return name if name not in g._names else g._unique_name(name)



def _shape_value(op_type: str, attrs, shape) -> np.ndarray:
    """What a Shape (with its start and end) or a Size node gives for ``shape``."""
    shape = np.array(shape, dtype=np.int64)
    if op_type == "Size":
        return np.array(math.prod(shape.tolist()), dtype=np.int64)
    return shape[attrs.get("start", 0):attrs.get("end", len(shape))]


def _sizes_vector(value: np.ndarray, other: np.ndarray | None) -> bool:
    """Whether a value that depends on symbolic sizes (``other`` at the other sizes,
    None where unknown) may fold: a short integer vector whose length is not a size."""
    return value.dtype.kind in "iub" and value.ndim <= 1 and value.size <= _SIZES_VECTOR and \
        (other is None or other.shape == value.shape)
