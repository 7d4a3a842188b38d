"""Normalizing operators: batchnorm (and the factor and shift it folds into),
softmax, layernorm."""

from __future__ import annotations

import numpy as np

from ..errors import ExportError
from .base import FLOAT_DTYPES, OpSpec, Param, fail, onnx_importer, register
from .nn import float_input
from .shapes import Case, In, P, eq, ge, gt, rank, vec


# --- batchnorm ---------------------------------------------------------------------

def _bn_infer(p, ins):
    x = ins[0]
    if len(x.shape) < 2:
        fail("batchnorm", "input needs a channel axis (rank >= 2)", ins)
    c = x.shape[1]
    for t in ins[1:]:
        if t.shape != (c,):
            fail("batchnorm", f"scale, bias, mean and var must have shape ({c},)", ins)
    return [x]


_EPSILON = Param("epsilon", "float", 1e-5)


def _bn_kernel(xp, p, x, scale, bias, mean, var):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / xp.sqrt(var + p["epsilon"])
    return [(x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)]


register(OpSpec(
    name="batchnorm", inputs=(5, 5), params=(_EPSILON,), infer=_bn_infer,
    shape=(Case(In(0), requires=(ge(rank(In(0)), 2),) + tuple(eq(In(i), vec(In(0)[1])) for i in range(1, 5))),),
    kernel=_bn_kernel, positive_inputs=(4,),
    export=lambda ctx, p, in_types, ins, outs: ctx.node(
        "BatchNormalization", ins, outs, epsilon=float(p["epsilon"])),
    flops=lambda p, ins, outs: 2.0 * outs[0].size,
    doc="Inference batch normalization over axis 1 (x, scale, bias, mean, var)."))


# Batchnorm folded into a conv (TASO's conv+bn rule) needs the per-channel factor and
# shift as tensors. Their inputs are weights, so export folds them to constants.

def _per_channel_infer(op):
    def infer(p, ins):
        if len(ins[0].shape) != 1 or any(t.shape != ins[0].shape for t in ins):
            fail(op, "inputs must be vectors of one length (per channel)", ins)
        return [ins[0]]
    return infer


def _per_channel_shape(n_inputs: int) -> tuple[Case, ...]:
    return (Case(In(0), requires=(eq(rank(In(0)), 1),) + tuple(eq(In(i), In(0)) for i in range(1, n_inputs))),)


def _bn_factor(xp, eps, scale, var):
    return scale / xp.sqrt(var + xp.asarray(eps, dtype=var.dtype))


def _export_bn_factor(ctx, p, dtype, scale, var, out):
    eps = ctx.constant(np.asarray(p["epsilon"], dtype=dtype), "epsilon")
    shifted, root = ctx.fresh(out + "_var_eps"), ctx.fresh(out + "_std")
    ctx.node("Add", [var, eps], [shifted])
    ctx.node("Sqrt", [shifted], [root])
    ctx.node("Div", [scale, root], [out])


def _export_bn_shift(ctx, p, in_types, ins, outs):
    scale, bias, mean, var = ins
    factor, moved = ctx.fresh(outs[0] + "_factor"), ctx.fresh(outs[0] + "_moved")
    _export_bn_factor(ctx, p, in_types[0].dtype, scale, var, factor)
    ctx.node("Mul", [mean, factor], [moved])
    ctx.node("Sub", [bias, moved], [outs[0]])


register(OpSpec(
    name="bn_factor", inputs=(2, 2), params=(_EPSILON,), infer=_per_channel_infer("bn_factor"),
    shape=_per_channel_shape(2),
    positive_inputs=(1,),
    kernel=lambda xp, p, scale, var: [_bn_factor(xp, p["epsilon"], scale, var)],
    export=lambda ctx, p, in_types, ins, outs: _export_bn_factor(ctx, p, in_types[0].dtype, ins[0], ins[1],
                                                                  outs[0]),
    flops=lambda p, ins, outs: 3.0 * outs[0].size,
    doc="scale / sqrt(var + epsilon): batchnorm's per-channel multiplier."))

register(OpSpec(
    name="bn_shift", inputs=(4, 4), params=(_EPSILON,), infer=_per_channel_infer("bn_shift"),
    shape=_per_channel_shape(4),
    positive_inputs=(3,),
    kernel=lambda xp, p, scale, bias, mean, var: [bias - mean * _bn_factor(xp, p["epsilon"], scale, var)],
    export=_export_bn_shift,
    flops=lambda p, ins, outs: 5.0 * outs[0].size,
    doc="bias - mean * scale / sqrt(var + epsilon): batchnorm's per-channel offset."))


# --- softmax -----------------------------------------------------------------------

def _softmax_infer(p, ins):
    (x,) = ins
    if not 0 <= p["axis"] < len(x.shape):
        fail("softmax", f"axis {p['axis']} out of range for rank {len(x.shape)} (the builder "
                        f"makes axes non-negative)", ins)
    if x.dtype not in FLOAT_DTYPES:
        fail("softmax", "input must be a float tensor", ins)
    return [x]


def _softmax_kernel(xp, p, x):
    # shifted by the max along the axis, so exp never overflows
    e = xp.exp(x - x.max(axis=p["axis"], keepdims=True))
    return [e / e.sum(axis=p["axis"], keepdims=True)]


def _softmax_export(ctx, p, in_types, ins, outs):
    if ctx.opsets[""] < 13 and p["axis"] != len(in_types[0].shape) - 1:
        raise ExportError(f"softmax over axis {p['axis']} of a rank-{len(in_types[0].shape)} tensor "
                          f"needs opset 13 or later (the graph has opset {ctx.opsets['']})")
    ctx.node("Softmax", ins, outs, axis=p["axis"])


register(OpSpec(
    name="softmax", inputs=(1, 1), params=(Param("axis", "int", 0),), infer=_softmax_infer,
    shape=(Case(In(0), requires=(ge(P("axis"), 0), gt(rank(In(0)), P("axis")))),),
    kernel=_softmax_kernel, export=_softmax_export,
    flops=lambda p, ins, outs: 5.0 * outs[0].size,  # max, subtract, exp, sum, divide
    doc="exp(x) / sum(exp(x)) along a non-negative axis (ONNX Softmax, opset 13)."))


# --- layer normalization -----------------------------------------------------------

def _layernorm_infer(p, ins):
    x, scale, bias = ins
    if not x.shape:
        fail("layernorm", "input needs at least one axis", ins)
    if scale.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        fail("layernorm", f"scale and bias must have shape ({x.shape[-1]},): the last axis", ins)
    if len({t.dtype for t in ins}) > 1 or x.dtype not in FLOAT_DTYPES:
        fail("layernorm", "input, scale and bias must be floats of one dtype", ins)
    return [x]


def _layernorm_kernel(xp, p, x, scale, bias):
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return [centred / xp.sqrt(var + xp.asarray(p["epsilon"], dtype=x.dtype)) * scale + bias]


def _layernorm_export(ctx, p, in_types, ins, outs):
    if ctx.opsets[""] < 17:
        raise ExportError(f"layernorm needs opset 17 or later (the graph has opset {ctx.opsets['']})")
    ctx.node("LayerNormalization", ins, outs, axis=-1, epsilon=float(p["epsilon"]))


_LAST = rank(In(0)) - 1
register(OpSpec(
    name="layernorm", inputs=(3, 3), params=(_EPSILON,), infer=_layernorm_infer,
    shape=(Case(In(0), requires=(gt(rank(In(0)), 0), eq(In(1), vec(In(0)[_LAST])), eq(In(2), vec(In(0)[_LAST])))),),
    kernel=_layernorm_kernel, export=_layernorm_export,
    flops=lambda p, ins, outs: 8.0 * outs[0].size,  # mean, centre, square, mean, scale, shift
    doc="Layer normalization over the last axis: (x - mean) / sqrt(var + epsilon) * scale + bias "
        "(ONNX LayerNormalization, opset 17, axis -1)."))


# --- ONNX import -------------------------------------------------------------------

@onnx_importer("BatchNormalization")
def _import_bn(ctx, node, attrs):
    if attrs.get("training_mode", 0) or len(node.output) != 1 or not float_input(ctx, node):
        return None
    x, scale, bias, mean, var = (ctx.tensor(n) for n in node.input)
    return [ctx.g.batchnorm(x, scale, bias, mean, var, epsilon=float(attrs.get("epsilon", 1e-5)))]


@onnx_importer("Softmax")
def _import_softmax(ctx, node, attrs):
    x = ctx.tensor(node.input[0])
    if ctx.g.opset < 13 or x.dtype not in FLOAT_DTYPES or not x.shape:
        return None  # opset < 13 flattens to 2-D first: another operator
    axis = int(attrs.get("axis", -1)) % len(x.shape)
    return [ctx.g.add_node("softmax", [x], axis=axis)[0]]


@onnx_importer("LayerNormalization")
def _import_layernorm(ctx, node, attrs):
    x_t = ctx.type(node.input[0])
    rank = len(x_t.shape)
    if (len([o for o in node.output if o]) != 1 or not rank or int(attrs.get("axis", -1)) % rank != rank - 1
            or not float_input(ctx, node) or len(ctx.type(node.input[1]).shape) != 1):
        return None  # the mean/inverse-deviation outputs, or more than the last axis: opaque
    x, scale = ctx.tensor(node.input[0]), ctx.tensor(node.input[1])
    if len(node.input) > 2 and node.input[2]:
        bias = ctx.tensor(node.input[2])
    else:
        bias = ctx.g.new_weight(scale.shape, data=np.zeros(scale.shape, dtype=scale.dtype))
    return ctx.g.add_node("layernorm", (x, scale, bias), epsilon=float(attrs.get("epsilon", 1e-5)))
