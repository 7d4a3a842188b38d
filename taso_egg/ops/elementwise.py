"""Element-wise operators: ewadd, ewmul, ewsub, ewdiv (NumPy broadcasting), smul, relu,
sigmoid, tanh, erf."""

from __future__ import annotations

import math

from .base import (FLOAT_DTYPES, OpSpec, TensorType, broadcast_shapes, elementwise_flops,
                   fail, onnx_importer, register)
from .shapes import Case, In, broadcastable, eq, maximum, per_rank, rank, same_as, vec

ACTIVATIONS = ("NONE", "RELU", "SIGMOID", "TANH")
ACTIVATION_ONNX = {"RELU": "Relu", "SIGMOID": "Sigmoid", "TANH": "Tanh"}


def sigmoid(xp, x):
    # tanh form: no overflow warnings for large |x|
    return (xp.tanh(x * 0.5) + 1) * 0.5


def apply_activation(xp, y, act: str):
    if act == "NONE":
        return y
    if act == "RELU":
        return xp.maximum(y, 0)
    if act == "SIGMOID":
        return sigmoid(xp, y).astype(y.dtype, copy=False)
    if act == "TANH":
        return xp.tanh(y)
    raise ValueError(act)


def check_activation(op: str, act: str) -> None:
    if act not in ACTIVATIONS:
        fail(op, f"activation must be one of {ACTIVATIONS}, got {act!r}")


def export_with_activation(ctx, op_type: str, ins, out: str, act: str, **attrs) -> None:
    """Emit ``op_type`` and, when fused, its activation as a separate ONNX node."""
    if act == "NONE":
        ctx.node(op_type, ins, [out], **attrs)
    else:
        tmp = ctx.fresh(out + "_pre")
        ctx.node(op_type, ins, [tmp], **attrs)
        ctx.node(ACTIVATION_ONNX[act], [tmp], [out])


def _binary_infer(name):
    def infer(p, ins):
        a, b = ins
        if a.dtype != b.dtype:
            fail(name, "input dtypes differ", ins)
        return [TensorType(broadcast_shapes(name, ins), a.dtype)]

    return infer


def _broadcast_case(r: int) -> Case:
    # Equal ranks only: the bridge reshapes the lower-rank operand first.
    a, b = In(0), In(1)
    return Case(vec(*[maximum(a[i], b[i]) for i in range(r)]),
                when=(eq(rank(a), r), eq(rank(b), r)),
                requires=tuple(broadcastable(a[i], b[i]) for i in range(r)))


BROADCAST = per_rank(_broadcast_case)


def _node_export(onnx_type):
    """Export as one ONNX node of ``onnx_type`` on the same inputs."""
    def export(ctx, p, in_types, ins, outs):
        ctx.node(onnx_type, ins, outs)

    return export


register(OpSpec(
    name="ewadd", scaling="additive", inputs=(2, 2), params=(), infer=_binary_infer("ewadd"),
    shape=BROADCAST, commutative=True, broadcasts=True,
    kernel=lambda xp, p, a, b: [a + b], export=_node_export("Add"), flops=elementwise_flops,
    doc="Element-wise add with NumPy broadcasting."))

register(OpSpec(
    name="ewmul", scaling="multilinear", inputs=(2, 2), params=(), infer=_binary_infer("ewmul"),
    shape=BROADCAST, commutative=True, broadcasts=True,
    kernel=lambda xp, p, a, b: [a * b], export=_node_export("Mul"), flops=elementwise_flops,
    doc="Element-wise multiply with NumPy broadcasting."))


register(OpSpec(
    name="ewsub", scaling="additive", inputs=(2, 2), params=(), infer=_binary_infer("ewsub"),
    shape=BROADCAST, broadcasts=True,
    kernel=lambda xp, p, a, b: [a - b], export=_node_export("Sub"), flops=elementwise_flops,
    doc="Element-wise subtract with NumPy broadcasting."))

register(OpSpec(
    name="ewdiv", inputs=(2, 2), params=(), infer=_binary_infer("ewdiv"),
    shape=BROADCAST, broadcasts=True,
    kernel=lambda xp, p, a, b: [a / b], export=_node_export("Div"), flops=elementwise_flops,
    doc="Element-wise divide with NumPy broadcasting."))


def _smul_infer(p, ins):
    x, s = ins
    if s.shape != ():
        fail("smul", "the scalar operand must have shape ()", ins)
    if x.dtype != s.dtype:
        fail("smul", "input dtypes differ", ins)
    return [x]


register(OpSpec(
    name="smul", scaling="multilinear", inputs=(2, 2), params=(), infer=_smul_infer,
    shape=(Case(In(0), requires=(eq(rank(In(1)), 0),)),),
    kernel=lambda xp, p, x, s: [x * s], export=_node_export("Mul"), flops=elementwise_flops,
    doc="Scalar multiply: x times a 0-d tensor."))


def _unary(name, onnx_type, fn):
    return register(OpSpec(
        name=name, inputs=(1, 1), params=(), infer=lambda p, ins: [ins[0]], shape=same_as(0),
        activation=name.upper(),
        scaling="multilinear" if name == "relu" else "",  # relu(2^a x) = 2^a relu(x)
        kernel=lambda xp, p, x: [fn(xp, x)], export=_node_export(onnx_type), flops=elementwise_flops,
        doc=f"Element-wise {name}."))


_unary("relu", "Relu", lambda xp, x: xp.maximum(x, 0))
_unary("sigmoid", "Sigmoid", lambda xp, x: sigmoid(xp, x).astype(x.dtype, copy=False))
_unary("tanh", "Tanh", lambda xp, x: xp.tanh(x))


def erf(xp, x):
    """The error function on NumPy and CuPy alike (NumPy has none), in float64
    whatever x's dtype: a Taylor series below |x| = 4 (60 terms; error below 1e-10),
    the asymptotic series of erfc above."""
    v = x.astype(xp.float64)
    a = xp.abs(v)
    small = xp.minimum(a, 4.0)
    term, total, sq = small, small, small * small
    for n in range(1, 60):
        term = term * (-sq) / n
        total = total + term / (2 * n + 1)
    big = xp.maximum(a, 4.0)
    inv = 1 / (big * big)
    tail = xp.exp(-big * big) / (big * math.sqrt(math.pi)) * (
        1 - inv / 2 + 0.75 * inv * inv - 1.875 * inv ** 3 + 6.5625 * inv ** 4)
    out = xp.where(a < 4.0, total * (2 / math.sqrt(math.pi)), 1 - tail)
    return (xp.sign(v) * out).astype(x.dtype, copy=False)


register(OpSpec(
    name="erf", inputs=(1, 1), params=(), infer=lambda p, ins: [ins[0]], shape=same_as(0),
    kernel=lambda xp, p, x: [erf(xp, x)], export=_node_export("Erf"),
    flops=lambda p, ins, outs: 20.0 * outs[0].size,  # a polynomial, as runtimes evaluate it
    doc="Element-wise error function (GELU's exact form uses it)."))


# --- ONNX import -------------------------------------------------------------------

def _all_float(ctx, node) -> bool:
    return all(ctx.type(n).dtype in FLOAT_DTYPES for n in node.input)


@onnx_importer("Add", "Mul", "Sub", "Div")
def _import_binary(ctx, node, attrs):
    if len(node.input) != 2 or not _all_float(ctx, node):
        return None
    a, b = (ctx.tensor(n) for n in node.input)
    if node.op_type == "Add":
        return [ctx.g.add(a, b)]
    if node.op_type in ("Sub", "Div"):
        return ctx.g.add_node({"Sub": "ewsub", "Div": "ewdiv"}[node.op_type], (a, b))
    # A 0-d operand is TASO's scalar multiply; anything else broadcasts.
    if b.shape == () and a.shape != ():
        return [ctx.g.scalar_mul(a, b)]
    if a.shape == () and b.shape != ():
        return [ctx.g.scalar_mul(b, a)]
    return [ctx.g.mul(a, b)]


@onnx_importer("Relu", "Sigmoid", "Tanh", "Erf")
def _import_unary(ctx, node, attrs):
    if not _all_float(ctx, node):
        return None
    x = ctx.tensor(node.input[0])
    if node.op_type == "Erf":
        return ctx.g.add_node("erf", (x,))
    fn = {"Relu": ctx.g.relu, "Sigmoid": ctx.g.sigmoid, "Tanh": ctx.g.tanh}[node.op_type]
    return [fn(x)]
