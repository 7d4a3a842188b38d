"""The opaque operator: any ONNX node the table does not cover, carried unchanged.

It keeps op type, domain, opset, attributes (as serialized AttributeProtos, so they
hash and compare) and its inferred output types. It runs through onnxruntime as a
one-node model, one cached session per configuration.

Control flow (Loop, If, Scan) may read tensors of the enclosing graph inside its
bodies without naming them as inputs. Those outer-scope reads (``captured``, by the
name the bodies use) are the node's last inputs here, so the graph orders and keeps
what they read; export points the bodies at the names the tensors get there, and the
one-node model declares them as graph inputs.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..errors import CannotRun, ExecutionError, first_line
from .versions import ir_version_for
from .base import OpSpec, Param, TensorType, register


def _opaque_infer(p, ins):
    return [TensorType(tuple(shape), dtype) for shape, dtype in p["out_types"]]


def _opaque_kernel(xp, p, *arrays):
    # np.asarray: float64 arithmetic on a 0-d array hands back a NumPy scalar
    host = [np.asarray(a) if xp is np else xp.asnumpy(a) for a in arrays]
    outs = run_node(p["op_type"], p["domain"], p["opset"], p["attrs"],
                    tuple((a.shape, str(a.dtype)) for a in host), len(p["out_types"]), host,
                    p["empty_inputs"], p["captured"])
    return [o if xp is np else xp.asarray(o) for o in outs]


def _opaque_export(ctx, p, in_types, ins, outs):
    import onnx

    explicit = len(ins) - len(p["captured"])
    bound = dict(zip(p["captured"], ins[explicit:]))
    node = onnx.helper.make_node(p["op_type"], with_gaps(ins[:explicit], p["empty_inputs"]), outs,
                                 domain=p["domain"] or None, name=ctx.fresh(p["op_type"]))
    for blob in p["attrs"]:
        attr = onnx.AttributeProto()
        attr.ParseFromString(blob)
        for body in _bodies(attr):
            _rename_outer_reads(body, bound)
        node.attribute.append(attr)
    ctx.raw_node(node, domain=p["domain"], opset=p["opset"])


register(OpSpec(
    name="opaque", inputs=(0, None),
    params=(Param("op_type", "symbol", ""), Param("domain", "symbol", ""), Param("opset", "int", 17),
            Param("attrs", "data", ()), Param("out_types", "data", ()), Param("empty_inputs", "data", ()),
            Param("captured", "data", ())),
    # In the e-graph: one key into the bridge's table of opaque nodes, its inputs a list;
    # the bridge gives its outputs their shapes.
    egraph_params=(Param("key", "symbol", ""),), multi_output=True, in_rules=False,
    infer=_opaque_infer, kernel=_opaque_kernel, export=_opaque_export,
    flops=lambda p, ins, outs: float(sum(t.size for t in ins) + sum(t.size for t in outs)),
    doc="An ONNX node outside the table, carried through untouched; a barrier to rewrites."))


def with_gaps(names, empty_positions):
    """Re-insert the '' placeholders of optional inputs left out in the middle."""
    names = list(names)
    for pos in sorted(empty_positions):
        names.insert(pos, "")
    return names


def outer_reads(node) -> tuple[str, ...]:
    """The names an ONNX node's bodies (graph attributes, nested ones too) read from
    the enclosing scopes, in order of first use."""
    reads: dict[str, None] = {}
    for attr in node.attribute:
        for body in _bodies(attr):
            reads.update(dict.fromkeys(_graph_outer_reads(body)))
    return tuple(reads)


def _bodies(attr):
    return [attr.g] if attr.HasField("g") else list(attr.graphs)


def _graph_outer_reads(graph) -> list[str]:
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    reads: dict[str, None] = {}
    for node in graph.node:
        inner = [n for n in node.input if n] + [n for a in node.attribute for b in _bodies(a)
                                                for n in _graph_outer_reads(b)]
        reads.update(dict.fromkeys(n for n in inner if n not in defined))
        defined.update(node.output)
    reads.update(dict.fromkeys(o.name for o in graph.output if o.name not in defined))
    return list(reads)


def _rename_outer_reads(graph, names: dict) -> None:
    """Point the reads of outer-scope tensors in ``graph`` (and the graphs inside it)
    at new names (in place); what the graph defines itself shadows them."""
    names = {k: v for k, v in names.items() if k not in {vi.name for vi in graph.input}
             | {t.name for t in graph.initializer}}
    for node in graph.node:
        for i, n in enumerate(node.input):
            if n in names:
                node.input[i] = names[n]
        for attr in node.attribute:
            for body in _bodies(attr):
                _rename_outer_reads(body, names)
        names = {k: v for k, v in names.items() if k not in node.output}
    for out in graph.output:
        if out.name in names:  # a body output that is an outer tensor itself
            out.name = names[out.name]


def _input_names(n_inputs: int, captured) -> list[str]:
    """The one-node model's graph inputs: ``in0``... for the node's own inputs, then the
    captured outer-scope tensors under the names the bodies read."""
    return [f"in{i}" for i in range(n_inputs - len(captured))] + list(captured)


def run_node(op_type, domain, opset, attrs, in_types, n_outputs, arrays, empty_inputs=(), captured=()):
    """Run one ONNX node (attributes as serialized protos) on NumPy arrays; the last
    ``len(captured)`` arrays are the outer-scope tensors its bodies read.

    The numerical check runs graphs in float64, but onnxruntime has no float64 kernel
    for many operators (Resize, LSTM, Erf inside opset-20 Gelu, ...): where building
    or running the node in float64 fails, it runs in float32 and its float outputs are
    widened back, so the check sees float32 round-off of this one node instead of a
    failure."""
    key = (op_type, domain, opset, attrs, tuple(in_types), n_outputs, tuple(empty_inputs), tuple(captured))
    wide = any(dt == "float64" for _, dt in in_types)
    if wide and key in _NO_FLOAT64:
        return _run_narrowed(key, arrays)
    try:
        return _run(key, arrays)
    except ExecutionError:
        if not wide:
            raise
        outs = _run_narrowed(key, arrays)  # raises the float32 error if that fails too
        _NO_FLOAT64.add(key)
        return outs


# Node configurations whose float64 version onnxruntime cannot build or run.
_NO_FLOAT64: set[tuple] = set()


def _run(key, arrays):
    op_type = key[0]
    session = _session(*key)
    feeds = dict(zip(_input_names(len(arrays), key[7]), arrays))
    try:
        return session.run(None, feeds)
    except Exception as e:  # onnxruntime raises its own exception types
        raise ExecutionError(f"opaque {op_type}: onnxruntime failed: {first_line(e)}") from None


def _run_narrowed(key, arrays):
    op_type, domain, opset, attrs, in_types, n_outputs, empty_inputs, captured = key
    narrow = tuple((shape, "float32" if dt == "float64" else dt) for shape, dt in in_types)
    outs = _run((op_type, domain, opset, attrs, narrow, n_outputs, empty_inputs, captured),
                [a.astype(np.float32) if a.dtype == np.float64 else a for a in arrays])
    return [o.astype(np.float64) if o.dtype == np.float32 else o for o in outs]


@lru_cache(maxsize=512)
def _session(op_type, domain, opset, attrs, in_types, n_outputs, empty_inputs, captured):
    import onnx
    import onnxruntime as ort
    from onnx import helper

    names = _input_names(len(in_types), captured)
    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape))
              for name, (shape, dt) in zip(names, in_types)]
    outputs = [helper.make_empty_tensor_value_info(f"out{i}") for i in range(n_outputs)]
    node = helper.make_node(op_type, with_gaps(names[:len(names) - len(captured)], empty_inputs),
                            [f"out{i}" for i in range(n_outputs)], domain=domain or None)
    for blob in attrs:
        attr = onnx.AttributeProto()
        attr.ParseFromString(blob)
        node.attribute.append(attr)
    opsets = [helper.make_opsetid("", opset if not domain else 17)]
    if domain:
        opsets.append(helper.make_opsetid(domain, opset))
    model = helper.make_model(helper.make_graph([node], op_type, inputs, outputs),
                              opset_imports=opsets,
                              ir_version=ir_version_for(opset if not domain else 17))
    options = ort.SessionOptions()
    options.log_severity_level = 4  # fatal only: a failed run raises, with its message, here
    options.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:
        raise CannotRun(f"opaque {op_type} (domain {domain or 'ai.onnx'}, opset {opset}): "
                        f"onnxruntime cannot build it: {first_line(e)}") from None
