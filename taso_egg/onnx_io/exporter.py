"""Graph -> ONNX.

Operators whose inputs are all weights or constants are computed once here and
written as initializers (constant folding), so weight-only work is free at run time.
The model is checked with onnx.checker before it is returned; writing goes through
a temporary file so a failure never leaves a half-written model at the path.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import ExportError, TasoEggError
from ..executor import call_kernel
from ..disk.files import write_atomically
from ..graph import Graph, Node, claim_unique_name, node_digest, node_local_bytes
from ..ops import EWADD, EWMUL, INPUT, OPAQUE, OPS, WEIGHT
from ..ops.versions import ir_version_for
from .fed import FedModel, save_external, save_inline, stub
from .validate import checker_complaint


# Float constants of at least this many elements are fed, not copied (export_for_check).
FED_ELEMENTS = 1024
# A weight viewed for run time is written once with its views as operators only from
# this size; a smaller one is copied per view (_shared_views).
SHARED_VIEW_MIN_BYTES = 4096


def export_onnx(graph: Graph, path: str | os.PathLike | None = None, name: str = "taso_egg"):
    """Return the graph as an onnx.ModelProto; also write it to ``path`` if given.

    The model is checked (``onnx.checker``) before its large weights go in: the
    checker serializes what it is given, and with the weights that would be two more
    copies of them (VGG-19: 1.1 GB) for nothing it checks."""
    model = with_weights(*export_for_check(graph, name))
    if path is not None:
        save_atomically(model, path)
    return model


def export_fed(graph: Graph, name: str = "taso_egg", shapes_fixed: bool = True, folds: dict | None = None,
               tensor_names: dict | None = None):
    """The graph exported as ``export_onnx`` exports it, as a ``fed.FedModel``: its large
    float constants are stubs fed from the graph's own arrays and the values export
    folds, so candidates share the weights they share and none is copied into protobuf.
    ``shapes_fixed`` False: it is to be written with symbolic dims (``_vector_form``).
    ``folds``: values folded by earlier exports of graphs over the same weights (filled
    here), reused where a fold computes the same from the same arrays: the two sizes of
    a symbolic write fold one merged projection, not two. ``tensor_names`` as
    ``export_for_check`` fills it."""
    return fed_from_check(*export_for_check(graph, name, tensor_names, shapes_fixed=shapes_fixed, folds=folds))


def export_fed_named(graph: Graph, name: str = "taso_egg"):
    """``export_fed``'s model, and the tensor each of its run-time tensor names holds:
    ONNX name -> (graph node id, output index) (what maps a runtime profile back to the
    graph's nodes)."""
    names: dict = {}
    return export_fed(graph, name, tensor_names=names), names


def fed_from_check(model, arrays: dict):
    """An ``export_for_check`` pair made the exported model as a ``fed.FedModel``: its
    fed inputs become stub initializers (in place; nothing is copied)."""
    inputs = [vi for vi in model.graph.input if vi.name not in arrays]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(stub(n, a) for n, a in arrays.items())
    return FedModel(model, arrays)


def with_weights(model, fed: dict):
    """An ``export_for_check`` model made the exported model: its fed weights become
    initializers again (in place; the model is returned)."""
    from onnx import numpy_helper

    inputs = [vi for vi in model.graph.input if vi.name not in fed]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    model.graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in fed.items())
    return model


def export_for_check(graph: Graph, name: str = "taso_egg", tensor_names: dict | None = None,
                     shapes_fixed: bool = True, folds: dict | None = None):
    """``(model, weights)``: the graph exported as ``export_onnx`` exports it, before its
    large float initializers go in: they are graph inputs here, fed from ``weights``
    (name -> array: the graph's own weights and the values export folds, not copies).
    A run computes what the exported model computes, without a protobuf copy and an
    onnxruntime copy of every weight: the check of a 240 MB model holds 240 MB more,
    not a gigabyte. Checked with ``onnx.checker``. ``tensor_names``, when given, is
    filled with ONNX name -> (node id, output index) of every run-time tensor; ``folds``
    as ``export_fed`` takes it."""
    exporter = _Exporter(graph, shapes_fixed, folds)
    model = exporter.build(name)
    if tensor_names is not None:
        tensor_names.update({onnx_name: key for key, onnx_name in exporter.names.items()})
    # an opaque node's operator came from the input, which onnxruntime loaded
    complaint = checker_complaint(model, {n.params["op_type"] for n in graph.nodes.values() if n.op == OPAQUE.name})
    if complaint:
        raise ExportError(f"exported model fails onnx.checker: {complaint}")
    return model, exporter.fed


def save_atomically(model, path, external_data: bool = False) -> None:
    """Write to a temporary file beside ``path`` and rename: all or nothing.

    ``external_data`` keeps the weights in ``<name>.data`` beside the model, as the
    input had them (protobuf cannot write a model over 2 GB inline); the model's
    tensors then point to that file instead of holding their data. ``model`` is a
    ModelProto or a ``fed.FedModel``."""
    import onnx

    if not external_data:
        save = (lambda tmp: save_inline(model, tmp)) if isinstance(model, FedModel) else \
            (lambda tmp: onnx.save(model, tmp))
        write_atomically(path, save, ExportError)
        return
    data = f"{Path(path).name}.data"
    if isinstance(model, FedModel):  # the arrays streamed into the data file, never into protobuf
        write_atomically(path, lambda tmp: save_external(model, tmp, data), ExportError, companions=(data,))
        return
    write_atomically(path, lambda tmp: onnx.save(model, tmp, save_as_external_data=True,
                                                 all_tensors_to_one_file=True, location=data,
                                                 size_threshold=1024),
                     ExportError, companions=(data,))


def _vector_form(value: np.ndarray, key: tuple[int, int], readers: dict[tuple[int, int], list[Node]],
                 shapes_fixed: bool) -> np.ndarray:
    """A vector that element-wise multiplications and additions read, written 1-d as
    the exporters write it, without the leading 1s its other operands' ranks make
    redundant. The e-graph gives a lower-rank operand of an element-wise operator the
    output's rank (an RMSNorm's scale [512] becomes [1, 1, 512]); written so,
    onnxruntime's fusions pass it by: SimplifiedLayerNormalization wants a 1-d scale
    (five kernels a layer in place of one), and MatMulAddFusion a 1-d bias (a ViT's
    projections ran as MatMul and Add, the input's as one Gemm). Except a bias a GELU
    reads where shapes are symbolic: onnxruntime then makes no Gemm of it but fuses Add
    and Gelu into BiasGelu, which ran slower here than the two (BERT's result 1.061x
    against 1.077x, ConvNeXt-T's 1.002x against 1.014x, in one interleaved run). Only
    vectors: a larger constant may be a fused operator's operand in one candidate and
    a Mul's in another, and the two are then written alike (the guard times a
    candidate only if no other is node for node the same)."""
    lead = value.ndim - 1
    mine = readers.get(key, [])
    if not lead or not mine or any(d != 1 for d in value.shape[:lead]):
        return value
    for reader in mine:
        if reader.op not in (EWMUL.name, EWADD.name):
            return value
        if any(len(t.type.shape) < value.ndim for t in reader.inputs if (t.node, t.index) != key):
            return value
        if reader.op == EWADD.name and not shapes_fixed and _gelu_reads((reader.id, 0), readers):
            return value
    return value.reshape(value.shape[lead:])


def _gelu_reads(key: tuple[int, int], readers: dict[tuple[int, int], list[Node]]) -> bool:
    """Whether a GELU reads tensor ``key``: the operator, or its exact formula's
    division (or multiplication) that erf reads."""
    for reader in readers.get(key, []):
        if reader.op == "gelu" or any(r.op == "erf" for r in readers.get((reader.id, 0), [])):
            return True
    return False


class _Exporter:
    def __init__(self, graph: Graph, shapes_fixed: bool = True, folds: dict | None = None):
        self.g = graph
        self.shapes_fixed = shapes_fixed  # False: the model is written with symbolic dims
        self.folds = {} if folds is None else folds  # what a fold computes -> its values
        self.nodes = []
        self.initializers = []
        self.fed: dict[str, np.ndarray] = {}  # large float constants: graph inputs, fed
        self.opsets = {"": graph.opset}
        self._used_names: set[str] = set()
        self.names: dict[tuple[int, int], str] = {}
        self._read: set[str] = set()  # output names some node or the graph's output reads
        self._shared: dict = {}  # key -> names several nodes' exports compute once (``shared``)

    def read(self, name: str) -> bool:
        """Whether the output named ``name`` of the node being exported is read (an op
        exporter leaves out work for one nobody reads: a split's unused parts)."""
        return name in self._read

    # --- the context op exporters call ---------------------------------------------

    def fresh(self, hint: str) -> str:
        return claim_unique_name(hint, self._used_names)

    def node(self, op_type, inputs, outputs, **attrs) -> None:
        from onnx import helper

        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs),
                                           name=self.fresh(f"{op_type}_{len(self.nodes)}"), **attrs))

    def raw_node(self, node, domain: str = "", opset: int | None = None) -> None:
        if domain:
            self.opsets[domain] = opset
        self.nodes.append(node)

    def shared(self, key, make):
        """What ``make()`` returns (names of nodes it added), made once for every node
        whose export asks with ``key`` (attention's lengths, read from one cache's shape
        for every layer)."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def int64s(self, values, hint: str) -> str:
        return self.constant(np.asarray(values, dtype=np.int64), hint)

    def constant(self, array: np.ndarray, hint: str) -> str:
        from onnx import numpy_helper

        name = self.fresh(hint)
        array = np.asarray(array, order="C")
        if array.dtype.kind == "f" and array.size >= FED_ELEMENTS:
            self.fed[name] = array
        else:
            self.initializers.append(numpy_helper.from_array(array, name))
        return name

    # --- the walk ------------------------------------------------------------------

    def build(self, model_name: str):

        g = self.g
        order = g.topo_order()
        outputs = g.outputs
        if not outputs:
            raise ExportError("graph has no outputs to export")
        # Output and input names are the model's interface: claim them first.
        for n in g.inputs():
            self.names[(n.id, 0)] = self.fresh(n.params["name"])
        for name, t in outputs:
            if name in self._used_names and self.names.get((t.node, t.index)) != name:
                raise ExportError(f"output name {name!r} is also an input or another output")
            self._used_names.add(name)
        constant = self._fold_constants(order)
        out_names = {}
        for name, t in outputs:
            out_names.setdefault((t.node, t.index), name)
        read = {(t.node, t.index) for n in order for t in n.inputs} | {(t.node, t.index) for _, t in outputs}
        readers: dict[tuple[int, int], list[Node]] = {}
        for n in order:
            for t in n.inputs:
                readers.setdefault((t.node, t.index), []).append(n)
        for n in order:
            if n.op == INPUT.name:
                continue
            if n.id in constant:
                for i in range(len(n.outputs)):
                    if (n.id, i) in constant[n.id]:
                        hint = n.params.get("name") or f"const{n.id}_{i}"
                        value = constant[n.id][(n.id, i)]
                        if (n.id, i) not in out_names:
                            value = _vector_form(value, (n.id, i), readers, self.shapes_fixed)
                        self.names[(n.id, i)] = self.constant(value, hint)
                continue
            spec = OPS[n.op]
            if spec.export is None:
                raise ExportError(f"{n.label()}: {n.op} has no ONNX form unless its inputs are "
                                  f"all weights (then it is folded)")
            ins = [self.names[(t.node, t.index)] for t in n.inputs]
            outs = [out_names.get((n.id, i)) or self.fresh(f"t{n.id}_{i}") for i in range(len(n.outputs))]
            for i, o in enumerate(outs):
                self.names[(n.id, i)] = o
                if (n.id, i) in read:
                    self._read.add(o)
            try:
                spec.export(self, n.params, [t.type for t in n.inputs], ins, outs)
            except TasoEggError:
                raise
            except Exception as e:
                raise ExportError(f"{n.label()}: export failed: {e}") from e
        return self._model(outputs, model_name)

    def _fold_constants(self, order: list[Node]) -> dict[int, dict]:
        """Compute every weight-only value that a run-time node (or an output) needs;
        the layout views ``_shared_views`` names are left to run (not in the result)."""
        g = self.g
        weight_only = g.weight_only_nodes()
        folds = weight_only - self._shared_views(order, weight_only)
        needed = {(t.node, t.index) for n in order if n.id not in folds for t in n.inputs if t.node in folds}
        needed |= {(t.node, t.index) for _, t in g.outputs if t.node in folds}
        # only what the needed values are computed from (a view left to run may still
        # feed a fold), so no weight is copied for nothing
        required = {key[0] for key in needed}
        for n in reversed(order):
            if n.id in required:
                required.update(t.node for t in n.inputs)
        values: dict[tuple[int, int], np.ndarray] = {}
        computes: dict[int, bytes] = {}  # node -> what it computes: its structural digest over the arrays read
        for n in order:
            if n.id not in required:
                continue
            if n.op == WEIGHT.name:
                outs = [g.weight_array(n)]
                a = outs[0]
                computes[n.id] = repr((a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str)).encode()
            else:
                computes[n.id] = node_digest(node_local_bytes(n), n.inputs, computes.__getitem__)
                outs = self.folds.get(computes[n.id])
                if outs is None:
                    outs = self.folds[computes[n.id]] = \
                        call_kernel(np, n, [values[(t.node, t.index)] for t in n.inputs])
            for i, v in enumerate(outs):
                values[(n.id, i)] = v
        folded: dict[int, dict] = {nid: {} for nid in folds}
        for key in needed:
            folded[key[0]][key] = values[key]
        return folded

    def _shared_views(self, order: list[Node], weight_only: set[int]) -> set[int]:
        """Weight-only layout views (transpose, reshape, split) written as operators on
        the weight they view instead of folded into a copy of it, where that weight is
        written anyway (read at run time, or viewed for run time more than once): a
        tied weight (GPT-2's LM head reads the token embedding transposed) is then
        written once; onnxruntime folds the view when it loads the model. A weight of
        fewer than ``SHARED_VIEW_MIN_BYTES`` is copied instead: a copy costs nothing, and
        a runtime's fusions match constants, not views of them (a 1.0 shared by a rotary
        embedding and an RMSNorm's reciprocal, written as a Reshape of it, kept
        onnxruntime from fusing the norm: five kernels a layer in place of one)."""
        g = self.g
        view = lambda nid: nid in weight_only and OPS[g.nodes[nid].op].is_view  # noqa: E731
        runtime_reads = [(t.node, t.index) for n in order if n.id not in weight_only for t in n.inputs]
        runtime_reads += [(t.node, t.index) for _, t in g.outputs]
        chains: dict[tuple[int, int], list[set[int]]] = {}  # a viewed tensor -> the chains of views on it
        for key in dict.fromkeys(runtime_reads):
            chain = set()
            while view(key[0]):
                chain.add(key[0])
                src = g.nodes[key[0]].inputs[0]
                key = (src.node, src.index)
            if chain and key[0] in weight_only and self._nbytes(key) >= SHARED_VIEW_MIN_BYTES:
                chains.setdefault(key, []).append(chain)
        read = set(runtime_reads)
        return {nid for key, found in chains.items() if key in read or len(found) > 1
                for chain in found for nid in chain}

    def _nbytes(self, key: tuple[int, int]) -> int:
        t = self.g.nodes[key[0]].outputs[key[1]]
        return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize

    def _model(self, outputs, model_name):
        from onnx import helper

        g = self.g
        vi = lambda name, t: helper.make_tensor_value_info(  # noqa: E731
            name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), list(t.shape))
        inputs = [vi(self.names[(n.id, 0)], n.outputs[0]) for n in g.inputs()]
        inputs += [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
                   for name, a in self.fed.items()]
        outs = []
        for name, t in outputs:
            src = self.names[(t.node, t.index)]
            if src != name:  # an output that is an input or shares a tensor: alias it
                self.node("Identity", [src], [name])
            outs.append(vi(name, t.type))
        graph = helper.make_graph(self.nodes, model_name, inputs, outs, self.initializers)
        opsets = [helper.make_opsetid(d, v) for d, v in sorted(self.opsets.items())]
        ir = max(ir_version_for(g.opset), g.ir_version)
        return helper.make_model(graph, opset_imports=opsets, ir_version=min(ir, 10),
                                 producer_name="taso-egg")
