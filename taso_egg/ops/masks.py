"""Operators of attention masks: isnan, where, equal, logical_and, cast, expand, and
nan_to_zero.

Exporters write them around softmax (torch's SDPA zeroes fully masked rows with
``Where(IsNaN(p), 0, p)``) and on the path from an ``attention_mask`` input to the
additive mask. They take or give bool tensors, which the verifier's tensors (real
arrays) and the rule checker's stand-in data do not model, and a NaN test has no
algebra to state: they are kept out of rules (``in_rules=False``) and enter the
e-graph as plain operators whose outputs take their dtype from ``out_dtype``. The SDPA
guard as a whole, ``Where(IsNaN(p), 0, p)``, is float to float and element-wise: it
imports as ``nan_to_zero``, which rules may name (a part of a split moves through it).
"""

from __future__ import annotations

import numpy as np

from .base import (FLOAT_DTYPES, OpSpec, Param, TensorType, broadcast_shapes, check_dims, fail,
                   onnx_importer, register)
from .elementwise import BROADCAST
from .shapes import Case, In, P, broadcastable, eq, maximum, per_rank, rank, same_as, vec


def _isnan_infer(p, ins):
    if ins[0].dtype not in FLOAT_DTYPES:
        fail("isnan", "input must be a float tensor", ins)
    return [TensorType(ins[0].shape, "bool")]


register(OpSpec(
    name="isnan", inputs=(1, 1), params=(), infer=_isnan_infer, shape=same_as(0),
    out_dtype="bool", in_rules=False,
    kernel=lambda xp, p, x: [xp.isnan(x)], export=lambda ctx, p, t, ins, outs: ctx.node("IsNaN", ins, outs),
    flops=lambda p, ins, outs: float(outs[0].size),
    doc="Element-wise NaN test (bool output)."))


def _export_nan_to_zero(ctx, p, in_types, ins, outs):
    nan = ctx.fresh(outs[0] + "_isnan")
    ctx.node("IsNaN", ins, [nan])
    ctx.node("Where", [nan, ctx.constant(np.zeros((), in_types[0].dtype), "zero"), ins[0]], outs)


register(OpSpec(
    name="nan_to_zero", inputs=(1, 1), params=(), infer=lambda p, ins: [ins[0]], shape=same_as(0),
    kernel=lambda xp, p, x: [xp.where(xp.isnan(x), xp.zeros((), x.dtype), x)], export=_export_nan_to_zero,
    flops=lambda p, ins, outs: 2.0 * outs[0].size,
    doc="0 where x is NaN, x elsewhere: the guard torch's SDPA puts after softmax (Where(IsNaN(p), 0, p))."))


def _compare_infer(name, bool_inputs: bool):
    def infer(p, ins):
        a, b = ins
        if a.dtype != b.dtype or (bool_inputs and a.dtype != "bool"):
            fail(name, "inputs must share one dtype" + (" (bool)" if bool_inputs else ""), ins)
        return [TensorType(broadcast_shapes(name, ins), "bool")]

    return infer


register(OpSpec(
    name="equal", inputs=(2, 2), params=(), infer=_compare_infer("equal", False), shape=BROADCAST,
    commutative=True, broadcasts=True, out_dtype="bool", in_rules=False,
    kernel=lambda xp, p, a, b: [a == b], export=lambda ctx, p, t, ins, outs: ctx.node("Equal", ins, outs),
    flops=lambda p, ins, outs: float(outs[0].size),
    doc="Element-wise equality with NumPy broadcasting (bool output)."))

register(OpSpec(
    name="logical_and", inputs=(2, 2), params=(), infer=_compare_infer("logical_and", True),
    shape=BROADCAST, commutative=True, broadcasts=True, out_dtype="bool", in_rules=False,
    kernel=lambda xp, p, a, b: [xp.logical_and(a, b)],
    export=lambda ctx, p, t, ins, outs: ctx.node("And", ins, outs),
    flops=lambda p, ins, outs: float(outs[0].size),
    doc="Element-wise and of bool tensors with NumPy broadcasting."))


def _where_infer(p, ins):
    c, x, y = ins
    if c.dtype != "bool" or x.dtype != y.dtype:
        fail("where", "the condition must be bool and both branches of one dtype", ins)
    return [TensorType(broadcast_shapes("where", ins), x.dtype)]


def _where_case(r: int) -> Case:
    # Equal ranks only: the importer reshapes lower-rank operands first.
    c, x, y = In(0), In(1), In(2)
    return Case(vec(*[maximum(c[i], maximum(x[i], y[i])) for i in range(r)]),
                when=(eq(rank(c), r), eq(rank(x), r), eq(rank(y), r)),
                requires=tuple(broadcastable(a[i], b[i]) for i in range(r) for a, b in ((c, x), (c, y), (x, y))))


register(OpSpec(
    name="where", inputs=(3, 3), params=(), infer=_where_infer, shape=per_rank(_where_case),
    out_dtype="input:1", in_rules=False,
    kernel=lambda xp, p, c, x, y: [xp.where(c, x, y)],
    export=lambda ctx, p, t, ins, outs: ctx.node("Where", ins, outs),
    flops=lambda p, ins, outs: float(outs[0].size),
    doc="x where the condition holds, y elsewhere (NumPy broadcasting of all three)."))


def _cast_infer(p, ins):
    try:
        np.dtype(p["to"])
    except TypeError:
        fail("cast", f"unknown dtype {p['to']!r}", ins)
    return [TensorType(ins[0].shape, p["to"])]


def _cast_export(ctx, p, in_types, ins, outs):
    from onnx import helper

    ctx.node("Cast", ins, outs, to=helper.np_dtype_to_tensor_dtype(np.dtype(p["to"])))


register(OpSpec(
    name="cast", inputs=(1, 1), params=(Param("to", "dtype", "float32"),), infer=_cast_infer,
    shape=same_as(0), out_dtype="param:to", in_rules=False,
    kernel=lambda xp, p, x: [x.astype(p["to"])], export=_cast_export,
    flops=lambda p, ins, outs: float(outs[0].size),
    doc="Element-wise conversion to another dtype (a mask's int64 to bool)."))


def _expand_infer(p, ins):
    shape = check_dims("expand", p["shape"], "target shape")
    x = ins[0]
    if len(x.shape) != len(shape) or broadcast_shapes("expand", [x, TensorType(shape)]) != shape:
        fail("expand", f"cannot broadcast to {list(shape)} (the importer gives equal ranks)", ins)
    return [TensorType(shape, x.dtype)]


def _expand_case(r: int) -> Case:
    x, to = In(0), P("shape")
    return Case(to, when=(eq(rank(x), r), eq(rank(to), r)),
                requires=tuple(c for i in range(r) for c in (broadcastable(x[i], to[i]),
                                                             eq(maximum(x[i], to[i]), to[i]))))


register(OpSpec(
    name="expand", inputs=(1, 1), params=(Param("shape", "dims", ()),), infer=_expand_infer,
    shape=per_rank(_expand_case),
    kernel=lambda xp, p, x: [xp.broadcast_to(x, p["shape"]).copy()],
    export=lambda ctx, p, t, ins, outs: ctx.node("Expand", [ins[0], ctx.int64s(p["shape"], "shape")], outs),
    flops=lambda p, ins, outs: float(outs[0].size),
    doc="Broadcast to a static shape of the input's rank (ONNX Expand)."))


# --- ONNX import -------------------------------------------------------------------

def _at_rank(ctx, name, rank):
    """The tensor of ONNX value ``name``, reshaped to ``rank`` (ones prepended)."""
    t = ctx.tensor(name)
    return t if len(t.shape) == rank else ctx.g.reshape(t, (1,) * (rank - len(t.shape)) + t.shape)


@onnx_importer("IsNaN")
def _import_isnan(ctx, node, attrs):
    if ctx.type(node.input[0]).dtype not in FLOAT_DTYPES:
        return None
    return ctx.g.add_node("isnan", (ctx.tensor(node.input[0]),))


@onnx_importer("Equal", "And")
def _import_compare(ctx, node, attrs):
    types = [ctx.type(n) for n in node.input]
    if types[0].dtype != types[1].dtype or (node.op_type == "And" and types[0].dtype != "bool"):
        return None
    rank = max(len(t.shape) for t in types)
    op = "equal" if node.op_type == "Equal" else "logical_and"
    return ctx.g.add_node(op, [_at_rank(ctx, n, rank) for n in node.input])


@onnx_importer("Where")
def _import_where(ctx, node, attrs):
    types = [ctx.type(n) for n in node.input]
    if types[0].dtype != "bool" or types[1].dtype != types[2].dtype:
        return None
    guarded = _nan_guarded(ctx, node)
    if guarded is not None:
        if ctx.readers(node.input[0]) == [node] and node.input[0] not in {o.name for o in ctx.proto.graph.output}:
            ctx.g.nodes.pop(ctx.tensor(node.input[0]).node)  # the test, read by nothing else now
        return ctx.g.add_node("nan_to_zero", (guarded,))
    rank = max(len(t.shape) for t in types)
    return ctx.g.add_node("where", [_at_rank(ctx, n, rank) for n in node.input])


def _nan_guarded(ctx, node):
    """x, where ``node`` is Where(IsNaN(x), 0, x) with x of the output's shape."""
    cond, zero, x = node.input
    test = ctx.g.nodes[ctx.tensor(cond).node]
    value = ctx.const(zero)
    if (test.op != "isnan" or value is None or np.any(value != 0) or test.inputs[0] != ctx.tensor(x)
            or broadcast_shapes("where", [ctx.type(n) for n in node.input]) != ctx.type(x).shape):
        return None
    return ctx.tensor(x)


@onnx_importer("Cast")
def _import_cast(ctx, node, attrs):
    from onnx import helper

    to = str(helper.tensor_dtype_to_np_dtype(attrs["to"]))
    if to == ctx.type(node.input[0]).dtype:
        return [ctx.tensor(node.input[0])]  # a cast to its own dtype: the input
    return ctx.g.add_node("cast", (ctx.tensor(node.input[0]),), to=to)


@onnx_importer("Expand")
def _import_expand(ctx, node, attrs):
    target = ctx.const(node.input[1])
    if target is None:
        return None
    x_t = ctx.type(node.input[0])
    shape = broadcast_shapes("expand", [x_t, TensorType(tuple(int(d) for d in target))])
    x = _at_rank(ctx, node.input[0], len(shape))
    if x.shape == shape:
        return [x]  # broadcasting to its own shape: the input
    return ctx.g.add_node("expand", (x,), shape=shape)
