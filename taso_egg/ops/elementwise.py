"""Element-wise operators: ewadd, ewmul, ewsub, ewdiv (NumPy broadcasting), smul, relu,
relu6, sigmoid, tanh, erf, hardswish, gelu, pow (a constant exponent)."""

from __future__ import annotations

import math

import numpy as np

from .base import (FLOAT_DTYPES, OpSpec, Param, TensorType, broadcast_shapes, elementwise_flops,
                   fail, onnx_importer, register)
from .shapes import Case, In, broadcastable, eq, maximum, per_rank, rank, same_as, vec

ACTIVATIONS = ("NONE", "RELU", "SIGMOID", "TANH", "RELU6")
ACTIVATION_ONNX = {"RELU": "Relu", "SIGMOID": "Sigmoid", "TANH": "Tanh", "RELU6": "Clip"}


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
    if act == "RELU6":
        return xp.clip(y, 0, 6)
    raise ValueError(act)


def check_activation(op: str, act: str) -> None:
    if act not in ACTIVATIONS:
        fail(op, f"activation must be one of {ACTIVATIONS}, got {act!r}")


def export_activation(ctx, act: str, src: str, out: str, dtype: str) -> None:
    """Emit activation ``act`` of ``src`` as its ONNX node (RELU6: a Clip to [0, 6],
    whose bounds are inputs of ``dtype`` since opset 11)."""
    if act != "RELU6":
        ctx.node(ACTIVATION_ONNX[act], [src], [out])
    elif ctx.opsets[""] < 11:
        ctx.node("Clip", [src], [out], min=0.0, max=6.0)
    else:
        lo, hi = (ctx.constant(np.asarray(v, dtype=dtype), f"relu6_{v}") for v in (0, 6))
        ctx.node("Clip", [src, lo, hi], [out])


def export_with_activation(ctx, op_type: str, ins, out: str, act: str, dtype: str = "float32",
                           **attrs) -> None:
    """Emit ``op_type`` and, when fused, its activation as a separate ONNX node."""
    if act == "NONE":
        ctx.node(op_type, ins, [out], **attrs)
    else:
        tmp = ctx.fresh(out + "_pre")
        ctx.node(op_type, ins, [tmp], **attrs)
        export_activation(ctx, act, tmp, out, dtype)


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

register(OpSpec(
    name="relu6", inputs=(1, 1), params=(), infer=lambda p, ins: [ins[0]], shape=same_as(0),
    activation="RELU6", kernel=lambda xp, p, x: [xp.clip(x, 0, 6)],
    export=lambda ctx, p, in_types, ins, outs: export_activation(ctx, "RELU6", ins[0], outs[0],
                                                                 in_types[0].dtype),
    flops=elementwise_flops,
    doc="min(max(x, 0), 6): MobileNet's activation (ONNX Clip with bounds 0 and 6)."))
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


def hardswish(xp, x):
    """x * relu6(x + 3) / 6, as ONNX HardSwish (MobileNetV3's activation)."""
    return x * (xp.clip(x + 3, 0, 6) / 6)


register(OpSpec(
    name="hardswish", inputs=(1, 1), params=(), infer=lambda p, ins: [ins[0]], shape=same_as(0),
    kernel=lambda xp, p, x: [hardswish(xp, x).astype(x.dtype, copy=False)],
    export=_node_export("HardSwish"),
    flops=lambda p, ins, outs: 4.0 * outs[0].size,  # add, clip, divide, multiply
    doc="x * min(max(x + 3, 0), 6) / 6: MobileNetV3's activation (ONNX HardSwish, opset 14)."))


# --- gelu --------------------------------------------------------------------------

# GELU's constants as float32 holds them, which is how the exporters' formulas hold them
# (float32 weights; ax-gelu-erf and ax-gelu-tanh name these values): a gelu recognized
# from the formula then computes what the formula does in float64 too, where the check
# compares them (with sqrt 2 itself they differ by 1e-9 relative, past its floor). In
# float32 these are the constants themselves.
_SQRT_2 = float(np.float32(math.sqrt(2)))
_SQRT_2_OVER_PI = float(np.float32(math.sqrt(2 / math.pi)))
_TANH_CUBIC = float(np.float32(0.044715))


def _gelu_kernel(xp, p, x):
    if p["approximate"] == "tanh":
        return [0.5 * x * (1 + xp.tanh(_SQRT_2_OVER_PI * (x + _TANH_CUBIC * x * x * x)))]
    return [0.5 * x * (1 + erf(xp, x / _SQRT_2))]


def _gelu_infer(p, ins):
    if p["approximate"] not in ("none", "tanh"):
        fail("gelu", f"approximate must be 'none' or 'tanh', got {p['approximate']!r}", ins)
    if ins[0].dtype not in FLOAT_DTYPES:
        fail("gelu", "input must be a float tensor", ins)
    return [ins[0]]


def _gelu_export(ctx, p, in_types, ins, outs):
    """ONNX Gelu from opset 20; before, onnxruntime's contrib Gelu / FastGelu (its CPU
    kernels take float32 only), else the formula in standard operators."""
    dtype = in_types[0].dtype
    if ctx.opsets[""] >= 20:
        ctx.node("Gelu", ins, outs, approximate=p["approximate"])
    elif dtype == "float32":
        ctx.opsets.setdefault("com.microsoft", 1)
        ctx.node("FastGelu" if p["approximate"] == "tanh" else "Gelu", ins, outs,
                 domain="com.microsoft")
    else:
        c = lambda v, hint: ctx.constant(np.asarray(v, dtype=dtype), hint)  # noqa: E731
        x, half = ins[0], ctx.fresh(outs[0] + "_half")
        ctx.node("Mul", [x, c(0.5, "gelu_half")], [half])
        if p["approximate"] == "tanh":
            cube, inner, scaled, t = (ctx.fresh(outs[0] + s) for s in ("_cube", "_inner", "_scaled", "_t"))
            ctx.node("Pow", [x, c(3.0, "gelu_three")], [cube])
            ctx.node("Mul", [cube, c(_TANH_CUBIC, "gelu_k")], [inner + "_k"])
            ctx.node("Add", [x, inner + "_k"], [inner])
            ctx.node("Mul", [inner, c(_SQRT_2_OVER_PI, "gelu_s")], [scaled])
            ctx.node("Tanh", [scaled], [t])
        else:
            scaled, t = ctx.fresh(outs[0] + "_scaled"), ctx.fresh(outs[0] + "_erf")
            ctx.node("Div", [x, c(_SQRT_2, "gelu_sqrt2")], [scaled])
            ctx.node("Erf", [scaled], [t])
        one = ctx.fresh(outs[0] + "_one")
        ctx.node("Add", [t, c(1.0, "gelu_one")], [one])
        ctx.node("Mul", [half, one], outs)


register(OpSpec(
    name="gelu", inputs=(1, 1), params=(Param("approximate", "symbol", "none"),), infer=_gelu_infer,
    shape=same_as(0), kernel=_gelu_kernel, export=_gelu_export,
    flops=lambda p, ins, outs: 24.0 * outs[0].size,  # erf's polynomial and three more
    doc="x * (1 + erf(x / sqrt 2)) / 2, or with approximate='tanh' x * (1 + tanh(sqrt(2/pi) "
        "(x + 0.044715 x^3))) / 2 (ONNX Gelu, opset 20)."))


# --- pow with a constant exponent ----------------------------------------------------

register(OpSpec(
    name="pow", inputs=(1, 1), params=(Param("exponent", "float", 2.0),),
    infer=lambda p, ins: [ins[0]], shape=same_as(0),
    kernel=lambda xp, p, x: [x ** xp.asarray(p["exponent"], dtype=x.dtype)],
    export=lambda ctx, p, in_types, ins, outs: ctx.node(
        "Pow", [ins[0], ctx.constant(np.asarray(p["exponent"], dtype=in_types[0].dtype), "exponent")], outs),
    flops=elementwise_flops,
    doc="x ** exponent for a constant exponent (GELU-tanh's x^3; ONNX Pow)."))


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


@onnx_importer("Gelu")
def _import_gelu(ctx, node, attrs):
    if not _all_float(ctx, node) or attrs.get("approximate", "none") not in ("none", "tanh"):
        return None
    return ctx.g.add_node("gelu", (ctx.tensor(node.input[0]),), approximate=attrs.get("approximate", "none"))


@onnx_importer("HardSwish")
def _import_hardswish(ctx, node, attrs):
    if not _all_float(ctx, node):
        return None
    return ctx.g.add_node("hardswish", (ctx.tensor(node.input[0]),))


@onnx_importer("Clip")
def _import_clip(ctx, node, attrs):
    """Clip to [0, 6] is relu6, to [0, +inf) relu; other bounds stay opaque."""
    if ctx.type(node.input[0]).dtype not in FLOAT_DTYPES:
        return None
    if ctx.g.opset < 11:
        lo, hi = attrs.get("min", -math.inf), attrs.get("max", math.inf)
    else:
        bounds = [ctx.const(n) if n else None for n in list(node.input[1:3]) + [""] * (3 - len(node.input))]
        if any(b is None for b, n in zip(bounds, node.input[1:3]) if n):
            return None  # a bound computed at run time
        lo = -math.inf if bounds[0] is None else float(bounds[0])
        hi = math.inf if bounds[1] is None else float(bounds[1])
    x = ctx.tensor(node.input[0])
    if (lo, hi) == (0.0, 6.0):
        return ctx.g.add_node("relu6", (x,))
    if (lo, hi) == (0.0, math.inf):
        return [ctx.g.relu(x)]
    return None


@onnx_importer("Pow")
def _import_pow(ctx, node, attrs):
    e = ctx.const(node.input[1])
    if ctx.type(node.input[0]).dtype not in FLOAT_DTYPES or e is None or e.size != 1 or \
            ctx.type(node.input[1]).shape not in ((), (1,)) or e.ndim > len(ctx.type(node.input[0]).shape):
        return None
    return ctx.g.add_node("pow", (ctx.tensor(node.input[0]),), exponent=float(e.reshape(())))
