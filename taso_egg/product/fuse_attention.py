"""A decoder's attention, as an exporter writes it, made onnxruntime's kernels (the
operators of ``ops/attention.py``), on an extracted graph (where the rules have already
taken the repeated keys and values out: ``matmul-repeated-keys/-values``). No rule
names these operators: the pass matches what each computes and nothing else.

"rotary" (the default ``--attention``): each rotary position embedding,

    x * cos + rotate_half(x) * sin,  rotate_half(x) = concat(-second half, first half)

with cos and sin [B or 1, 1, S, D] whose halves are equal (traced back to the
exporter's ``concat(freqs, freqs)``), becomes one ``rotary``; a partial rotary
embedding (GPT-NeoX, Phi-3) turns a part of each head this way, and that part is ``x``.

"kernel": also each attention over a cache grown by concat,

    present_k = concat(past_k, k_heads)                 [B, Hkv, T, D], axis 2
    scores    = matmul(rows(q_heads), transpose(present_k, 0 1 3 2)), back to [B, H, S, T]
    weights   = softmax(scores + bias)  (then nan_to_zero, where the exporter guards it)
    out       = matmul(rows(weights), present_v), back to [B, H, S, D]

where ``rows`` groups the query heads by the key/value head they read ([B, H, S, X] ->
[B, Hkv, H/Hkv * S, X], or nothing when each query head has its own), becomes one
``gqa``. Constant scales of the scores or queries become its scale; queries and keys
turned by rotary embedding are turned in the [B, S, N*D] layout the projections give,
as GroupQueryAttention takes them: by the kernel itself where both turn whole heads by
the same angles under the causal mask (its head size a multiple of 16), reading q, k
and v as one tensor where they are the three parts of one split (a packed projection,
joined by ``join_moves`` first), else by ``rotary`` operators; the mask it reads as
the model's attention_mask where that is proved (``onnx_io/key_masks.py``), else as
the export's bias. Every intermediate must feed the next step alone;
the caches may also be outputs (the present cache), which the operator then returns.
Anything else (another layout, a bias the kernel cannot take, a head size it refuses)
is left as it is. What the pass writes is checked like every candidate: numerically
against the input, and at two sizes where the dims are symbolic, the second of them
(batch 3, several tokens on a cache) the input that runs the formula in the kernel's
place."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import Graph, Node, Tensor
from ..ops import OPS, WEIGHT
from .join_moves import Rebuild

# GroupQueryAttention's CPU kernel: float32 here (its float16 path rounds the scores)
# and head sizes that are multiples of 8; of 16 where it turns the queries and keys
_HEAD_SIZE_MULTIPLE = 8
_TURNING_HEAD_SIZE_MULTIPLE = 16


@dataclass
class _Attention:
    anchor: Node            # the node whose output the operator's first output replaces
    merged: bool            # the anchor's output is [B, S, H*D] (heads merged), else [B, H, S, D]
    q_heads: Tensor         # [B, H, S, D]
    scales: list            # 0-d tensors the queries are multiplied by on the way
    k_heads: Tensor         # [B, Hkv, S, D]
    v_heads: Tensor
    past_k: Tensor          # [B, Hkv, P, D]
    past_v: Tensor
    bias: Tensor | None     # [B|1, H|1, S, T]
    present_k: Node         # the concats the operator's second and third outputs replace
    present_v: Node
    nan_to_zero: bool
    causal: bool            # the mask is 0 / -inf: the kernel's own causal mask may run with it
    removed: set            # node ids the operator replaces
    key_mask: tuple | None = None  # ([B, T] input, window or -1): the bias is, proved, causal and its zeros


class _Reader:
    def __init__(self, g: Graph, classes: dict | None = None, key_masks: dict | None = None):
        self.g = g
        self.users: dict[tuple[int, int], list[Node]] = {}
        for n in g.nodes.values():
            for t in n.inputs:
                self.users.setdefault((t.node, t.index), []).append(n)
        self.outputs = {(t.node, t.index) for _, t in g.outputs}
        proved = key_masks or {}
        self.masks = {key: proved[c] for key, c in (classes or {}).items() if c in proved}
        self.inputs = {n.params["name"]: n.out() for n in g.inputs()}

    def key_mask(self, bias: Tensor) -> tuple[Tensor, int] | None:
        """(the input ``bias`` is proved to be the causal mask and the zeros of, the width
        of the sliding window it also has or -1), if any."""
        proved = self.masks.get((bias.node, bias.index))
        if proved is None or proved[0] not in self.inputs:
            return None
        return self.inputs[proved[0]], proved[1]

    def node(self, t: Tensor) -> Node:
        return self.g.nodes[t.node]

    def sole_user(self, t: Tensor) -> Node | None:
        us = self.users.get((t.node, t.index), [])
        return us[0] if len(us) == 1 and (t.node, t.index) not in self.outputs else None

    def only_read_by(self, t: Tensor, readers: set[int]) -> bool:
        return all(u.id in readers for u in self.users.get((t.node, t.index), []))


def _cache(r: _Reader, t: Tensor) -> Node | None:
    """The concat(past, new) along the positions that makes ``t``, else None."""
    n = r.node(t)
    if n.op != "concat" or len(n.inputs) != 2 or len(t.shape) != 4 or n.params["axis"] % 4 != 2:
        return None
    return n


def _match(r: _Reader, softmax: Node) -> _Attention | None:
    """The attention over a cache (the module's formula) whose softmax is ``softmax``,
    walked from it up to the queries and keys and down to the merged heads; None at the
    first step that is not the formula's."""
    x = softmax.inputs[0]
    if len(x.shape) != 4 or softmax.params["axis"] != 3 or x.dtype != "float32":
        return None
    removed = {softmax.id}
    batch, heads, seq, total = x.shape
    bias = None
    scores = x
    add = r.node(x)
    if add.op == "ewadd" and r.sole_user(x) is softmax:
        for i in (0, 1):
            if r.node(add.inputs[i]).op in ("reshape", "matmul", "smul"):
                scores, bias = add.inputs[i], add.inputs[1 - i]
                break
        else:
            return None
        if len(bias.shape) != 4 or bias.shape[0] not in (1, batch) or bias.shape[1] not in (1, heads) \
                or bias.shape[2:] != (seq, total) or bias.dtype != x.dtype:
            return None
        removed.add(add.id)
    if scores is not x and r.sole_user(scores) is not add:
        return None
    # scores: [B, H, S, T], from the grouped rows' product with the transposed keys, scaled
    # on the way (a scale of the scores is one of the queries)
    scales: list = []
    grouped = False
    n = r.node(scores)
    while (n.op == "smul" and n.inputs[1].shape == ()) or (n.op == "reshape" and not grouped):
        if n.op == "smul":
            scales.append(n.inputs[1])
        else:
            grouped = True
        removed.add(n.id)
        inner = n.inputs[0]
        if r.sole_user(inner) is not n:
            return None
        n = r.node(inner)
    product = n
    if product.op != "matmul" or product.params["activation"] != "NONE":
        return None
    keys_t = r.node(product.inputs[1])
    if keys_t.op != "transpose" or tuple(keys_t.params["perm"]) != (0, 1, 3, 2):
        return None
    present_k = _cache(r, keys_t.inputs[0])
    if present_k is None:
        return None
    past_k, k_heads = present_k.inputs
    kv_heads, size = past_k.shape[1], past_k.shape[3]
    if size % _HEAD_SIZE_MULTIPLE or heads % kv_heads or k_heads.shape != (batch, kv_heads, seq, size) \
            or past_k.shape[0] != batch or past_k.shape[2] + seq != total:
        return None
    group = heads // kv_heads
    if product.outputs[0].shape != ((batch, kv_heads, group * seq, total) if grouped else (batch, heads, seq, total)):
        return None
    # the rows back to the query heads: the grouping reshape, and scalings before or after it
    t, consumer, regrouped = product.inputs[0], product, False
    while r.sole_user(t) is consumer:
        step = r.node(t)
        if step.op == "smul" and step.inputs[1].shape == ():
            scales.append(step.inputs[1])
        elif step.op == "reshape" and grouped and not regrouped and t.shape == (batch, kv_heads, group * seq, size):
            regrouped = True
        else:
            break
        removed.add(step.id)
        consumer, t = step, step.inputs[0]
    if regrouped != grouped or t.shape != (batch, heads, seq, size) or (not grouped and group != 1):
        return None
    q_heads = t
    removed |= {product.id, keys_t.id, present_k.id}
    # after the softmax: the guard, the rows again, the values
    w, nan = softmax.out(), False
    step = r.sole_user(w)
    if step is not None and step.op == "nan_to_zero":
        nan, w = True, step.out()
        removed.add(step.id)
        step = r.sole_user(w)
    if grouped:
        if step is None or step.op != "reshape" or step.outputs[0].shape != (batch, kv_heads, group * seq, total):
            return None
        removed.add(step.id)
        w = step.out()
        step = r.sole_user(w)
    if step is None or step.op != "matmul" or step.inputs[0] != w or step.params["activation"] != "NONE":
        return None
    present_v = _cache(r, step.inputs[1])
    if present_v is None or present_v.outputs[0].shape != present_k.outputs[0].shape:
        return None
    past_v, v_heads = present_v.inputs
    removed |= {step.id, present_v.id}
    out = step.out()
    if grouped:
        back = r.sole_user(out)
        if back is None or back.op != "reshape" or back.outputs[0].shape != (batch, heads, seq, size):
            return None
        removed.add(back.id)
        step, out = back, back.out()
    anchor, merged = step, False
    # heads merged after it: transpose to [B, S, H, D], reshape to [B, S, H*D]
    t = r.sole_user(out)
    if t is not None and t.op == "transpose" and tuple(t.params["perm"]) == (0, 2, 1, 3):
        m = r.sole_user(t.out())
        if m is not None and m.op == "reshape" and m.outputs[0].shape == (batch, seq, heads * size):
            removed |= {t.id, m.id}
            anchor, merged = m, True
    # the caches: read by this attention alone, or outputs
    if not r.only_read_by(present_k.out(), removed) or not r.only_read_by(present_v.out(), removed):
        return None
    values = _mask_values(r, bias) if bias is not None else None
    if nan and values is not None and all(np.isfinite(v) for v in values):
        nan = False  # a finite mask leaves no row without keys: the softmax is never NaN
    # a mask of 0 and -inf: what the kernel's own causal mask hides, the export's hides as
    # well in a decoder (the second sizes' check, several tokens on a cache, sees one
    # where it does not), so the kernel runs with it and takes every input
    causal = values == {0.0, -np.inf}
    # where that mask is proved to be the causal one and an input's zeros, the kernel
    # reads that input: four operators in the place of the export's twenty
    return _Attention(anchor, merged, q_heads, scales, k_heads, v_heads, past_k, past_v, bias, present_k, present_v,
                      nan, causal, removed, r.key_mask(bias) if causal else None)


def _mask_values(r: _Reader, bias: Tensor) -> set | None:
    """The values ``bias`` takes where it is where(condition, a, b) of two constants (an
    exporter's 0 and -inf or the dtype's minimum), else None."""
    n = r.node(bias)
    if n.op != "where":
        return None
    values: set = set()
    for t in n.inputs[1:]:
        src = r.node(t)
        while src.op == "reshape":
            src = r.node(src.inputs[0])
        if src.op != WEIGHT.name:
            return None
        values |= {float(v) for v in np.asarray(r.g.weight_array(src)).ravel()}
    return values


_SWAP = (0, 2, 1, 3)  # [B, S, N, D] <-> [B, N, S, D]


def _heads_of(r: _Reader, t: Tensor):
    """(x, layout) where ``t`` is the [B, S, N*D] tensor ``x`` split into heads:
    reshaped to [B, S, N, D] ("bsnd") and then maybe swapped to [B, N, S, D] ("bnsd")."""
    n, layout = r.node(t), "bsnd"
    if n.op == "transpose" and tuple(n.params["perm"]) == _SWAP:
        t, n, layout = n.inputs[0], r.node(n.inputs[0]), "bnsd"
    if n.op != "reshape" or len(t.shape) != 4:
        return None
    x = n.inputs[0]
    b, s, heads, size = t.shape
    return (x, layout) if x.shape == (b, s, heads * size) else None


def _swaps(r: _Reader, t: Tensor) -> tuple[Tensor, int]:
    """``t`` with the [B, S, N, D] <-> [B, N, S, D] transposes on it peeled, and how many."""
    count = 0
    while r.node(t).op == "transpose" and tuple(r.node(t).params["perm"]) == _SWAP:
        t, count = r.node(t).inputs[0], count + 1
    return t, count


def _rotated_half(r: _Reader, t: Tensor):
    """(base, swaps) where ``t`` is rotate_half, concat(-second half, first half) along
    the last axis, of ``base`` transposed ``swaps`` times (the rules may have moved the
    heads' transposes between the halves, the negation and the concat)."""
    t, swaps = _swaps(r, t)
    cat = r.node(t)
    if cat.op != "concat" or len(cat.inputs) != 2 or len(t.shape) != 4 or cat.params["axis"] % 4 != 3:
        return None
    negated, inner = _swaps(r, cat.inputs[0])
    first, first_swaps = _swaps(r, cat.inputs[1])
    neg = r.node(negated)
    if neg.op != "opaque" or neg.params["op_type"] != "Neg" or len(neg.inputs) != 1:
        return None
    second, second_swaps = _swaps(r, neg.inputs[0])
    if (inner + second_swaps - first_swaps) % 2:
        return None
    split = r.node(first)
    half = t.shape[3] // 2
    if split.op != "split" or second.node != split.id or (first.index, second.index) != (0, 1) \
            or split.params["axis"] % 4 != 3 or tuple(split.params["sizes"]) != (half, half):
        return None
    base, base_swaps = _swaps(r, split.inputs[0])
    return base, swaps + first_swaps + base_swaps


def _equal_halves(r: _Reader, t: Tensor) -> bool:
    """Whether each row of ``t`` along its last axis is two equal halves, as rotary's
    angles are (cos(concat(f, f))): traced back through what acts on whole rows alike."""
    return _halves_chain(r, t) is not None


def _halves_chain(r: _Reader, t: Tensor):
    """(f, steps) where ``t`` is ``concat(f, f)`` along its last axis carried up
    through ``steps`` (each (node, the input that carries it), the last nearest ``t``)
    that act on whole rows alike: a reshape keeping the last axis, a product with a
    scalar or a tensor of last axis 1, cos and sin. Else None."""
    steps = []
    while True:
        n = r.node(t)
        if n.op == "concat" and len(n.inputs) == 2 and n.inputs[0] == n.inputs[1] \
                and n.params["axis"] % len(t.shape) == len(t.shape) - 1:
            return n.inputs[0], steps[::-1]
        if n.op == "reshape" and n.inputs[0].shape[-1:] == t.shape[-1:]:
            wide = n.inputs[0]
        elif n.op in ("smul", "ewmul") and len(n.inputs) == 2:
            wides = [u for u in n.inputs if u.shape[-1:] == t.shape[-1:]]
            if len(wides) != 1 or any(u.shape and u.shape[-1] != 1 for u in n.inputs if u is not wides[0]):
                return None
            wide = wides[0]
        elif n.op == "opaque" and n.params["op_type"] in ("Cos", "Sin") and len(n.inputs) == 1:
            wide = n.inputs[0]
        else:
            return None
        steps.append((n, wide))
        t = wide


def _rotary(r: _Reader, t: Tensor):
    """(x, cos, sin) where ``t`` [B, N, S, D] is ``x`` (of that shape) turned by rotary
    position embedding: x * cos + rotate_half(x) * sin, cos and sin [B or 1, 1, S, D]
    with equal halves; else None. (A partial rotary embedding turns a part of each head
    this way and concatenates the rest: the part is ``x``.)"""
    add = r.node(t)
    if add.op != "ewadd" or len(t.shape) != 4:
        return None
    b, _, s, d = t.shape
    angles = {(b, 1, s, d), (1, 1, s, d)}
    for plain, turned in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        m1, m2 = r.node(plain), r.node(turned)
        if m1.op != "ewmul" or m2.op != "ewmul":
            continue
        for x, cos in (m1.inputs, m1.inputs[::-1]):
            for half_view, sin in (m2.inputs, m2.inputs[::-1]):
                rotated = _rotated_half(r, half_view)
                if rotated is None or x.shape != t.shape or cos.shape not in angles or sin.shape != cos.shape \
                        or cos.dtype != t.dtype:
                    continue
                base, swaps = _swaps(r, x)
                if rotated[0] == base and (rotated[1] - swaps) % 2 == 0 \
                        and _equal_halves(r, cos) and _equal_halves(r, sin):
                    return x, cos, sin
    return None


def _constant(r: _Reader, t: Tensor, depth: int = 0):
    """The value of a tensor computed from weights alone (a scale and its factors), or None."""
    n = r.node(t)
    if n.op == WEIGHT.name:
        return r.g.weight_array(n)
    spec = OPS[n.op]
    if depth > 8 or spec.is_leaf or n.op == "opaque" or not n.inputs:
        return None
    values = [_constant(r, u, depth + 1) for u in n.inputs]
    if any(v is None for v in values):
        return None
    return spec.kernel(np, n.params, *values)[t.index]


def fuse_attention(g: Graph, classes: dict | None = None, form: str = "rotary",
                   key_masks: dict | None = None) -> Graph:
    """``g`` with a decoder's attention written in ``form`` (``options.ATTENTION_FORMS``):
    "rotary", each rotary position embedding ``_rotary`` recognizes made one ``rotary``;
    "kernel", also each attention over a cache ``_match`` recognizes made one ``gqa``
    (reading its queries and keys turned in the [B, S, N*D] layout); "none", ``g``.
    ``g`` itself where nothing matches. ``classes`` (tensor -> e-class, as
    ``convert.build_graph`` fills it) follows the rebuilt tensors, in place.
    ``key_masks`` (e-class -> input name): the masks proved to be the causal mask and
    that input's zeros (``onnx_io/key_masks.py``), which the kernel reads as the input."""
    if form == "none":
        return g
    r = _Reader(g, classes, key_masks)
    rotaries = {n.id: turned for n in g.topo_order() if n.op == "ewadd" and (turned := _rotary(r, n.out()))}
    found: dict[int, _Attention] = {}
    taken: set[int] = set()
    for n in g.topo_order() if form == "kernel" else ():
        a = _match(r, n) if n.op == "softmax" else None
        if a is not None and not (a.removed & taken):
            found[a.anchor.id] = a
            taken |= a.removed
    if not found and not rotaries:
        return g
    return _rebuild(g, r, found, taken, rotaries, classes)


def _rebuild(g: Graph, r: _Reader, found: dict[int, _Attention], removed: set[int], rotaries: dict,
             classes: dict | None) -> Graph:
    rb = Rebuild(g, classes)
    new, of = rb.new, rb.of
    lengths_from: dict = {}  # (query's batch and sequence, cache shape) -> the tensors read for them

    def merged_heads(t: Tensor) -> Tensor:
        """[B, N, S, D] -> [B, S, N*D]: the source where ``t`` is its own split into heads."""
        heads = _heads_of(r, t)
        if heads is not None and heads[1] == "bnsd":
            return of(heads[0])
        b, n, s, d = t.shape
        return new.reshape(new.transpose(of(t), _SWAP), (b, s, n * d))

    halves: dict = {}  # angles (cos or sin, [B, 1, S, D]) -> their first half, made once
    sources: dict = {}  # the f of concat(f, f) the angles come from -> it in ``new`` (cos and sin share it)

    def first_half(t: Tensor) -> Tensor:
        """The first half of angles ``t``: where they are concat(f, f) carried up by
        row-wise steps (``_halves_chain``), those steps on ``f`` (no concat, half the cos
        and sin, no split); else ``t`` split."""
        key = (t.node, t.index)
        if key not in halves:
            chain = _halves_chain(r, t)
            if chain is None:
                halves[key] = new.split(of(t), 3, (t.shape[3] // 2,) * 2)[0]
                return halves[key]
            f, steps = chain
            if (f.node, f.index) not in sources:
                sources[(f.node, f.index)] = _unexpanded(r, new, of, f)
            halves[key] = _on_half(new, of, sources[(f.node, f.index)], steps)
        return halves[key]

    batches: dict = {}  # angles -> the first tensor they turn, read for its batch size by all

    def batch_from(cos: Tensor, x: Tensor) -> Tensor:
        return batches.setdefault((cos.node, cos.index), x)

    def turned_source(t: Tensor):
        """(the [B, S, N*D] tensor, cos, sin) where ``t`` is a rotary embedding of a
        projection's output split into heads; else None."""
        turned = rotaries.get(t.node) if t.index == 0 else None
        heads = _heads_of(r, turned[0]) if turned is not None else None
        if heads is None or heads[1] != "bnsd":
            return None
        return of(heads[0]), turned[1], turned[2]

    def rotated_or_merged(t: Tensor) -> Tensor:
        """[B, N, S, D] -> [B, S, N*D]: turned by a rotary operator where ``t`` is a
        rotary embedding of a [B, S, N*D] tensor, else merged back."""
        source = turned_source(t)
        if source is None:
            return merged_heads(t)  # (turned in the heads' layout, where it is)
        x, cos, sin = source
        return new.add_node("rotary", [x, first_half(cos), first_half(sin), batch_from(cos, x)],
                            num_heads=t.shape[1])[0]

    def unturned(t: Tensor, size: int):
        """``turned_source(t)`` where it turns whole heads of a size the kernel turns
        itself, for the kernel to turn; else None."""
        source = turned_source(t)
        if source is None or source[1].shape[3] != size or size % _TURNING_HEAD_SIZE_MULTIPLE:
            return None
        return source

    def packed(q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
        """The one tensor ``q``, ``k`` and ``v`` are the three parts of, in order."""
        node = new.nodes[q.node]
        if node.op == "split" and len(node.params["sizes"]) == 3 and node.params["axis"] == 2 \
                and (q.index, k.node, k.index, v.node, v.index) == (0, q.node, 1, q.node, 2):
            return node.inputs[0]
        return None

    for n in g.topo_order():
        if n.id in found:
            a = found[n.id]
            size = a.q_heads.shape[3]
            q_turn, k_turn = unturned(a.q_heads, size), unturned(a.k_heads, size)
            # the kernel turns the queries and keys itself where both turn by the same angles
            turn = a.causal and q_turn is not None and k_turn is not None and q_turn[1:] == k_turn[1:]
            q = q_turn[0] if turn else rotated_or_merged(a.q_heads)
            scale = 1.0
            for factor in a.scales:  # a constant becomes the operator's scale, others stay on the queries
                value = _constant(r, factor)
                if value is not None and np.isfinite(value) and value != 0:
                    scale *= float(value)
                else:
                    q = new.add_node("smul", [q, of(factor)])[0]
            past_k = of(a.past_k)
            qkv = [q, k_turn[0] if turn else rotated_or_merged(a.k_heads), merged_heads(a.v_heads)]
            together = packed(*qkv) if turn else None
            ins = [together] if together is not None else qkv
            # the lengths are read from the first attention's query and cache of these
            # sizes, for every layer: computed once (the check at the second sizes,
            # where every symbol has another value, sees any that differ)
            sizes = lengths_from.setdefault((q.shape[:2], past_k.shape), (ins[0], past_k))
            ins += [past_k, of(a.past_v), *sizes]
            if turn:
                ins += [first_half(q_turn[1]), first_half(q_turn[2])]
            if a.bias is not None:
                ins.append(of(a.key_mask[0] if a.key_mask is not None else a.bias))
            out, present_k, present_v = new.add_node(
                "gqa", ins, num_heads=a.q_heads.shape[1], kv_num_heads=a.k_heads.shape[1], scale=scale,
                nan_to_zero=int(a.nan_to_zero), causal=int(a.causal), rotary=int(turn),
                packed=int(together is not None), key_mask=int(a.key_mask is not None),
                window=a.key_mask[1] if a.key_mask is not None else -1)
            if not a.merged:
                b, s, hd = out.shape
                heads = a.q_heads.shape[1]
                out = new.transpose(new.reshape(out, (b, s, heads, hd // heads)), (0, 2, 1, 3))
            for old, t in (((n.id, 0), out), ((a.present_k.id, 0), present_k), ((a.present_v.id, 0), present_v)):
                rb.keep(old, t)
            continue
        if n.id in removed:
            continue
        if n.id in rotaries:  # in the heads' layout, for the attention as exported
            heads, cos, sin = rotaries[n.id]
            heads = of(heads)
            rb.keep((n.id, 0), new.add_node("rotary", [heads, first_half(cos), first_half(sin),
                                                       batch_from(cos, heads)])[0])
            continue
        for i, t in enumerate(rb.copy(n)):
            rb.keep((n.id, i), t)
    return rb.finish()  # (without the heads' splits the operator reads past)


def _unexpanded(r: _Reader, new: Graph, of, f: Tensor) -> Tensor:
    """``f`` in ``new``; where it is transpose(matmul(expand(w), p)) (rotary's angles:
    the frequencies expanded over the batch, times the positions), transpose(matmul(w,
    p)) where ``w`` is 1 along every batch axis: matmul broadcasts it to the very same
    products, without the Expand and what computes its shape."""
    t = r.node(f)
    m = r.node(t.inputs[0]) if t.op == "transpose" else None
    e = r.node(m.inputs[0]) if m is not None and m.op == "matmul" and m.params["activation"] == "NONE" else None
    if e is None or e.op != "opaque" or e.params["op_type"] != "Expand":
        return of(f)
    w, wide, positions = e.inputs[0], m.inputs[0], m.inputs[1]
    if len(w.shape) != len(wide.shape) or w.shape[-2:] != wide.shape[-2:] or any(d != 1 for d in w.shape[:-2]):
        return of(f)
    # where the positions do not cover the expanded batch, the Expand stays
    if np.broadcast_shapes(w.shape[:-2], positions.shape[:-2]) + (w.shape[-2], positions.shape[-1]) \
            != m.outputs[0].shape:
        return of(f)
    return new.transpose(new.add_node("matmul", [of(w), of(positions)], activation="NONE")[0], t.params["perm"])


def _on_half(new: Graph, of, x: Tensor, steps) -> Tensor:
    """The row-wise ``steps`` of ``_halves_chain`` taken on ``x`` (``f`` in ``new``)
    instead of on concat(f, f): each row's first half of what they made."""
    for node, wide in steps:
        half = node.outputs[0].shape[:-1] + (node.outputs[0].shape[-1] // 2,)
        if node.op == "reshape":
            x = new.reshape(x, half)
        elif node.op == "opaque":
            params = dict(node.params, out_types=((half, node.outputs[0].dtype),))
            x = new.add_node("opaque", [x], **params)[0]
        else:
            x = new.add_node(node.op, [x if u is wide else of(u) for u in node.inputs])[0]
    return x
