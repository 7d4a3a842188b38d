"""What an ONNX graph's nodes and values say, read from protobuf: the nodes in
topological order, those an output reads, attribute values, a Constant node's value, a
value's static type."""

from __future__ import annotations

import numpy as np

from ..errors import GraphError, OnnxImportError
from ..ops import TensorType


def in_topological_order(nodes):
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


def needed_nodes(nodes, outputs) -> list:
    """``nodes`` (in topological order) less those no name of ``outputs`` reads, in
    their order: what onnxruntime would otherwise run for nothing."""
    needed, kept = set(outputs), []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            kept.append(n)
            needed |= set(n.input)
    return kept[::-1]


def static_type(vi):
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


def attr_value(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    return v


def empty_positions(node) -> tuple[int, ...]:
    return tuple(i for i, n in enumerate(node.input) if not n)


def attr_blobs(node) -> tuple[bytes, ...]:
    return tuple(a.SerializeToString(deterministic=True)
                 for a in sorted(node.attribute, key=lambda a: a.name))


def constant_value(node, attrs) -> np.ndarray:
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
