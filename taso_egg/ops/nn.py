"""Compute-heavy operators: conv2d, matmul, pooling (the normalizing ones are in
``normalization``).

Padding is "SAME" (TensorFlow's rule, as TASO uses), "VALID", or explicit
(top, left, bottom, right). Convolution runs as im2col + one batched matmul, which
covers grouped and depth-wise convolutions with the same code on NumPy and CuPy.
"""

from __future__ import annotations

from .base import (FLOAT_DTYPES, OpSpec, Param, TensorType, broadcast_shapes, fail, onnx_importer,
                   register)
from .shapes import Case, In, P, eq, ge, gt, pad, pad_explicit, pad_same, rank, vec
from .elementwise import apply_activation, check_activation, export_with_activation

Pads = tuple[int, int, int, int]


def same_pads(size: int, k: int, s: int) -> tuple[int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


def resolve_pads(op: str, padding, hw, khw, strides) -> Pads:
    if padding == "VALID":
        return (0, 0, 0, 0)
    if padding == "SAME":
        (t, b), (l, r) = (same_pads(hw[i], khw[i], strides[i]) for i in range(2))
        return (t, l, b, r)
    if isinstance(padding, tuple) and len(padding) == 4 and all(
            isinstance(v, int) and v >= 0 for v in padding):
        return padding
    fail(op, f"padding must be 'SAME', 'VALID' or four non-negative ints "
             f"(top, left, bottom, right), got {padding!r}")


def window_output(op, hw, khw, strides, pads, types) -> tuple[int, int]:
    if any(s <= 0 for s in strides):
        fail(op, f"strides must be positive, got {list(strides)}", types)
    oh = (hw[0] + pads[0] + pads[2] - khw[0]) // strides[0] + 1
    ow = (hw[1] + pads[1] + pads[3] - khw[1]) // strides[1] + 1
    if oh <= 0 or ow <= 0 or khw[0] <= 0 or khw[1] <= 0:
        fail(op, f"kernel {list(khw)} does not fit the padded input {list(hw)} "
                 f"(pads {list(pads)})", types)
    return oh, ow


def windows(xp, x, khw, strides, pads, out_hw, pad_value=0.0):
    """(N, C, H, W) -> (N, C, kh, kw, oh, ow): every kernel tap as a strided slice,
    so the same code runs on NumPy and CuPy."""
    t, l, b, r = pads
    if any(pads):  # by hand: xp.pad costs several times the copy for these small tensors
        n, c, h, w = x.shape
        padded = xp.full((n, c, t + h + b, l + w + r), pad_value, dtype=x.dtype)
        padded[:, :, t:t + h, l:l + w] = x
        x = padded
    n, c = x.shape[:2]
    (kh, kw), (sh, sw), (oh, ow) = khw, strides, out_hw
    cols = xp.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = x[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
    return cols


def _pads_for(p, in_type, khw):
    return resolve_pads("", p["padding"], in_type.shape[2:], khw, p["strides"])


# --- conv2d ------------------------------------------------------------------------

CONV_PARAMS = (Param("strides", "ints", (1, 1)), Param("padding", "padding", "SAME"),
               Param("activation", "activation", "NONE"))


def window_shapes(kernel_hw, channels, extra=()) -> tuple[Case, ...]:
    """Output shapes of a sliding window over NCHW input 0 (conv and pooling), for SAME
    and explicit padding: ``kernel_hw`` and ``channels`` are expressions, ``extra`` more
    requirements."""
    x, kh, kw = In(0), kernel_hw[0], kernel_hw[1]
    sh, sw, pads = P("strides")[0], P("strides")[1], P("padding")
    same = vec(x[0], channels, (x[2] + (sh - 1)) // sh, (x[3] + (sw - 1)) // sw)
    explicit = vec(x[0], channels, (x[2] + (pad(pads, 0) + pad(pads, 2)) - kh) // sh + 1,
                   (x[3] + (pad(pads, 1) + pad(pads, 3)) - kw) // sw + 1)
    fits = (ge(x[2] + (pad(pads, 0) + pad(pads, 2)), kh), ge(x[3] + (pad(pads, 1) + pad(pads, 3)), kw))
    valid = (eq(rank(x), 4),) + tuple(extra)
    return (Case(same, when=(pad_same(pads),), requires=valid),
            Case(explicit, when=(pad_explicit(pads),), requires=valid + fits))


def _conv_shapes(summand: bool = False) -> tuple[Case, ...]:
    x, w = In(0), In(1)
    groups = x[1] // w[1]
    extra = (eq(rank(w), 4), gt(w[1], 0), eq(x[1] % w[1], 0), eq(w[0] % groups, 0))
    cases = window_shapes((w[2], w[3]), w[0], extra)
    if summand:  # the added tensor has the conv's output shape
        cases = tuple(Case(c.out, c.when, c.requires + (eq(In(2), c.out),)) for c in cases)
    return cases


def _conv_infer(p, ins):
    x, w = ins[0], ins[1]
    if len(x.shape) != 4 or len(w.shape) != 4:
        fail("conv2d", "input must be NCHW and weight OIHW (rank 4)", ins)
    if x.dtype != w.dtype:
        fail("conv2d", "input and weight dtypes differ", ins)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if cg <= 0 or c % cg:
        fail("conv2d", f"input channels {c} are not a multiple of weight in-channels {cg}", ins)
    groups = c // cg
    if o % groups:
        fail("conv2d", f"out channels {o} not divisible by groups {groups}", ins)
    check_activation("conv2d", p["activation"])
    pads = resolve_pads("conv2d", p["padding"], (h, wd), (kh, kw), p["strides"])
    oh, ow = window_output("conv2d", (h, wd), (kh, kw), p["strides"], pads, ins)
    if len(ins) == 3 and ins[2].shape != (o,):
        fail("conv2d", f"bias must have shape ({o},)", ins)
    return [TensorType((n, o, oh, ow), x.dtype)]


def _conv_kernel(xp, p, x, w, bias=None):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    groups = c // cg
    pads = resolve_pads("conv2d", p["padding"], (h, wd), (kh, kw), p["strides"])
    oh, ow = window_output("conv2d", (h, wd), (kh, kw), p["strides"], pads, ())
    if (kh, kw, *p["strides"]) == (1, 1, 1, 1) and not any(pads):
        cols = x.reshape(n, groups, cg, h * wd)
    else:
        cols = windows(xp, x, (kh, kw), p["strides"], pads, (oh, ow))
        cols = cols.reshape(n, groups, cg * kh * kw, oh * ow)
    wm = w.reshape(groups, o // groups, cg * kh * kw)
    y = xp.matmul(wm[None], cols).reshape(n, o, oh, ow)
    if bias is not None:
        y = y + bias.reshape(1, o, 1, 1)
    return [apply_activation(xp, y, p["activation"])]


def _conv_flops(p, ins, outs):
    o, cg, kh, kw = ins[1].shape
    return 2.0 * outs[0].size * cg * kh * kw


def _conv_export(ctx, p, in_types, ins, outs):
    x, w = in_types[0], in_types[1]
    khw = w.shape[2:]
    t, l, b, r = _pads_for(p, x, khw)
    export_with_activation(ctx, "Conv", ins, outs[0], p["activation"], x.dtype,
                           strides=list(p["strides"]), pads=[t, l, b, r],
                           kernel_shape=list(khw), group=x.shape[1] // w.shape[1])


register(OpSpec(
    name="conv2d", scaling="multilinear", inputs=(2, 3), params=CONV_PARAMS, infer=_conv_infer,
    shape=_conv_shapes(),
    kernel=_conv_kernel, export=_conv_export, flops=_conv_flops,
    doc="2-D convolution, NCHW x OIHW; groups = in_channels / weight.shape[1]; optional bias."))


# --- conv2d_sum: a conv that adds a residual tensor before its activation ------------
# What cuDNN's conv-bias-add-activation and onnxruntime's fused NCHWc Conv with a Sum
# input compute in one kernel: the add costs next to nothing there, so the cost model
# must see it as one operator to price a residual block right. It exports as the
# standard Conv, Add and activation, which those runtimes fuse again.

def _conv_sum_infer(p, ins):
    out = _conv_infer(p, ins[:2])
    if ins[2] != out[0]:
        fail("conv2d_sum", f"the added tensor must have the conv's output type {out[0]}", ins)
    return out


def _conv_sum_kernel(xp, p, x, w, z):
    y = _conv_kernel(xp, {**p, "activation": "NONE"}, x, w)[0] + z
    return [apply_activation(xp, y, p["activation"])]


def _conv_sum_export(ctx, p, in_types, ins, outs):
    conv = ctx.fresh(outs[0] + "_conv")
    _conv_export(ctx, {**p, "activation": "NONE"}, in_types[:2], ins[:2], [conv])
    export_with_activation(ctx, "Add", [conv, ins[2]], outs[0], p["activation"], in_types[2].dtype)


register(OpSpec(
    name="conv2d_sum", inputs=(3, 3), params=CONV_PARAMS, infer=_conv_sum_infer,
    shape=_conv_shapes(summand=True),
    kernel=_conv_sum_kernel, export=_conv_sum_export,
    flops=lambda p, ins, outs: _conv_flops(p, ins, outs) + outs[0].size,
    doc="activation(conv2d(x, w) + z): a convolution fused with a residual add (z has the "
        "conv's output shape), as cuDNN and onnxruntime run it."))


# --- matmul ------------------------------------------------------------------------

def _matmul_infer(p, ins):
    a, b = ins
    if len(a.shape) < 2 or len(b.shape) < 2:
        fail("matmul", "both operands need rank >= 2", ins)
    if a.dtype != b.dtype:
        fail("matmul", "operand dtypes differ", ins)
    if a.shape[-1] != b.shape[-2]:
        fail("matmul", f"inner dimensions differ ({a.shape[-1]} vs {b.shape[-2]})", ins)
    check_activation("matmul", p["activation"])
    batch = broadcast_shapes("matmul", [TensorType(a.shape[:-2]), TensorType(b.shape[:-2])])
    return [TensorType(batch + (a.shape[-2], b.shape[-1]), a.dtype)]


def _matmul_shapes() -> tuple[Case, ...]:
    # Equal ranks with equal batch dims, or a 2-D right operand (x @ W); the e-graph
    # holds no other batched form.
    a, b, r = In(0), In(1), rank(In(0))
    return (Case(a.set(r - 1, b[r - 1]), when=(eq(r, rank(b)), ge(r, 2), eq(a.pop().pop(), b.pop().pop())),
                 requires=(eq(a[r - 1], b[r - 2]),)),
            Case(a.set(r - 1, b[1]), when=(gt(r, 2), eq(rank(b), 2)), requires=(eq(a[r - 1], b[0]),)))


_MATMUL_SHAPES = _matmul_shapes()


def _matmul_export(ctx, p, in_types, ins, outs):
    export_with_activation(ctx, "MatMul", ins, outs[0], p["activation"], in_types[0].dtype)


register(OpSpec(
    name="matmul", scaling="multilinear", inputs=(2, 2), params=(Param("activation", "activation", "NONE"),),
    infer=_matmul_infer, shape=_MATMUL_SHAPES,
    kernel=lambda xp, p, a, b: [apply_activation(xp, xp.matmul(a, b), p["activation"])],
    export=_matmul_export,
    flops=lambda p, ins, outs: 2.0 * outs[0].size * ins[0].shape[-1],
    doc="Matrix multiply, 2-D or batched (batch dims broadcast), with fused activation."))


# --- pooling -----------------------------------------------------------------------

POOL_PARAMS = (Param("kernel", "dims", (2, 2)), Param("strides", "ints", (2, 2)),
               Param("padding", "padding", "VALID"), Param("activation", "activation", "NONE"))
_POOL_SHAPES = window_shapes((P("kernel")[0], P("kernel")[1]), In(0)[1])


def _pool_infer(name):
    def infer(p, ins):
        (x,) = ins
        if len(x.shape) != 4:
            fail(name, "input must be NCHW (rank 4)", ins)
        check_activation(name, p["activation"])
        pads = resolve_pads(name, p["padding"], x.shape[2:], p["kernel"], p["strides"])
        if pads[0] >= p["kernel"][0] or pads[1] >= p["kernel"][1] or pads[2] >= p["kernel"][0] \
                or pads[3] >= p["kernel"][1]:
            fail(name, f"padding {list(pads)} must be smaller than the kernel {list(p['kernel'])}", ins)
        oh, ow = window_output(name, x.shape[2:], p["kernel"], p["strides"], pads, ins)
        return [TensorType(x.shape[:2] + (oh, ow), x.dtype)]

    return infer


def _pool_geometry(p, x):
    pads = resolve_pads("", p["padding"], x.shape[2:], p["kernel"], p["strides"])
    oh, ow = window_output("", x.shape[2:], p["kernel"], p["strides"], pads, ())
    return pads, (oh, ow)


def _maxpool_kernel(xp, p, x):
    pads, out_hw = _pool_geometry(p, x)
    cols = windows(xp, x, p["kernel"], p["strides"], pads, out_hw, pad_value=-xp.inf)
    return [apply_activation(xp, cols.max(axis=(2, 3)), p["activation"])]


def _avgpool_kernel(xp, p, x):
    pads, out_hw = _pool_geometry(p, x)
    kh, kw = p["kernel"]
    sums = windows(xp, x, p["kernel"], p["strides"], pads, out_hw).sum(axis=(2, 3))
    if p["count_include_pad"] or not any(pads):
        y = sums / (kh * kw)
    else:
        ones = xp.ones((1, 1) + x.shape[2:], dtype=x.dtype)
        counts = windows(xp, ones, p["kernel"], p["strides"], pads, out_hw).sum(axis=(2, 3))
        y = sums / counts
    return [apply_activation(xp, y.astype(x.dtype, copy=False), p["activation"])]


def _pool_export(onnx_type):
    def export(ctx, p, in_types, ins, outs):
        t, l, b, r = _pads_for(p, in_types[0], p["kernel"])
        attrs = dict(kernel_shape=list(p["kernel"]), strides=list(p["strides"]), pads=[t, l, b, r])
        if onnx_type == "AveragePool":
            attrs["count_include_pad"] = int(p["count_include_pad"])
        export_with_activation(ctx, onnx_type, ins, outs[0], p["activation"], in_types[0].dtype, **attrs)

    return export


def _pool_flops(p, ins, outs):
    return float(outs[0].size * p["kernel"][0] * p["kernel"][1])


register(OpSpec(
    name="maxpool2d", scaling="multilinear", inputs=(1, 1), params=POOL_PARAMS, infer=_pool_infer("maxpool2d"),
    shape=_POOL_SHAPES,
    kernel=_maxpool_kernel, export=_pool_export("MaxPool"), flops=_pool_flops,
    doc="2-D max pooling (padding never wins the max)."))

register(OpSpec(
    name="avgpool2d", scaling="multilinear", inputs=(1, 1), shape=_POOL_SHAPES,
    params=POOL_PARAMS + (Param("count_include_pad", "int", 1, optional=True),),
    infer=_pool_infer("avgpool2d"), kernel=_avgpool_kernel, export=_pool_export("AveragePool"),
    flops=_pool_flops,
    doc="2-D average pooling; count_include_pad=1 (TASO's, so conv with const_pool equals it) "
        "or 0 (ONNX's default)."))


def _gap_infer(p, ins):
    (x,) = ins
    if len(x.shape) != 4:
        fail("global_avgpool", "input must be NCHW (rank 4)", ins)
    return [TensorType(x.shape[:2] + (1, 1), x.dtype)]


register(OpSpec(
    name="global_avgpool", scaling="multilinear", inputs=(1, 1), params=(), infer=_gap_infer,
    shape=(Case(vec(In(0)[0], In(0)[1], 1, 1), requires=(eq(rank(In(0)), 4),)),),
    kernel=lambda xp, p, x: [x.mean(axis=(2, 3), keepdims=True)],
    export=lambda ctx, p, in_types, ins, outs: ctx.node("GlobalAveragePool", ins, outs),
    flops=lambda p, ins, outs: float(ins[0].size),
    doc="Average over H and W, keeping them as size 1."))


# --- ONNX import -------------------------------------------------------------------

def float_input(ctx, node) -> bool:
    return ctx.type(node.input[0]).dtype in FLOAT_DTYPES


def _onnx_padding(op, attrs, hw, khw, strides, prefer_same: bool = False):
    """ONNX auto_pad/pads -> our padding, canonicalized to SAME/VALID when equal, or
    None when the ONNX form has no equivalent here. Zero pads are VALID unless
    ``prefer_same`` and SAME pads nothing here either (a 1x1 conv, any stride): then
    SAME, the form the merge and enlarge rules match. Either exports as the same pads."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto == "SAME_UPPER":  # TensorFlow's SAME puts the odd pixel at the end too
        return "SAME"
    same = resolve_pads(op, "SAME", hw, khw, strides)
    if auto == "VALID":
        pads = (0, 0, 0, 0)
    elif auto == "SAME_LOWER":
        (t, b), (l, r) = (same_pads(hw[i], khw[i], strides[i]) for i in range(2))
        pads = (b, r, t, l)
    else:
        onnx_pads = attrs.get("pads", [0, 0, 0, 0])
        if len(onnx_pads) != 4:
            return None
        pads = tuple(int(v) for v in onnx_pads)
    if pads == (0, 0, 0, 0) and not (prefer_same and same == pads):
        return "VALID"
    if pads == same:
        return "SAME"
    return pads


def _spatial_2d(attrs, key, default=(1, 1)):
    v = attrs.get(key, list(default))
    return tuple(int(x) for x in v) if len(v) == 2 else None


@onnx_importer("Conv")
def _import_conv(ctx, node, attrs):
    x_t, w_t = ctx.type(node.input[0]), ctx.type(node.input[1])
    if len(x_t.shape) != 4 or len(w_t.shape) != 4 or not float_input(ctx, node):
        return None
    strides = _spatial_2d(attrs, "strides")
    if strides is None or _spatial_2d(attrs, "dilations") != (1, 1):
        return None
    khw = w_t.shape[2:]
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != tuple(khw):
        return None
    if attrs.get("group", 1) != x_t.shape[1] // max(w_t.shape[1], 1):
        return None
    padding = _onnx_padding("conv2d", attrs, x_t.shape[2:], khw, strides, prefer_same=True)
    if padding is None:
        return None
    bias = ctx.tensor(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    return [ctx.g.conv2d(ctx.tensor(node.input[0]), ctx.tensor(node.input[1]), strides=strides,
                         padding=padding, bias=bias)]


@onnx_importer("MatMul")
def _import_matmul(ctx, node, attrs):
    a, b = (ctx.type(n) for n in node.input)
    if len(a.shape) < 2 or len(b.shape) < 2 or not float_input(ctx, node):
        return None
    return [ctx.g.matmul(ctx.tensor(node.input[0]), ctx.tensor(node.input[1]))]


@onnx_importer("Gemm")
def _import_gemm(ctx, node, attrs):
    if not float_input(ctx, node):
        return None
    g = ctx.g
    a, b = ctx.tensor(node.input[0]), ctx.tensor(node.input[1])
    if attrs.get("transA", 0):
        a = g.transpose(a, (1, 0))
    if attrs.get("transB", 0):
        b = g.transpose(b, (1, 0))
    y = g.matmul(a, b)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = g.scalar_mul(y, alpha)
    if len(node.input) > 2 and node.input[2]:
        c = ctx.tensor(node.input[2])
        if beta != 1.0:
            c = g.scalar_mul(c, beta)
        y = g.add(y, c)
    return [y]


def _pool_import_common(ctx, node, attrs):
    x_t = ctx.type(node.input[0])
    if len(x_t.shape) != 4 or len(node.output) != 1 or not float_input(ctx, node):
        return None
    kernel = _spatial_2d(attrs, "kernel_shape", ())
    strides = _spatial_2d(attrs, "strides")
    if kernel is None or strides is None or _spatial_2d(attrs, "dilations") != (1, 1):
        return None
    padding = _onnx_padding("pool", attrs, x_t.shape[2:], kernel, strides)
    if padding is None:
        return None
    if attrs.get("ceil_mode", 0):
        padding = _ceil_mode_pads(x_t.shape[2:], kernel, strides, padding)
    return x_t, kernel, strides, padding


def _ceil_mode_pads(hw, kernel, strides, padding):
    """ceil_mode adds output rows whose windows hang past the end; for max pooling
    that is the same as extra end padding (which never wins the max)."""
    t, l, b, r = resolve_pads("maxpool2d", padding, hw, kernel, strides)
    extra = []
    for size, k, s, before, after in ((hw[0], kernel[0], strides[0], t, b),
                                       (hw[1], kernel[1], strides[1], l, r)):
        out = -(-(size + before + after - k) // s) + 1
        if (out - 1) * s >= size + before:  # last window must start inside the input
            out -= 1
        extra.append(max((out - 1) * s + k - (size + before + after), 0))
    return (t, l, b + extra[0], r + extra[1])


@onnx_importer("MaxPool")
def _import_maxpool(ctx, node, attrs):
    common = _pool_import_common(ctx, node, attrs)
    if common is None or attrs.get("storage_order", 0):
        return None
    _, kernel, strides, padding = common
    return [ctx.g.maxpool2d(ctx.tensor(node.input[0]), kernel, strides, padding)]


@onnx_importer("AveragePool")
def _import_avgpool(ctx, node, attrs):
    if attrs.get("ceil_mode", 0):
        return None  # border windows would divide by a different count
    common = _pool_import_common(ctx, node, attrs)
    if common is None:
        return None
    _, kernel, strides, padding = common
    return [ctx.g.avgpool2d(ctx.tensor(node.input[0]), kernel, strides, padding,
                            count_include_pad=int(attrs.get("count_include_pad", 0)))]


@onnx_importer("GlobalAveragePool")
def _import_gap(ctx, node, attrs):
    if len(ctx.type(node.input[0]).shape) != 4 or not float_input(ctx, node):
        return None
    return [ctx.g.global_avgpool(ctx.tensor(node.input[0]))]
