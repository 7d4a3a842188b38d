"""4-bit products that read one activation, packed into one (``pack_nbits``).

onnxruntime's MatMulNBitsQuantizer quantizes each projection alone, so a decoder's q, k
and v (and gate and up) stay three (two) MatMulNBits over one input, each a kernel
call that streams its weight. Their weights are blocks along K, one column of N after
another ([N, K / block, block * bits / 8] bytes, a scale per column and block): the
columns of several products side by side are the product of their weights stacked
along N, byte for byte. So one MatMulNBits over the stacked bytes and scales, split
along its last axis, computes bit for bit what they did; nothing is requantized, and
the stored precision is the model's (only the order of its bytes changes).
"""

from __future__ import annotations

import re

import numpy as np

from ..graph import Graph
from ..ops import WEIGHT
from .join_moves import Rebuild


def _attributes(node) -> dict:
    from onnx import AttributeProto, helper

    return {a.name: helper.get_attribute_value(a) for a in map(AttributeProto.FromString, node.params["attrs"])}


def _packable(g: Graph, node) -> bool:
    """A MatMulNBits with stored weight bytes and scales and nothing else (no zero
    points, group indices or bias: what the symmetric quantizer writes)."""
    p = node.params
    return (node.op == "opaque" and p["op_type"] == "MatMulNBits" and p["domain"] == "com.microsoft"
            and len(node.inputs) == 3 and not p["empty_inputs"] and not p["captured"]
            and all(g.nodes[t.node].op == WEIGHT.name for t in node.inputs[1:]))


def pack_nbits(g: Graph, classes: dict | None = None) -> Graph:
    """``g`` with every set of packable MatMulNBits reading one tensor, with one K,
    bit width, block size and accuracy level, made one over their weights stacked
    along N and a split; ``g`` itself where there is none. ``classes`` (tensor ->
    e-class) follows the rebuilt tensors, in place: each part of the split is in the
    class of the output it replaces."""
    groups: dict = {}
    for n in g.topo_order():
        if _packable(g, n):
            attrs = _attributes(n)
            key = (n.inputs[0], n.params["opset"], tuple(sorted((k, v) for k, v in attrs.items() if k != "N")),
                   tuple(g.weight_array(g.nodes[t.node]).dtype.str for t in n.inputs[1:]))
            groups.setdefault(key, []).append(n)
    # written where the first of them is; the widest first, then by their weights' names,
    # numbers counted as numbers (a decoder's queries, keys, values as exporters number
    # or name them: the order the attention kernel reads them packed)
    packs = {members[0].id: sorted(members, key=lambda m: (-m.outputs[0].shape[-1], _natural(_weight_name(g, m))))
             for members in groups.values() if len(members) > 1}
    if not packs:
        return g
    later = {m.id for first, members in packs.items() for m in members if m.id != first}
    rb = Rebuild(g, classes)
    new = rb.new
    for n in g.topo_order():
        if n.id in later:
            continue
        if n.id not in packs:
            for i, t in enumerate(rb.copy(n)):
                rb.keep((n.id, i), t)
            continue
        members = packs[n.id]
        stacked = [np.concatenate([g.weight_array(g.nodes[m.inputs[i].node]) for m in members], axis=0)
                   for i in (1, 2)]
        weights = [new.new_weight(a.shape, data=a, name=_free(new, f"{n.name or 'matmul_nbits'}_packed_{part}"))
                   for a, part in zip(stacked, ("weight", "scales"))]
        widths = [m.outputs[0].shape[-1] for m in members]
        out = members[0].outputs[0]
        params = dict(n.params, attrs=_with_n(n, sum(widths)),
                      out_types=((out.shape[:-1] + (sum(widths),), out.dtype),))
        packed = new.add_node("opaque", [rb.of(n.inputs[0]), *weights], n.name, **params)[0]
        for m, part in zip(members, new.split(packed, len(out.shape) - 1, widths)):
            rb.keep((m.id, 0), part)
    return rb.finish()  # (without the weights the packed ones replace)


def _weight_name(g: Graph, node) -> str:
    return g.nodes[node.inputs[1].node].params["name"]


def _natural(name: str) -> tuple:
    """``name`` as a sort key whose digit runs compare as numbers (MatMul_99 < MatMul_100)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _free(g: Graph, base: str) -> str:
    """``base``, or ``base_K`` for the first K that no name of ``g`` takes."""
    name, k = base, 1
    while name in g._names:
        name, k = f"{base}_{k}", k + 1
    return name


def _with_n(node, n: int) -> tuple:
    from onnx import AttributeProto, helper

    blobs = []
    for blob in node.params["attrs"]:
        a = AttributeProto.FromString(blob)
        if a.name == "N":
            a = helper.make_attribute("N", n)
        blobs.append(a.SerializeToString(deterministic=True))
    return tuple(blobs)
