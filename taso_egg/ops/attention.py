"""Attention over a key/value cache, as one operator: ``gqa``.

A decoder's attention step reads its queries, the new keys and values, the cache of
past ones and an additive mask, and returns the attention (heads merged) with the cache
grown by the new entries. Written out by an exporter it is some thirty operators a
layer; onnxruntime runs it as one kernel, com.microsoft GroupQueryAttention. The
kernel below is the textbook formula, with each key/value head shared by its group of
``num_heads / kv_num_heads`` query heads (head ``h`` reads key head ``h // group``):

    present_k = concat(past_k, heads(k)),  present_v = concat(past_v, heads(v))
    scores    = scale * q . present_k^T + bias        (bias broadcast over batch, heads;
                                                       with ``causal``, -inf after each
                                                       new token's own position)
    out       = softmax(scores) . present_v           (0 where a row's softmax is NaN,
                                                       with ``nan_to_zero``)

GroupQueryAttention computes exactly this when it is given the mask as
``attention_bias`` and every row's key length as the whole cache (``seqlens_k = total -
1``, read from shapes, never from the mask). With ``causal`` (the mask adds -inf to
every key after a new token's own position, as a decoder's does) its own causal mask
runs too, hiding nothing more, and ``query_seqlens`` makes it take every input. Without
(a mask of the dtype's minimum: a row that sees no key then averages every key, future
ones included), its causal mask is off, and it refuses one input the formula takes: a
batch above 1 with several new tokens on a non-empty cache. That export is an ``If`` on
the shapes: that input runs the formula in standard operators, every other the kernel
(``tests/test_attention.py`` holds the kernel, both branches and onnxruntime's own
kernel equal, holey and left-padded masks included).

With ``causal``, three options save kernels: ``key_mask`` (an integer [B, T] mask in
the bias's place, a key seen where it is not 0: the bias the export computes in some
twenty operators where it is proved to be the causal mask and that input's zeros,
``onnx_io/key_masks.py``, made from the input in four), ``rotary`` (the queries and keys turned by
the angles given first, as the ``rotary`` operator turns them: GroupQueryAttention's
``do_rotary``, reading its cos and sin caches by position id, given one row for each
token and each token its own row, so any positions are exact) and ``packed`` (the
query, key and value read from one tensor, side by side along the last axis: the
packed projection, unsplit).

``rotary`` is rotary position embedding as onnxruntime's RotaryEmbedding runs it (each
head's two halves turned by one angle a position); its export gives the kernel the
angles the graph computed for these very tokens, so any position ids are exact.
"""

from __future__ import annotations

import numpy as np

from .base import OpSpec, Param, TensorType, fail, register

_ONNX_DTYPES = {"float32": 1, "float16": 10}


def _gqa_inputs(p, ins) -> dict:
    """The operator's inputs by role: the query, key and value (or ``qkv``, the three
    side by side along the last axis, with ``packed``), the caches, the two tensors read
    for the lengths, the angles' cos and sin (with ``rotary``), the bias (optional)."""
    ins = list(ins)
    named = {"qkv": ins.pop(0)} if p["packed"] else dict(zip(("q", "k", "v"), (ins.pop(0) for _ in range(3))))
    named.update(zip(("past_k", "past_v", "sizes_q", "sizes_cache"), (ins.pop(0) for _ in range(4))))
    if p["rotary"]:
        named["cos"], named["sin"] = ins.pop(0), ins.pop(0)
    last = ins.pop(0) if ins else None
    named["bias"], named["key_mask"] = (None, last) if p["key_mask"] else (last, None)
    return named


def _unpacked(p, size: int) -> tuple[int, int, int]:
    """Where the key and value start in a packed [.., (H + 2 Hkv) * D] and its width."""
    q_width, kv_width = p["num_heads"] * size, p["kv_num_heads"] * size
    return q_width, q_width + kv_width, q_width + 2 * kv_width


def _gqa_infer(p, ins):
    named = _gqa_inputs(p, ins)
    past_k, past_v, sizes_q, sizes_cache = (named[r] for r in ("past_k", "past_v", "sizes_q", "sizes_cache"))
    heads, kv_heads = p["num_heads"], p["kv_num_heads"]
    floats = [t for r, t in named.items() if t is not None and r not in ("sizes_q", "sizes_cache", "key_mask")]
    first = floats[0]
    if first.dtype not in _ONNX_DTYPES or any(t.dtype != first.dtype for t in floats):
        fail("gqa", "inputs must be float32 or float16 tensors of one dtype", ins)
    if (p["packed"] or p["rotary"] or p["key_mask"] or p["window"] >= 0) and not p["causal"]:
        fail("gqa", "a packed query, key and value, rotary angles, a key mask and a window are taken with the "
                    "causal mask only", ins)
    if len(first.shape) != 3 or len(past_k.shape) != 4:
        fail("gqa", "query, key and value are [batch, sequence, heads * head size], the caches "
                    "[batch, key/value heads, past, head size]", ins)
    if kv_heads < 1 or heads % kv_heads:
        fail("gqa", f"num_heads {heads} must be a multiple of kv_num_heads {kv_heads}", ins)
    batch, seq, _ = first.shape
    size = past_k.shape[3]
    if p["packed"]:
        q_end, _, width = _unpacked(p, size)
        if first.shape[2] != width:
            fail("gqa", f"the packed query, key and value must be [batch, sequence, ({heads} + 2 x {kv_heads}) "
                        f"x {size}]", ins)
        q = TensorType((batch, seq, q_end), first.dtype)
        k = v = TensorType((batch, seq, kv_heads * size), first.dtype)
    else:
        q, k, v = named["q"], named["k"], named["v"]
    if p["rotary"] and (len(named["cos"].shape) != 4 or named["cos"].shape[0] not in (1, batch)
                        or named["cos"].shape[1:] != (1, seq, size // 2) or named["sin"].shape != named["cos"].shape):
        fail("gqa", f"cos and sin must be [{batch} or 1, 1, {seq}, {size // 2}]: half of each head's size", ins)
    if q.shape != (batch, seq, heads * size) or k.shape != (batch, seq, kv_heads * size) or v.shape != k.shape:
        fail("gqa", f"query must be [batch, sequence, {heads} x {size}], key and value "
                    f"[batch, sequence, {kv_heads} x {size}]", ins)
    if past_k.shape[:2] != (batch, kv_heads) or past_v.shape != past_k.shape:
        fail("gqa", f"the caches must be [batch, {kv_heads}, past, {size}]", ins)
    if sizes_q.shape[:2] != (batch, seq) or len(sizes_cache.shape) < 3 or \
            (sizes_cache.shape[0], sizes_cache.shape[2]) != (batch, past_k.shape[2]):
        fail("gqa", "the tensors the lengths are read from must be [batch, sequence, ...] and "
                    "[batch, _, past, ...]", ins)
    total = past_k.shape[2] + seq
    if named["bias"] is not None:
        bias = named["bias"].shape
        if len(bias) != 4 or bias[0] not in (1, batch) or bias[1] not in (1, heads) or bias[2:] != (seq, total):
            fail("gqa", f"the bias must be [batch or 1, heads or 1, {seq}, {total}]", ins)
    key_mask = named["key_mask"]
    if p["key_mask"] and (key_mask is None or key_mask.shape != (batch, total)
                          or not (key_mask.dtype == "bool" or key_mask.dtype.startswith("int"))):
        fail("gqa", f"the key mask must be an integer or bool [{batch}, {total}]", ins)
    present = TensorType((batch, kv_heads, total, size), q.dtype)
    return [q, present, present]


def _gqa_kernel(xp, p, *ins):
    named = _gqa_inputs(p, ins)
    past_k, past_v, bias = named["past_k"], named["past_v"], named["bias"]
    heads, kv_heads, size = p["num_heads"], p["kv_num_heads"], past_k.shape[3]
    if p["key_mask"]:  # the keys a row sees: where its mask is not 0
        seen = xp.asarray(named["key_mask"]) != 0
        bias = xp.where(seen, xp.zeros((), past_k.dtype), xp.asarray(-np.inf, past_k.dtype))[:, None, None, :]
    if p["packed"]:
        q_end, k_end, _ = _unpacked(p, size)
        qkv = named["qkv"]
        q, k, v = qkv[..., :q_end], qkv[..., q_end:k_end], qkv[..., k_end:]
    else:
        q, k, v = named["q"], named["k"], named["v"]
    if p["rotary"]:  # the queries and keys turned first, as RotaryEmbedding turns them
        angles = (named["cos"], named["sin"], named["sizes_q"])
        q = _rotary_kernel(xp, {"num_heads": heads}, q, *angles)[0]
        k = _rotary_kernel(xp, {"num_heads": kv_heads}, k, *angles)[0]
    batch, seq, _ = q.shape
    group = heads // kv_heads

    def split_heads(x, n):
        return x.reshape(batch, seq, n, size).transpose(0, 2, 1, 3)

    present_k = xp.concatenate([past_k, split_heads(k, kv_heads)], axis=2)
    present_v = xp.concatenate([past_v, split_heads(v, kv_heads)], axis=2)
    total = present_k.shape[2]
    # each key/value head once, its group's query rows stacked: head h reads h // group
    rows = split_heads(q, heads).reshape(batch, kv_heads, group * seq, size)
    scores = (rows @ present_k.transpose(0, 1, 3, 2)).reshape(batch, heads, seq, total)
    scores = scores * xp.asarray(p["scale"], dtype=q.dtype)
    if bias is not None:
        scores = scores + bias
    if p["causal"]:  # key j is seen by new token i only where j <= past + i (and past + i - window < j)
        own = (total - seq) + xp.arange(seq)[:, None]
        hidden = xp.arange(total)[None, :] > own
        if p["window"] >= 0:
            hidden = hidden | (xp.arange(total)[None, :] <= own - p["window"])
        scores = xp.where(hidden, xp.asarray(-np.inf, dtype=q.dtype), scores)
    with np.errstate(invalid="ignore"):  # a row that sees no key: NaN, zeroed below as the export does
        shifted = xp.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = shifted / shifted.sum(axis=-1, keepdims=True)
    if p["nan_to_zero"]:
        weights = xp.where(xp.isnan(weights), xp.zeros((), q.dtype), weights)
    out = weights.reshape(batch, kv_heads, group * seq, total) @ present_v
    out = out.reshape(batch, heads, seq, size).transpose(0, 2, 1, 3).reshape(batch, seq, heads * size)
    return [out, present_k, present_v]


def _gqa_flops(p, ins, outs):
    batch, seq, hidden = outs[0].shape
    total = outs[1].shape[2]
    turned = 3.0 * batch * seq * (hidden + outs[1].shape[1] * outs[1].shape[3]) if p["rotary"] else 0.0
    return 4.0 * batch * seq * total * hidden + 5.0 * batch * p["num_heads"] * seq * total + turned


class _Lengths:
    """What GroupQueryAttention reads besides the tensors, computed from the shapes of
    one query ([B, S, ...]) and one cache ([B, _, P, ...]), each made once for every
    layer that asks: every row's keys are the whole cache (the mask, given as the bias,
    says which count), every row's new tokens all of them."""

    def __init__(self, ctx, sizes_q, sizes_cache):
        self.ctx, self.i64 = ctx, ctx.int64s
        names = [ctx.fresh("gqa_" + h) for h in ("q_shape", "cache_shape", "batch", "batch_vec", "seq", "past",
                                                  "total")]
        self.q_shape, cache_shape, self.batch, self.batch_vec, self.seq, self.past, self.total = names
        q_shape = self.q_shape
        ctx.node("Shape", [sizes_q], [q_shape])
        ctx.node("Shape", [sizes_cache], [cache_shape])
        ctx.node("Gather", [q_shape, self.i64(0, "gqa_zero")], [self.batch], axis=0)
        ctx.node("Gather", [q_shape, self.i64([0], "gqa_first")], [self.batch_vec], axis=0)
        ctx.node("Gather", [q_shape, self.i64(1, "gqa_one")], [self.seq], axis=0)
        ctx.node("Gather", [cache_shape, self.i64(2, "gqa_two")], [self.past], axis=0)
        ctx.node("Add", [self.past, self.seq], [self.total])
        last, last_rows, self.seqlens_k, self.total32 = (ctx.fresh("gqa_" + h) for h in
                                                         ("last", "last_rows", "seqlens_k", "total32"))
        ctx.node("Sub", [self.total, self.i64(1, "gqa_one_scalar")], [last])
        ctx.node("Expand", [last, self.batch_vec], [last_rows])
        ctx.node("Cast", [last_rows], [self.seqlens_k], to=6)
        ctx.node("Cast", [self.total], [self.total32], to=6)
        self._query, self._refused, self._batch_seq = None, None, None

    @property
    def batch_seq(self) -> str:
        """[B, S] of the query, as a shape."""
        if self._batch_seq is None:
            self._batch_seq = self.ctx.fresh("gqa_batch_seq")
            self.ctx.node("Gather", [self.q_shape, self.i64([0, 1], "gqa_batch_seq_axes")], [self._batch_seq], axis=0)
        return self._batch_seq

    @property
    def query_seqlens(self) -> str:
        if self._query is None:
            rows, self._query = self.ctx.fresh("gqa_seq_rows"), self.ctx.fresh("gqa_query_seqlens")
            self.ctx.node("Expand", [self.seq, self.batch_vec], [rows])
            self.ctx.node("Cast", [rows], [self._query], to=6)
        return self._query

    @property
    def refused(self) -> str:
        """Whether the input is the one GroupQueryAttention refuses without its causal
        mask and query_seqlens: batch > 1, several new tokens, a non-empty cache."""
        if self._refused is None:
            ctx = self.ctx
            one, zero = self.i64(1, "gqa_one_scalar"), self.i64(0, "gqa_zero_scalar")
            many, several, cached, both, self._refused = (ctx.fresh("gqa_" + h) for h in
                                                          ("many", "several", "cached", "both", "refused"))
            ctx.node("Greater", [self.batch, one], [many])
            ctx.node("Greater", [self.seq, one], [several])
            ctx.node("Greater", [self.past, zero], [cached])
            ctx.node("And", [many, several], [both])
            ctx.node("And", [both, cached], [self._refused])
        return self._refused


def _gqa_export(ctx, p, in_types, ins, outs):
    """GroupQueryAttention with the mask as its bias, the lengths it takes computed from
    the shapes (so the model keeps its symbolic dims). With ``causal``, the kernel alone;
    without, ``If`` (batch > 1, several new tokens, a non-empty cache: the one input the
    kernel then refuses) the formula in standard operators, else the kernel."""
    from onnx import helper, numpy_helper

    dtype = in_types[0].dtype
    named = _gqa_inputs(p, ins)
    q, k, v = (named["qkv"], "", "") if p["packed"] else (named["q"], named["k"], named["v"])
    past_k, past_v, sizes_q, sizes_cache = (named[r] for r in ("past_k", "past_v", "sizes_q", "sizes_cache"))
    bias = named["bias"] or ""
    heads, kv_heads = p["num_heads"], p["kv_num_heads"]
    lengths = ctx.shared(("gqa lengths", sizes_q, sizes_cache), lambda: _Lengths(ctx, sizes_q, sizes_cache))
    if p["key_mask"]:
        bias = ctx.shared(("gqa key mask", named["key_mask"], sizes_q),
                          lambda: _key_mask_bias(ctx, named["key_mask"], lengths, in_types[0].dtype))
    types = _gqa_inputs(p, in_types)
    size = types["past_k"].shape[3]
    ctx.opsets.setdefault("com.microsoft", 1)
    fresh = lambda hint: ctx.fresh(f"{outs[0]}_{hint}")  # noqa: E731

    elem = _ONNX_DTYPES[dtype]

    def branch(nodes, results, name):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(r, elem, None) for r in results])

    def const(value, hint, dt=np.int64):
        name = fresh(hint)
        return name, helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dt), name))

    def nan_guard(nodes, x, hint, out):
        zero_name, zero = const(0, hint + "_zero", np.dtype(dtype))
        isnan = fresh(hint + "_isnan")
        nodes += [zero, helper.make_node("IsNaN", [x], [isnan]), helper.make_node("Where", [isnan, zero_name, x],
                                                                                  [out])]
        return out

    def kernel(results):
        """GroupQueryAttention computing ``results`` (attention, present key and value).
        With its own causal mask on, query_seqlens lets it take every input (several
        new tokens on a cache at any batch); without, it runs under the If below."""
        raw = fresh("kernel_raw") if p["nan_to_zero"] else results[0]
        turning = ["", "", ""]
        if p["rotary"]:
            half = types["cos"].shape[3]
            turning = ctx.shared(("gqa angles", named["cos"], named["sin"], lengths),
                                 lambda: _angle_cache(ctx, named["cos"], named["sin"], half, lengths))
        inputs = [q, k, v, past_k, past_v, lengths.seqlens_k, lengths.total32, *turning, bias]
        inputs += ["", "", "", "", "", lengths.query_seqlens] if p["causal"] else []
        options = {"do_rotary": 1, "rotary_interleaved": 0} if p["rotary"] else {}
        if p["window"] >= 0:
            options["local_window_size"] = p["window"]
        nodes = [helper.make_node("GroupQueryAttention", inputs if bias or p["causal"] else inputs[:7],
                                  [raw, results[1], results[2]], name=fresh("GroupQueryAttention"),
                                  domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads,
                                  causal=int(p["causal"]), scale=float(p["scale"]), **options)]
        if p["nan_to_zero"]:
            nan_guard(nodes, raw, "kernel", results[0])
        return nodes

    if p["causal"]:
        for node in kernel(list(outs)):
            ctx.raw_node(node)
        return

    # the formula
    nodes: list = []

    def op(op_type, inputs, hint, **kw):
        name = fresh(hint)
        nodes.append(helper.make_node(op_type, inputs, [name], **kw))
        return name

    def shape(values, hint):
        name, node = const(values, hint)
        nodes.append(node)
        return name

    def cache(new, old, hint):
        split = op("Reshape", [new, shape([0, 0, kv_heads, size], hint + "_split_shape")], hint + "_split")
        return op("Concat", [old, op("Transpose", [split], hint + "_heads", perm=[0, 2, 1, 3])], hint + "_present",
                  axis=2)

    present_k, present_v = cache(k, past_k, "formula_k"), cache(v, past_v, "formula_v")
    q_heads = op("Transpose", [op("Reshape", [q, shape([0, 0, heads, size], "formula_q_shape")], "formula_q_split")],
                 "formula_q_heads", perm=[0, 2, 1, 3])
    by_kv_head = shape([0, kv_heads, -1, 0], "formula_group_shape")
    rows = op("Reshape", [q_heads, by_kv_head], "formula_rows")
    scores = op("MatMul", [rows, op("Transpose", [present_k], "formula_keys", perm=[0, 1, 3, 2])], "formula_qk")
    if p["scale"] != 1.0:
        scale_name, scale = const(p["scale"], "formula_scale", np.dtype(dtype))
        nodes.append(scale)
        scores = op("Mul", [scores, scale_name], "formula_scaled")
    scores = op("Reshape", [scores, shape([0, heads, -1, 0], "formula_heads_shape")], "formula_scores")
    if bias:
        scores = op("Add", [scores, bias], "formula_masked")
    weights = op("Softmax", [scores], "formula_weights", axis=-1)
    if p["nan_to_zero"]:
        weights = nan_guard(nodes, weights, "formula", fresh("formula_guarded"))
    out = op("MatMul", [op("Reshape", [weights, by_kv_head], "formula_weight_rows"), present_v], "formula_av")
    out = op("Reshape", [out, shape([0, heads, -1, size], "formula_out_heads")], "formula_out_split")
    out = op("Reshape", [op("Transpose", [out], "formula_out_t", perm=[0, 2, 1, 3]),
                         shape([0, 0, heads * size], "formula_out_shape")], "formula_out")

    kernel_outs = [fresh("kernel_out"), fresh("kernel_present_k"), fresh("kernel_present_v")]
    ctx.node("If", [lengths.refused], list(outs),
             then_branch=branch(nodes, [out, present_k, present_v], fresh("formula")),
             else_branch=branch(kernel(kernel_outs), kernel_outs, fresh("kernel")))


def _key_mask_bias(ctx, mask, lengths, dtype) -> str:
    """The bias of a [B, T] key mask: 0 where it is not 0, -inf where it is, for every
    new token alike ([B, 1, S, T]: the kernel takes no broadcast over the tokens; its
    own causal mask hides the keys after each)."""
    names = [ctx.fresh("gqa_key_" + h) for h in ("seen", "seen_rows", "bias_row", "seq_vec", "tokens", "bias")]
    seen, seen_rows, bias_row, seq_vec, tokens, bias = names
    ctx.node("Cast", [mask], [seen], to=9)
    ctx.node("Unsqueeze", [seen, ctx.int64s([1, 2], "gqa_key_axes")], [seen_rows])
    ctx.node("Where", [seen_rows, ctx.constant(np.zeros((), dtype), "gqa_key_open"),
                       ctx.constant(np.array(-np.inf, dtype), "gqa_key_closed")], [bias_row])
    ctx.node("Gather", [lengths.q_shape, ctx.int64s([1], "gqa_seq_axis")], [seq_vec], axis=0)
    ctx.node("Concat", [ctx.int64s([1, 1], "gqa_key_lead"), seq_vec, ctx.int64s([1], "gqa_key_tail")], [tokens],
             axis=0)
    ctx.node("Expand", [bias_row, tokens], [bias])
    return bias


def _angle_cache(ctx, cos, sin, half, lengths):
    """GroupQueryAttention's own rotary reads cos and sin caches by position id, and
    wants at least as many rows as keys: the angles of these very tokens (one row each,
    numbered as ``rotary`` numbers them), then as many rows of zeros as keys, never
    read."""
    positions, cos_rows, sin_rows = ctx.shared(("rotary rows", cos, sin, lengths.q_shape),
                                               lambda: _rotary_rows(ctx, cos, sin, half, lengths.batch_seq))
    names = [ctx.fresh("gqa_" + h) for h in ("total_vec", "pads", "cos_cache", "sin_cache")]
    total_vec, pads, cos_cache, sin_cache = names
    ctx.node("Reshape", [lengths.total, ctx.int64s([1], "gqa_one_vec")], [total_vec])
    ctx.node("Concat", [ctx.int64s([0, 0], "gqa_no_pad"), total_vec, ctx.int64s([0], "gqa_pad_zero")], [pads],
             axis=0)
    ctx.node("Pad", [cos_rows, pads], [cos_cache])
    ctx.node("Pad", [sin_rows, pads], [sin_cache])
    return [cos_cache, sin_cache, positions]


register(OpSpec(
    name="gqa", inputs=(5, 10),
    params=(Param("num_heads", "int", 1), Param("kv_num_heads", "int", 1), Param("scale", "float", 1.0),
            Param("nan_to_zero", "int", 0), Param("causal", "int", 0), Param("rotary", "int", 0),
            Param("packed", "int", 0), Param("key_mask", "int", 0), Param("window", "int", -1)),
    infer=_gqa_infer, kernel=_gqa_kernel, export=_gqa_export, flops=_gqa_flops,
    multi_output=True, in_rules=False,
    doc="Attention of the new queries over the key/value cache grown by the new keys and values "
        "(query [B, S, H*D], key and value [B, S, Hkv*D], caches [B, Hkv, P, D], two tensors read for their "
        "shapes only, [B, S, ...] and [B, _, P, ...], so that layers share their lengths, optional additive "
        "bias [B|1, H|1, S, P+S]) -> (attention [B, S, H*D], the grown caches [B, Hkv, P+S, D]); "
        "com.microsoft GroupQueryAttention with its bias; ``causal``: also its own causal mask, -inf after each "
        "new token's position; with it, ``packed``: query, key and value one tensor [B, S, (H + 2 Hkv) * D] in "
        "their place, ``rotary``: the angles' cos and sin [B|1, 1, S, D/2] after the two size tensors, the "
        "queries and keys turned by them first, ``key_mask``: in the bias's place an integer or bool [B, P+S], "
        "each row seeing the keys where it is not 0 (the bias 0 there, -inf elsewhere); ``window`` (with the "
        "causal mask, where not -1): also -inf where a key is ``window`` or more positions before the token's own, "
        "its local_window_size."))


# --- rotary position embedding -----------------------------------------------------

def _rotary_infer(p, ins):
    x, cos, sin, sizes = ins
    heads = p["num_heads"]
    if len(x.shape) == 3 and heads >= 1 and x.shape[2] % heads == 0:
        batch, seq, hidden = x.shape
        half = hidden // heads // 2
    elif len(x.shape) == 4:
        batch, _, seq, size = x.shape
        half = size // 2
    else:
        fail("rotary", f"x must be [batch, sequence, {heads} x head size] or [batch, heads, sequence, "
                       f"head size]", ins)
    if len(cos.shape) != 4 or cos.shape[0] not in (1, batch) or cos.shape[1:] != (1, seq, half) \
            or sin.shape != cos.shape or 2 * half != _head_size(p, x.shape):
        fail("rotary", f"cos and sin must be [{batch} or 1, 1, {seq}, {half}]: half of each head's size", ins)
    if not sizes.shape or sizes.shape[0] != batch:
        fail("rotary", f"the tensor read for the batch size must be [{batch}, ...]", ins)
    if x.dtype not in _ONNX_DTYPES or cos.dtype != x.dtype or sin.dtype != x.dtype:
        fail("rotary", "x, cos and sin must be float32 or float16 tensors of one dtype", ins)
    return [x]


def _head_size(p, shape) -> int:
    return shape[2] // p["num_heads"] if len(shape) == 3 else shape[3]


def _rotary_kernel(xp, p, x, cos, sin, sizes):
    half = _head_size(p, x.shape) // 2
    if x.ndim == 3:  # [B, S, N*D]: each head's angles those of its position
        batch, seq, hidden = x.shape
        rows = x.reshape(batch, seq, hidden // (2 * half), 2 * half)
        c, s = cos[:, 0, :, None, :], sin[:, 0, :, None, :]
    else:            # [B, N, S, D]
        rows, c, s = x, cos, sin
    first, second = rows[..., :half], rows[..., half:]
    out = xp.concatenate([first * c - second * s, second * c + first * s], axis=-1)
    return [out.reshape(x.shape)]


def _rotary_export(ctx, p, in_types, ins, outs):
    """com.microsoft RotaryEmbedding, its cache the angles of these very tokens (one
    row per batch row and position, numbered in order, each token given its own
    number), so that any position, left padding included, turns as the graph turns
    it. The rows and numbers are made once for every layer that shares the angles."""
    x, cos, sin, sizes = ins
    ctx.opsets.setdefault("com.microsoft", 1)
    half = in_types[1].shape[3]
    positions, cos_rows, sin_rows = ctx.shared(("rotary rows", cos, sin, sizes),
                                               lambda: _rotary_rows(ctx, cos, sin, half, _batch_by_one(ctx, sizes)))
    heads = {"num_heads": p["num_heads"]} if len(in_types[0].shape) == 3 else {}
    ctx.node("RotaryEmbedding", [x, positions, cos_rows, sin_rows], outs, domain="com.microsoft", interleaved=0,
             **heads)


def _rotary_rows(ctx, cos, sin, half, rows_of):
    """(positions, cos rows, sin rows): the angles [B or 1, 1, S, D/2] as rows, one a
    token, each token given its own row (b * S + s; s where the angles are the same for
    every batch row, numbered once), the numbers expanded to the shape ``rows_of``
    ([B, S], or [B, 1])."""
    i64 = ctx.int64s
    rows_shape = i64([-1, half], "rotary_rows_shape")
    names = [ctx.fresh("rotary_" + h) for h in ("cos_rows", "sin_rows", "shape", "batch_seq", "count", "numbers",
                                                "numbered", "positions")]
    cos_rows, sin_rows, shape, batch_seq, count, numbers, numbered, positions = names
    ctx.node("Reshape", [cos, rows_shape], [cos_rows])
    ctx.node("Reshape", [sin, rows_shape], [sin_rows])
    ctx.node("Shape", [cos], [shape])
    ctx.node("Gather", [shape, i64([0, 2], "rotary_batch_seq_axes")], [batch_seq], axis=0)
    ctx.node("ReduceProd", [batch_seq], [count], keepdims=0)
    ctx.node("Range", [i64(0, "rotary_start"), count, i64(1, "rotary_step")], [numbers])
    ctx.node("Reshape", [numbers, batch_seq], [numbered])
    ctx.node("Expand", [numbered, rows_of], [positions])
    return positions, cos_rows, sin_rows


def _batch_by_one(ctx, sizes) -> str:
    """[B, 1] as a shape, B read from ``sizes`` [B, ...]."""
    sizes_shape, batch, batch_by_one = (ctx.fresh("rotary_" + h) for h in ("sizes_shape", "batch", "batch_by_one"))
    ctx.node("Shape", [sizes], [sizes_shape])
    ctx.node("Gather", [sizes_shape, ctx.int64s([0], "rotary_batch_axis")], [batch], axis=0)
    ctx.node("Concat", [batch, ctx.int64s([1], "rotary_one")], [batch_by_one], axis=0)
    return batch_by_one


register(OpSpec(
    name="rotary", inputs=(4, 4), params=(Param("num_heads", "int", 1),),
    infer=_rotary_infer, kernel=_rotary_kernel, export=_rotary_export,
    flops=lambda p, ins, outs: 3.0 * outs[0].size, in_rules=False,
    doc="Rotary position embedding of each head's two halves (not interleaved): x [B, S, N*D] (num_heads "
        "heads) or [B, N, S, D], the angles' cos and sin [B or 1, 1, S, D/2], a tensor read for the batch size "
        "only ([B, ...], so that layers share what the export computes from it) -> (x1 cos - x2 sin, "
        "x2 cos + x1 sin) per head; com.microsoft RotaryEmbedding."))
