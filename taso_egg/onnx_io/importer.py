"""ONNX -> Graph.

Every node ends up somewhere: mapped onto the operator table, folded into a constant
(when all its inputs are known before run time, as exporters' shape arithmetic is
once shapes are fixed), removed when it is an identity (Identity, inference
Dropout), or kept as an opaque operator with its inferred output types.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import CannotRun, GraphError, NotModelled, OnnxImportError, ShapeError, TasoEggError, first_line
from ..executor import check_feed_fits
from ..graph import Graph, Tensor
from ..ops import ONNX_IMPORTERS, TensorType
from ..ops.opaque import outer_reads, run_node
from ..ops.precision import is_quantizing, quantized_operators, widens_stored
from ..versions import MIN_OPSET
from .fed import FedModel, feed, is_stub
from .validate import validate_model

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


def load_onnx(model, input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a Graph.

    ``input_shapes`` fixes symbolic dimensions (e.g. a dynamic batch) by input name.
    """
    proto = upgraded(read_model(model))
    return _Importer(proto, dict(input_shapes or {})).run()


def read_model(model):
    """The ModelProto of a path, bytes or ModelProto, with any external data loaded;
    one OnnxImportError naming what is wrong otherwise."""
    return read_model_file(model)[0]


def read_model_file(model, validate: bool = True, fed: bool = False):
    """``(proto, external)``: as ``read_model``, and whether the file kept its weights
    in external data (so that what is written back can keep them apart too). With
    ``validate``, a model read from a file or bytes passes ``validate.validate_model``.
    With ``fed``, the model is a ``fed.FedModel``: its large weights arrays, external
    data read tensor by tensor, never whole into protobuf."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, (onnx.ModelProto, FedModel)):
        return model, False
    where, external = "bytes", False
    try:
        if isinstance(model, (bytes, bytearray)):
            proto = onnx.load_from_string(bytes(model))
        else:
            where = os.fspath(model)
            if os.path.isdir(where):
                raise OnnxImportError(f"{where}: is a folder, not an ONNX file")
            if not os.path.isfile(where):
                raise OnnxImportError(f"{where}: no such file")
            proto = onnx.load(where, load_external_data=False)
            external = has_external_data(proto)
            if external and not fed:
                _load_external_data(proto, where)
    except TasoEggError:
        raise
    except (DecodeError, ValueError, RuntimeError, OSError) as e:
        raise OnnxImportError(f"{where}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not proto.graph.node and not proto.graph.output:
        raise OnnxImportError(f"{where}: not an ONNX model (no graph)")
    _check_opset(proto, where)
    if validate:
        validate_model(proto, where)
    if fed:
        try:
            proto = feed(proto, os.path.dirname(os.path.abspath(where)) if where != "bytes" else None)
        except (ValueError, OSError) as e:
            raise OnnxImportError(f"{where}: its external weight data cannot be read ({first_line(e)})") from None
    return proto, external


def has_external_data(proto) -> bool:
    """Whether any initializer keeps its data in another file (not loaded yet)."""
    from onnx import TensorProto

    return any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer)


def _load_external_data(proto, path: str) -> None:
    from onnx import checker
    from onnx.external_data_helper import load_external_data_for_model

    try:
        load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
    except (checker.ValidationError, OSError) as e:
        raise OnnxImportError(f"{path}: its external weight data cannot be read "
                              f"({first_line(e)})") from None


def _check_opset(proto, where) -> None:
    import onnx

    opset, newest = _default_opset(proto), onnx.defs.onnx_opset_version()
    if opset > newest:
        raise OnnxImportError(f"{where}: model uses opset {opset}; the installed onnx "
                              f"{onnx.__version__} knows opsets up to {newest}")
    if opset < 1:
        raise OnnxImportError(f"{where}: model declares opset {opset}, which does not exist")


def upgraded(proto):
    """``proto`` converted to opset MIN_OPSET when it is older (onnxruntime runs no
    opset before 7, and the importers read the sizes and axes that opset 13 moved to
    inputs); ``proto`` itself otherwise."""
    from onnx import version_converter

    opset = _default_opset(proto)
    if opset >= MIN_OPSET:
        return proto
    try:
        if isinstance(proto, FedModel):  # the stubs convert as they are, the arrays stay
            return FedModel(version_converter.convert_version(proto.model, MIN_OPSET), proto.arrays)
        return version_converter.convert_version(proto, MIN_OPSET)
    except Exception as e:
        raise OnnxImportError(f"model uses opset {opset}; converting it to opset "
                              f"{MIN_OPSET} failed: {first_line(e)}") from None


def _default_opset(proto) -> int:
    for o in proto.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    raise OnnxImportError("model imports no version of the default ONNX domain")


@dataclass
class _Importer:
    proto: object
    input_shapes: dict
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, Tensor] = field(default_factory=dict)
    types: dict[str, TensorType] = field(default_factory=dict)
    opaque_seen: set = field(default_factory=set)

    def run(self) -> Graph:
        graph = self.proto.graph
        self.opset = _default_opset(self.proto)
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
        self._infer_types()
        self.quantized = quantized_operators(graph.node)
        for node in _topological(graph.node):
            self._import_node(node)
        for vi in graph.output:
            if vi.name not in self.values and vi.name not in self.consts:
                raise OnnxImportError(f"graph output {vi.name!r} is produced by no node")
            self.g.mark_output(self.tensor(vi.name), vi.name)
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

    def _infer_types(self):
        """ONNX shape inference with the inputs fixed, for opaque nodes' outputs."""
        import onnx
        from onnx import helper

        model = onnx.ModelProto()
        model.CopyFrom(self.proto.model if isinstance(self.proto, FedModel) else self.proto)
        for vi in model.graph.input:
            if vi.name in self.types:
                t = self.types[vi.name]
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
        self.inferred: dict[str, TensorType] = {
            vi.name: t for vi in self.proto.graph.value_info if (t := _static_type(vi)) is not None}
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception as e:  # inference is a help, not a requirement
            log.debug("ONNX shape inference failed: %s", e)
            return
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            t = _static_type(vi)
            if t is not None:
                self.inferred[vi.name] = t


    # --- per node ------------------------------------------------------------------

    def _import_node(self, node):
        from onnx import helper

        captured = outer_reads(node)  # what its bodies read from this graph
        for name in (*node.input, *captured):
            if name and name not in self.values and name not in self.consts:
                raise OnnxImportError(f"node {node.name or node.op_type!r} ({node.op_type}): "
                                      f"input {name!r} is neither a graph input, an initializer "
                                      f"nor produced by an earlier node")
        attrs = {a.name: _attr_value(helper.get_attribute_value(a)) for a in node.attribute}
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
            if outs is None and node.domain in ("", "ai.onnx") and node.op_type in ONNX_IMPORTERS:
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
            self.consts[node.output[0]] = _constant_value(node, attrs)
            return True
        if node.op_type in ("Shape", "Size") and node.input[0] in self.types:
            shape = np.array(self.types[node.input[0]].shape, dtype=np.int64)
            if node.op_type == "Size":
                value = np.array(math.prod(shape.tolist()), dtype=np.int64)
            else:
                start, end = attrs.get("start", 0), attrs.get("end", len(shape))
                value = shape[start:end]
            self.consts[node.output[0]] = value
            return True
        if node.op_type == "CastLike" and node.input[0] in self.consts:
            # only the dtype of the second input matters, and it is known here
            target = self.type(node.input[1]).dtype
            self.consts[node.output[0]] = self.consts[node.input[0]].astype(target)
            return True
        present = [n for n in node.input if n]
        if not present or not all(n in self.consts for n in present) \
                or node.op_type in _NONDETERMINISTIC:
            return False
        if node.op_type in ONNX_IMPORTERS and node.op_type not in _FOLD_ANYWAY and any(
                self.consts[n].dtype.kind == "f" and self.consts[n].size > 1 for n in present):
            # Weight-only arithmetic of mapped ops stays in the graph (folded at export),
            # so rewrites can still see it; only shape arithmetic folds here.
            return False
        arrays = [self.consts[n] for n in present]
        outs = run_node(node.op_type, node.domain, self._opset_of(node), _attr_blobs(node),
                        tuple((a.shape, str(a.dtype)) for a in arrays), len(node.output), arrays,
                        _empty_positions(node))
        if any(o.size > _FOLD_LIMIT for o in outs):
            return False
        for name, value in zip(node.output, outs):
            self.consts[name] = value
        return True

    def _opaque(self, node, why: str = "not optimized"):
        if node.op_type not in self.opaque_seen:
            self.opaque_seen.add(node.op_type)
            log.warning("notice: ONNX operator %s%s is kept as an opaque node (carried "
                        "through unchanged: %s)", node.op_type,
                        f" (domain {node.domain})" if node.domain else "", why)
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
            out_types.append((t.shape, t.dtype))
        captured = outer_reads(node)
        ins = [self.tensor(n) for n in (*node.input, *captured) if n]
        return self.g.add_node("opaque", ins, node.name, op_type=node.op_type,
                               domain=node.domain, opset=self._opset_of(node),
                               attrs=_attr_blobs(node), out_types=tuple(out_types),
                               empty_inputs=_empty_positions(node), captured=captured)

    def _probe_output_types(self, node) -> list[TensorType]:
        """Neither shape inference nor the model's own value_info types the outputs: run
        the node once on zeros to learn them."""
        captured = outer_reads(node)
        arrays = [self.consts[n] if n in self.consts else
                  np.zeros(self.types[n].shape, dtype=self.types[n].dtype)
                  for n in (*node.input, *captured) if n]
        outs = run_node(node.op_type, node.domain, self._opset_of(node), _attr_blobs(node),
                        tuple((a.shape, str(a.dtype)) for a in arrays), len(node.output), arrays,
                        _empty_positions(node), captured)
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

    def tensor(self, name: str) -> Tensor:
        """The graph tensor for an ONNX value; constants become weights on first use."""
        if name not in self.values:
            data = self.consts[name]
            t = self.g.new_weight(data.shape, data=data, name=_weight_name(self.g, name))
            self.values[name] = t
            self.types[name] = t.type
        return self.values[name]


def _weight_name(g: Graph, name: str) -> str:
    return name if name not in g._names else g._unique_name(name)


def _topological(nodes):
    """ONNX requires nodes in order, but not every producer obeys: sort, and name a
    cycle when there is one."""
    produced = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    order, state = [], [0] * len(nodes)  # 0 new, 1 on stack, 2 done
    for start in range(len(nodes)):
        if state[start]:
            continue
        stack = [(start, iter(nodes[start].input))]
        state[start] = 1
        while stack:
            idx, it = stack[-1]
            for name in it:
                dep = produced.get(name)
                if dep is None or state[dep] == 2:
                    continue
                if state[dep] == 1:
                    n = nodes[dep]
                    raise GraphError(f"ONNX graph has a cycle through node "
                                     f"{n.name or n.output[0]!r} ({n.op_type})")
                state[dep] = 1
                stack.append((dep, iter(nodes[dep].input)))
                break
            else:
                stack.pop()
                state[idx] = 2
                order.append(nodes[idx])
    return order


def _static_type(vi):
    from onnx import helper

    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if not tt.HasField("shape") or not tt.elem_type:
        return None
    dims = []
    for d in tt.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return TensorType(tuple(dims), str(helper.tensor_dtype_to_np_dtype(tt.elem_type)))


def _attr_value(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    return v


def _empty_positions(node) -> tuple[int, ...]:
    return tuple(i for i, n in enumerate(node.input) if not n)


def _attr_blobs(node) -> tuple[bytes, ...]:
    return tuple(a.SerializeToString(deterministic=True)
                 for a in sorted(node.attribute, key=lambda a: a.name))


def _constant_value(node, attrs) -> np.ndarray:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return numpy_helper.to_array(a.t)
        if a.name == "value_float":
            return np.array(a.f, dtype=np.float32)
        if a.name == "value_floats":
            return np.array(list(a.floats), dtype=np.float32)
        if a.name == "value_int":
            return np.array(a.i, dtype=np.int64)
        if a.name == "value_ints":
            return np.array(list(a.ints), dtype=np.int64)
    raise OnnxImportError(f"Constant node {node.name!r} has no supported value attribute")
