"""Layout operators: concat, split, reshape, transpose, and the weight transforms
enlarge and merge_gconv that TASO's rewrites use."""

from __future__ import annotations

import math

import numpy as np

from .base import OpSpec, Param, TensorType, check_dims, fail, onnx_importer, register
from .shapes import MAX_RANK, Case, In, OutIndex, P, eq, ge, gt, lt, per_rank, rank, vec


def _axis(op, axis, rank, types):
    if not -rank <= axis < rank:
        fail(op, f"axis {axis} out of range for rank {rank}", types)
    return axis % rank


# --- concat ------------------------------------------------------------------------

def _concat_infer(p, ins):
    first = ins[0]
    axis = _axis("concat", p["axis"], len(first.shape), ins)
    for t in ins[1:]:
        if len(t.shape) != len(first.shape) or t.dtype != first.dtype or any(
                a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            fail("concat", f"inputs must agree on every axis but {axis}", ins)
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in ins)
    return [TensorType(tuple(shape), first.dtype)]


register(OpSpec(
    name="concat", scaling="additive", inputs=(1, None), params=(Param("axis", "int", 0),),
    infer=_concat_infer, egraph_inputs=2,  # binary in rules and the e-graph, as TASO's
    shape=(Case(In(0).set(P("axis"), In(0)[P("axis")] + In(1)[P("axis")]),
                when=(ge(P("axis"), 0), lt(P("axis"), rank(In(0)))),
                requires=(eq(rank(In(0)), rank(In(1))),
                          eq(In(0).remove(P("axis")), In(1).remove(P("axis"))))),),
    kernel=lambda xp, p, *xs: [xp.concatenate(xs, axis=p["axis"])],
    export=lambda ctx, p, in_types, ins, outs: ctx.node("Concat", ins, outs, axis=p["axis"]),
    is_view=False, doc="Concatenate n tensors along an axis."))


# --- split -------------------------------------------------------------------------

def _split_infer(p, ins):
    (x,) = ins
    axis = _axis("split", p["axis"], len(x.shape), ins)
    sizes = check_dims("split", p["sizes"], "sizes")
    if not sizes or sum(sizes) != x.shape[axis]:
        fail("split", f"sizes {list(sizes)} must sum to dimension {axis} ({x.shape[axis]})", ins)
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        outs.append(TensorType(tuple(shape), x.dtype))
    return outs


def _split_kernel(xp, p, x):
    bounds = [0]
    for s in p["sizes"]:
        bounds.append(bounds[-1] + s)
    axis = p["axis"] % x.ndim
    index = [slice(None)] * x.ndim
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        index[axis] = slice(lo, hi)
        parts.append(x[tuple(index)])
    return parts


def _split_export(ctx, p, in_types, ins, outs):
    read = [i for i, o in enumerate(outs) if ctx.read(o)]
    if len(read) == 1:  # one part read (a token or q/k/v selected): copy only that part
        (i,) = read
        lo, hi = sum(p["sizes"][:i]), sum(p["sizes"][:i + 1])
        if i == len(p["sizes"]) - 1 and i:  # the last part, counted from the end as
            lo, hi = -p["sizes"][i], np.iinfo(np.int64).max  # x[:, -1] is: any length
        ctx.node("Slice", [ins[0], ctx.int64s([lo], "starts"), ctx.int64s([hi], "ends"),
                           ctx.int64s([p["axis"]], "axes")], [outs[i]])
        return
    ctx.node("Split", [ins[0], ctx.int64s(p["sizes"], "split_sizes")], outs, axis=p["axis"])


register(OpSpec(
    name="split", scaling="multilinear", inputs=(1, 1),
    params=(Param("axis", "int", 0), Param("sizes", "dims", ())), infer=_split_infer, multi_output=True,
    shape=(Case(In(0).set(P("axis"), P("sizes")[OutIndex()]),
                when=(ge(P("axis"), 0), lt(P("axis"), rank(In(0))),
                      ge(OutIndex(), 0), lt(OutIndex(), rank(P("sizes"))))),),
    kernel=_split_kernel, export=_split_export, is_view=True,
    doc="Split one tensor into len(sizes) outputs along an axis."))


# --- reshape / transpose -----------------------------------------------------------

def _reshape_infer(p, ins):
    (x,) = ins
    shape = check_dims("reshape", p["shape"], "target shape")
    if math.prod(shape) != x.size:
        fail("reshape", f"cannot reshape {x.size} elements into {list(shape)}", ins)
    return [TensorType(shape, x.dtype)]


def _reshape_export(ctx, p, in_types, ins, outs):
    ctx.node("Reshape", [ins[0], ctx.int64s(p["shape"], "shape")], outs)


register(OpSpec(
    name="reshape", scaling="multilinear", inputs=(1, 1), params=(Param("shape", "dims", ()),),
    infer=_reshape_infer, shape=(Case(P("shape")),),
    kernel=lambda xp, p, x: [x.reshape(p["shape"])], export=_reshape_export, is_view=True,
    doc="Reshape to a fully known shape (no -1 or 0: the builder resolves them)."))


def _transpose_infer(p, ins):
    (x,) = ins
    perm = tuple(p["perm"])
    if sorted(perm) != list(range(len(x.shape))):
        fail("transpose", f"perm {list(perm)} is not a permutation of the axes", ins)
    return [TensorType(tuple(x.shape[i] for i in perm), x.dtype)]


register(OpSpec(
    name="transpose", scaling="multilinear", inputs=(1, 1), params=(Param("perm", "ints", ()),),
    infer=_transpose_infer,
    shape=per_rank(lambda r: Case(vec(*[In(0)[P("perm")[i]] for i in range(r)]),
                                  when=(eq(rank(P("perm")), r),), requires=(eq(rank(In(0)), r),)),
                   range(1, MAX_RANK + 1)),
    kernel=lambda xp, p, x: [xp.transpose(x, p["perm"]).copy()],
    export=lambda ctx, p, in_types, ins, outs: ctx.node("Transpose", ins, outs, perm=list(p["perm"])),
    is_view=True, doc="Permute axes."))


# --- enlarge -----------------------------------------------------------------------

def _enlarge_infer(p, ins):
    w, ref = ins
    if len(w.shape) != 4 or len(ref.shape) != 4:
        fail("enlarge", "both operands must be conv kernels (rank 4)", ins)
    (kh, kw), (rh, rw) = w.shape[2:], ref.shape[2:]
    if rh < kh or rw < kw or (rh - kh) % 2 or (rw - kw) % 2:
        fail("enlarge", "the reference kernel must be at least as large, larger by an even "
                        "amount on each axis (so the kernel stays centred)", ins)
    return [TensorType(w.shape[:2] + (rh, rw), w.dtype)]


def _enlarge_pads(w_shape, ref_shape):
    dh, dw = ref_shape[2] - w_shape[2], ref_shape[3] - w_shape[3]
    return dh // 2, dw // 2


def _enlarge_kernel(xp, p, w, ref):
    ph, pw = _enlarge_pads(w.shape, ref.shape)
    return [xp.pad(w, ((0, 0), (0, 0), (ph, ph), (pw, pw)))]


def _enlarge_export(ctx, p, in_types, ins, outs):
    ph, pw = _enlarge_pads(in_types[0].shape, in_types[1].shape)
    ctx.node("Pad", [ins[0], ctx.int64s((0, 0, ph, pw, 0, 0, ph, pw), "pads")], outs)


register(OpSpec(
    name="enlarge", scaling="first", inputs=(2, 2), params=(), infer=_enlarge_infer,
    shape=(Case(vec(In(0)[0], In(0)[1], In(1)[2], In(1)[3]),
                requires=(eq(rank(In(0)), 4), eq(rank(In(1)), 4),
                          ge(In(1)[2], In(0)[2]), ge(In(1)[3], In(0)[3]),
                          eq((In(1)[2] - In(0)[2]) % 2, 0), eq((In(1)[3] - In(0)[3]) % 2, 0))),),
    kernel=_enlarge_kernel, export=_enlarge_export,
    doc="Zero-pad a conv kernel, centred, to the kernel size of ref (a SAME conv "
        "with the enlarged kernel computes the same)."))


# --- merge_gconv -------------------------------------------------------------------

def _merge_gconv_infer(p, ins):
    (w,) = ins
    groups, count = p["groups"], p["count"]
    if len(w.shape) != 4:
        fail("merge_gconv", "weight must be a conv kernel (rank 4)", ins)
    if groups <= 0 or count <= 0 or groups % count or w.shape[0] % groups:
        fail("merge_gconv", f"groups {groups} must divide out channels {w.shape[0]} and be a "
                            f"multiple of count {count}", ins)
    return [TensorType((w.shape[0], w.shape[1] * count) + w.shape[2:], w.dtype)]


def _merge_gconv_kernel(xp, p, w):
    groups, count = p["groups"], p["count"]
    o, i = w.shape[:2]
    out = xp.zeros((o, i * count) + w.shape[2:], dtype=w.dtype)
    per_group = o // groups
    for g in range(groups):
        slot = (g % count) * i  # where old group g's channels sit inside the merged group
        out[g * per_group:(g + 1) * per_group, slot:slot + i] = w[g * per_group:(g + 1) * per_group]
    return [out]


register(OpSpec(
    name="merge_gconv", scaling="multilinear", inputs=(1, 1),
    params=(Param("groups", "int", 1), Param("count", "int", 1)),
    shape=(Case(vec(In(0)[0], In(0)[1] * P("count"), In(0)[2], In(0)[3]),
                requires=(eq(rank(In(0)), 4), gt(P("count"), 0), eq(P("groups") % P("count"), 0),
                          gt(P("groups"), 0), eq(In(0)[0] % P("groups"), 0))),),
    infer=_merge_gconv_infer, kernel=_merge_gconv_kernel,
    doc="Rewrite a grouped conv kernel (with `groups` groups) so that `count` neighbouring "
        "groups merge into one: the conv then runs with groups/count groups."))


# --- ONNX import -------------------------------------------------------------------

@onnx_importer("Concat")
def _import_concat(ctx, node, attrs):
    ins = [ctx.tensor(n) for n in node.input]
    axis = int(attrs["axis"])
    # parts empty along the axis add nothing (transformers' partial rotary embedding
    # whose turned part is the whole head: concat(turned x, x[..., D:])); one part left is it
    parts = [t for t in ins if t.shape[axis] != 0] or ins
    return [parts[0]] if len(parts) == 1 else [ctx.g.concat(axis, parts)]


@onnx_importer("Split")
def _import_split(ctx, node, attrs):
    x_t = ctx.type(node.input[0])
    axis = int(attrs.get("axis", 0)) % len(x_t.shape)
    if len(node.input) > 1 and node.input[1]:
        sizes = ctx.const(node.input[1])
        if sizes is None:
            return None
        sizes = [int(s) for s in sizes]
    elif "split" in attrs:
        sizes = [int(s) for s in attrs["split"]]
    else:  # equal parts; the last one smaller when it does not divide (opset 18)
        n = len(node.output)
        step = -(-x_t.shape[axis] // n)
        sizes = [min(step, x_t.shape[axis] - k * step) for k in range(n)]
    return ctx.g.split(ctx.tensor(node.input[0]), axis, sizes)


def resolve_reshape(in_shape, target, allowzero=False):
    """ONNX/NumPy reshape conventions (0 copies a dim, -1 infers one) -> a full shape."""
    target = [int(v) for v in target]
    out = [in_shape[i] if v == 0 and not allowzero else v for i, v in enumerate(target)]
    if out.count(-1) == 1:
        known = math.prod(v for v in out if v != -1)
        out[out.index(-1)] = math.prod(in_shape) // known if known else 0
    return tuple(out)


@onnx_importer("Reshape")
def _import_reshape(ctx, node, attrs):
    target = ctx.const(node.input[1])
    if target is None:
        return None
    x = ctx.tensor(node.input[0])
    return [ctx.g.reshape(x, resolve_reshape(x.shape, target, attrs.get("allowzero", 0)))]


@onnx_importer("Flatten")
def _import_flatten(ctx, node, attrs):
    x = ctx.tensor(node.input[0])
    axis = int(attrs.get("axis", 1))
    axis = axis + len(x.shape) if axis < 0 else axis
    return [ctx.g.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))]


def _axes(ctx, node, attrs):
    if len(node.input) > 1 and node.input[1]:
        axes = ctx.const(node.input[1])
        return None if axes is None else [int(a) for a in axes]
    return attrs.get("axes")


@onnx_importer("Squeeze")
def _import_squeeze(ctx, node, attrs):
    x = ctx.tensor(node.input[0])
    axes = _axes(ctx, node, attrs)
    if axes is None:
        shape = tuple(d for d in x.shape if d != 1)
    else:
        drop = {a % len(x.shape) for a in axes}
        shape = tuple(d for i, d in enumerate(x.shape) if i not in drop)
    return [ctx.g.reshape(x, shape)]


@onnx_importer("Unsqueeze")
def _import_unsqueeze(ctx, node, attrs):
    x = ctx.tensor(node.input[0])
    axes = _axes(ctx, node, attrs)
    if axes is None:
        return None
    rank = len(x.shape) + len(axes)
    shape, it = [], iter(x.shape)
    new = {a % rank for a in axes}
    if len(new) != len(axes):  # invalid ONNX: onnxruntime refuses it too
        fail("Unsqueeze", f"node {node.name or node.output[0]!r}: axes {list(axes)} name one axis twice", [x.type])
    for i in range(rank):
        shape.append(1 if i in new else next(it))
    return [ctx.g.reshape(x, tuple(shape))]


@onnx_importer("Transpose")
def _import_transpose(ctx, node, attrs):
    x = ctx.tensor(node.input[0])
    perm = attrs.get("perm") or list(range(len(x.shape)))[::-1]
    return [ctx.g.transpose(x, tuple(int(v) for v in perm))]


# A Gather of one index along an axis at most this long, which other Gathers of one index
# read too (q, k and v of a packed projection), is a split into every index, so that the
# siblings share one split; otherwise (a sequence, a lone select) the split cuts only
# around the index.
_SPLIT_EVERY_INDEX = 16


def gather_one_index(g, x, axis: int, index: int, siblings: bool = False):
    """``x`` at one index of ``axis``, the axis kept (length 1): a part of a split.
    Index 0 is part 0 and the last index part 1 (of a split in two; another index is
    part 1 of three), the forms the token-select rules push up through per-token
    operators; with ``siblings`` along a short axis, part ``index`` of a split into
    every index."""
    n = x.shape[axis]
    index %= n
    if n == 1:
        return x
    if siblings and n <= _SPLIT_EVERY_INDEX:
        return g.split(x, axis, [1] * n)[index]
    return g.split(x, axis, [s for s in (index, 1, n - index - 1) if s])[1 if index else 0]


def _gathered_with_siblings(ctx, node, axis: int) -> bool:
    """Whether another Gather reads the same tensor along the same axis."""
    def axis_of(n):
        return next((a.i for a in n.attribute if a.name == "axis"), 0) % len(ctx.type(node.input[0]).shape)

    return any(r is not node and r.op_type == "Gather" and r.domain in ("", "ai.onnx") and axis_of(r) == axis
               for r in ctx.readers(node.input[0]))


@onnx_importer("Gather")
def _import_gather(ctx, node, attrs):
    """A Gather of every index along its axis, in order (exporters' way of inserting
    axes into a mask), is a reshape; a Gather of one known index (ViT's q/k/v selection
    and class token, a causal LM's last position) is a part of a split; other gathers
    (an embedding lookup by run-time ids) stay opaque."""
    idx = ctx.const(node.input[1])
    x_t = ctx.type(node.input[0])
    if idx is None or not x_t.shape:
        return None
    axis = int(attrs.get("axis", 0)) % len(x_t.shape)
    if idx.size == 1 and -x_t.shape[axis] <= int(idx.reshape(-1)[0]) < x_t.shape[axis]:
        y = gather_one_index(ctx.g, ctx.tensor(node.input[0]), axis, int(idx.reshape(-1)[0]),
                             _gathered_with_siblings(ctx, node, axis))
        shape = x_t.shape[:axis] + tuple(idx.shape) + x_t.shape[axis + 1:]
        return [y if y.shape == shape else ctx.g.reshape(y, shape)]
    if not np.array_equal(idx.reshape(-1), np.arange(x_t.shape[axis])):
        return None
    shape = x_t.shape[:axis] + tuple(idx.shape) + x_t.shape[axis + 1:]
    return [ctx.g.reshape(ctx.tensor(node.input[0]), shape)]


@onnx_importer("Slice")
def _import_slice(ctx, node, attrs):
    """A Slice by known bounds with unit steps is a part of a split on each axis it
    cuts (what the exporter writes for a split with one part read); other slices (a
    step, run-time bounds, an empty result) stay opaque."""
    x = ctx.tensor(node.input[0])
    bounds = [ctx.const(node.input[i]) if len(node.input) > i and node.input[i] else None for i in range(1, 5)]
    starts, ends, axes, steps = bounds
    if starts is None or ends is None or (len(node.input) > 3 and node.input[3] and axes is None) \
            or (len(node.input) > 4 and node.input[4] and steps is None):
        return None
    axes = range(len(starts)) if axes is None else axes
    if steps is not None and any(int(s) != 1 for s in steps.reshape(-1)):
        return None
    y = x
    for axis, lo, hi in zip(axes, starts.reshape(-1), ends.reshape(-1)):
        axis = int(axis) % len(x.shape)
        n = x.shape[axis]
        lo, hi = (min(max(int(v) + n if v < 0 else int(v), 0), n) for v in (lo, hi))
        if hi <= lo:
            return None
        if hi - lo < n:
            y = ctx.g.split(y, axis, [s for s in (lo, hi - lo, n - hi) if s])[1 if lo else 0]
    return [y]


@onnx_importer("GatherND")
def _import_gather_nd(ctx, node, attrs):
    """A GatherND that reads every element once, in order, is a reshape."""
    idx = ctx.const(node.input[1])
    x_t = ctx.type(node.input[0])
    if idx is None or attrs.get("batch_dims", 0) or not x_t.shape or idx.shape[-1:] != (len(x_t.shape),):
        return None
    every = np.indices(x_t.shape).reshape(len(x_t.shape), -1).T
    if not np.array_equal(idx.reshape(-1, len(x_t.shape)), every):
        return None
    return [ctx.g.reshape(ctx.tensor(node.input[0]), tuple(idx.shape[:-1]))]
