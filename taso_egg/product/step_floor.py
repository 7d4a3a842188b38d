"""A decode step's floor: the model's weight products alone, on one token.

A decoder's step at batch 1 reads every weight once; its matrix products are the part no
rewrite removes. ``matmul_floor`` keeps only them: every MatMul or Gemm whose weight is
an initializer (directly, through a Transpose, as a tied head is, or through a
DequantizeLinear, whose precision stays), and every com.microsoft MatMulNBits (int4),
each fed a one-token activation of its own. Plain MatMuls that read the same activation
with weights of one depth are packed into one (q/k/v; gate/up), as a hand-built graph
packs them. What the floor leaves out (attention, norms, rotary, residuals, the
embedding's gather) is what a step spends beyond it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..errors import NotADecoder

# a stored weight as a product reads it (Identity: a weight of equal values deduplicated)
_WEIGHT_VIEWS = {("", "Transpose"), ("", "DequantizeLinear"), ("", "Identity")}


@dataclass(eq=False)  # each product is itself: compared by identity
class _Product:
    node: object          # the MatMul, Gemm or MatMulNBits
    made: list            # the nodes between its stored weight and it (a Transpose, a DequantizeLinear)
    stored: list          # the initializers it reads
    depth: int            # the activation's last dim
    dtype: np.dtype       # the activation's
    rank: int             # the activation's: 2 for a Gemm, else 3 (batch 1, one token)


def matmul_floor(path: str):
    """The floor of the model at ``path``, as a ModelProto, and its feeds."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(path)  # external data too: the floor holds the weights
    weights = {t.name: t for t in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    products = [p for node in model.graph.node if (p := _product(node, weights, producer)) is not None]
    if not products:
        raise NotADecoder(f"{path}: no matrix product with a stored weight, so no floor to time")

    packable: dict[tuple, list[_Product]] = defaultdict(list)
    for p in products:
        if p.node.op_type == "MatMul" and not p.made:
            packable[p.node.input[0], p.depth].append(p)
    nodes, initializers, outputs, made = [], {}, [], set()
    for p in products:
        group = packable.get((p.node.input[0], p.depth), [])
        if p in group and len(group) > 1:
            if p is group[0]:  # one product over the weights side by side
                name = f"{p.node.input[1]}.packed{len(group)}"
                stacked = np.concatenate([numpy_helper.to_array(q.stored[0]) for q in group], axis=1)
                initializers[name] = numpy_helper.from_array(stacked, name)
                nodes.append(helper.make_node("MatMul", [p.node.input[0], name], [name + ".out"]))
                outputs.append((name + ".out", p.dtype))
            continue
        for node in p.made + [p.node]:
            if node.output[0] not in made:  # a view two products read, once
                nodes.append(node)
                made.add(node.output[0])
        initializers.update((t.name, t) for t in p.stored)
        outputs.append((p.node.output[0], p.dtype))
    feeds, inputs = {}, []
    rng = np.random.default_rng(0)
    for p in products:
        name = p.node.input[0]
        if name not in feeds:
            shape = (1, p.depth) if p.rank == 2 else (1, 1, p.depth)
            feeds[name] = rng.standard_normal(shape).astype(p.dtype)
            inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(p.dtype), shape))
    graph = helper.make_graph(
        nodes, "matmul_floor", inputs,
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), None) for name, dtype in outputs],
        list(initializers.values()))
    return helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version), feeds


def _product(node, weights: dict, producer: dict) -> _Product | None:
    """``node`` as a product over a stored weight, or None where it is no such product."""
    from onnx import numpy_helper

    attributes = {a.name: a for a in node.attribute}
    if (node.domain, node.op_type) == ("com.microsoft", "MatMulNBits"):
        if not all(i in weights for i in node.input[1:] if i):
            return None
        scales = numpy_helper.to_array(weights[node.input[2]])
        return _Product(node, [], [weights[i] for i in node.input[1:] if i], attributes["K"].i, scales.dtype, 3)
    if (node.domain, node.op_type) not in {("", "MatMul"), ("", "Gemm")} or len(node.input) < 2:
        return None
    made, name = [], node.input[1]
    if name not in weights:
        view = producer.get(name)
        if view is None or (view.domain, view.op_type) not in _WEIGHT_VIEWS or \
                not all(i in weights for i in view.input if i):
            return None
        made, name = [view], view.input[0]
    stored = [weights[i] for n in made for i in n.input if i] or [weights[name]]
    dims = list(weights[name].dims)
    if len(dims) != 2:
        return None
    dtype = numpy_helper.to_array(weights[name]).dtype
    if made and made[0].op_type == "Transpose":
        perm = next((list(a.ints) for a in made[0].attribute if a.name == "perm"), [1, 0])
        dims = [dims[k] for k in perm]
    elif made and made[0].op_type == "DequantizeLinear":  # the activation has the scale's dtype
        dtype = numpy_helper.to_array(weights[made[0].input[1]]).dtype
    bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else ""
    if bias in weights:
        stored = stored + [weights[bias]]
    elif bias:  # a bias of equal values deduplicated: the Identity of one
        view = producer.get(bias)
        if view is None or view.op_type != "Identity" or view.input[0] not in weights:
            return None
        made, stored = [view] + made, stored + [weights[view.input[0]]]
    if node.op_type == "Gemm" and "transB" in attributes and attributes["transB"].i:
        dims = dims[::-1]
    return _Product(node, made, stored, int(dims[0]), dtype, 2 if node.op_type == "Gemm" else 3)
