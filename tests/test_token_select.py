"""A Gather of one known index (ViT's q/k/v selection and class token) imports as a
part of a split, and the class-token select moves up through the last layer's
per-token operators (the split-* rules, part 0 here), so that only token 0 of its MLP,
LayerNorms, residual adds and out-projection is computed."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import helper

import taso_egg
from taso_egg.product.optimize_graph import extract_graph
from taso_egg.cost import AnalyticCost
from taso_egg.egraph.saturate import saturate
from taso_egg.rules.corpus import load_corpus
from test_onnx_io import ops_of, rand, roundtrip

from conftest import check_against_ort, init, make_model, vi

S, E, H = 20, 8, 2  # tokens (longer than the all-indices split's limit), width, heads


def _n(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def _vit_block():
    """One pre-norm encoder layer and the class-token head, as torch.onnx writes
    torchvision's ViT: a packed q/k/v projection split by three single-index Gathers,
    sequence-first attention, Gemm out-projection, an erf GELU MLP, the final
    LayerNorm and a Gather of token 0."""
    d = E // H
    c = lambda name, v: init(name, np.asarray(v, np.int64))  # noqa: E731
    inits = [init(f"ln{i}_{k}", rand(E) + (1.0 if k == "s" else 0.0)) for i in (1, 2, 3) for k in "sb"]
    inits += [init("w_qkv", rand(E, 3 * E)), init("b_qkv", rand(3 * E)), init("w_o", rand(E, E)),
              init("b_o", rand(E)), init("w1", rand(E, 2 * E)), init("b1", rand(2 * E)),
              init("w2", rand(2 * E, E)), init("b2", rand(E)), init("w_h", rand(3, E)), init("b_h", rand(3)),
              init("sqrt2", np.array(1.4142135, np.float32)), init("one", np.array(1.0, np.float32)),
              init("half", np.array(0.5, np.float32)), init("scale", np.array(d ** -0.25, np.float32)),
              c("sh_qkv", [S, 1, 3, E]), c("ax0", [0]), c("ax3", [3]), c("i0", 0), c("i1", 1), c("i2", 2),
              c("sh_head", [S, H, d]), c("sh_b", [1, H, S, d]), c("sh_o", [S, E]), c("sh_o3", [S, 1, E])]
    nodes = [
        _n("LayerNormalization", ["x", "ln1_s", "ln1_b"], ["h"], axis=-1, epsilon=1e-6),
        _n("Transpose", ["h"], ["ht"], perm=[1, 0, 2]),
        _n("MatMul", ["ht", "w_qkv"], ["qkv0"]), _n("Add", ["b_qkv", "qkv0"], ["qkv1"]),
        _n("Reshape", ["qkv1", "sh_qkv"], ["qkv2"]), _n("Unsqueeze", ["qkv2", "ax0"], ["qkv3"]),
        _n("Transpose", ["qkv3"], ["qkv4"], perm=[3, 1, 2, 0, 4]), _n("Squeeze", ["qkv4", "ax3"], ["qkv"])]
    for name, i in (("q", "i0"), ("k", "i1"), ("v", "i2")):
        nodes += [_n("Gather", ["qkv", i], [f"{name}0"], axis=0),
                  _n("Reshape", [f"{name}0", "sh_head"], [f"{name}1"]),
                  _n("Transpose", [f"{name}1"], [f"{name}2"], perm=[1, 0, 2]),
                  _n("Reshape", [f"{name}2", "sh_b"], [f"{name}3"])]
    nodes += [
        _n("Mul", ["q3", "scale"], ["qs"]), _n("Transpose", ["k3"], ["kt"], perm=[0, 1, 3, 2]),
        _n("Mul", ["kt", "scale"], ["ks"]), _n("MatMul", ["qs", "ks"], ["att"]),
        _n("Softmax", ["att"], ["p"], axis=-1), _n("MatMul", ["p", "v3"], ["o0"]),
        _n("Transpose", ["o0"], ["o1"], perm=[2, 0, 1, 3]), _n("Reshape", ["o1", "sh_o"], ["o2"]),
        _n("Gemm", ["o2", "w_o", "b_o"], ["o3"]), _n("Reshape", ["o3", "sh_o3"], ["o4"]),
        _n("Transpose", ["o4"], ["o5"], perm=[1, 0, 2]), _n("Add", ["o5", "x"], ["r1"]),
        _n("LayerNormalization", ["r1", "ln2_s", "ln2_b"], ["m0"], axis=-1, epsilon=1e-6),
        _n("MatMul", ["m0", "w1"], ["m1"]), _n("Add", ["b1", "m1"], ["m2"]),
        _n("Div", ["m2", "sqrt2"], ["g0"]), _n("Erf", ["g0"], ["g1"]), _n("Add", ["g1", "one"], ["g2"]),
        _n("Mul", ["m2", "g2"], ["g3"]), _n("Mul", ["g3", "half"], ["g4"]),
        _n("MatMul", ["g4", "w2"], ["m3"]), _n("Add", ["b2", "m3"], ["m4"]), _n("Add", ["m4", "r1"], ["r2"]),
        _n("LayerNormalization", ["r2", "ln3_s", "ln3_b"], ["f"], axis=-1, epsilon=1e-6),
        _n("Gather", ["f", "i0"], ["cls"], axis=1), _n("Gemm", ["cls", "w_h", "b_h"], ["y"], transB=1)]
    return make_model(nodes, [vi("x", [1, S, E])], [vi("y", [1, 3])], inits)


def _split_rules():
    return [r for r in load_corpus() if r.name.startswith("split-") or r.name.startswith("gelu-from-erf")]


def _flops_of_matmuls(g):
    return sum(2 * np.prod(n.outputs[0].shape) * n.inputs[0].shape[-1] for n in g.nodes.values()
               if n.op == "matmul")


@pytest.mark.parametrize("index, axis, shape", [(0, 1, [2, 20, 3]), (7, 1, [2, 20, 3]), (-1, 1, [2, 20, 3]),
                                                (2, 0, [3, 4, 5]), (1, 2, [2, 3, 4])])
def test_a_gather_of_one_index_is_a_split_part(index, axis, shape):
    model = make_model([_n("Gather", ["x", "i"], ["y"], axis=axis)], [vi("x", shape)], [vi("y", None)],
                       [init("i", np.array(index, np.int64))])
    g, exported = roundtrip(model)
    assert ops_of(g) == {"split": 1, "reshape": 1}
    # only one part is read: exported as one Slice, not a Split copying every part
    assert Counter(n.op_type for n in exported.graph.node) == {"Slice": 1, "Reshape": 1}


def test_a_gather_of_a_one_element_vector_keeps_the_axis():
    model = make_model([_n("Gather", ["x", "i"], ["y"], axis=1)], [vi("x", [2, 20, 3])], [vi("y", None)],
                       [init("i", np.array([3], np.int64))])
    g, _ = roundtrip(model)
    assert ops_of(g) == {"split": 1}


@pytest.mark.parametrize("starts, ends, axes, parts", [
    ([0], [1], [1], 1), ([3], [9], [1], 1), ([-4], [100], [2], 1), ([0, 1], [1, 3], [0, 2], 2), ([0], [20], [1], 0)])
def test_a_slice_by_known_bounds_is_split_parts(starts, ends, axes, parts):
    c = lambda name, v: init(name, np.array(v, np.int64))  # noqa: E731
    model = make_model([_n("Slice", ["x", "s", "e", "a"], ["y"])], [vi("x", [2, 20, 6])], [vi("y", None)],
                       [c("s", starts), c("e", ends), c("a", axes)])
    g, _ = roundtrip(model)
    assert ops_of(g) == ({"split": parts} if parts else {})


def test_a_slice_with_a_step_stays_opaque():
    c = lambda name, v: init(name, np.array(v, np.int64))  # noqa: E731
    model = make_model([_n("Slice", ["x", "s", "e", "a", "st"], ["y"])], [vi("x", [2, 20, 6])], [vi("y", None)],
                       [c("s", [0]), c("e", [20]), c("a", [1]), c("st", [2])])
    g, _ = roundtrip(model, opaque_ok={"Slice"})
    assert ops_of(g) == {"opaque": 1}


def test_the_optimized_block_reimports_its_slices():
    """What optimize writes (a Slice for a split with one part read) reads back onto
    the table (onnxruntime's contrib Gelu, which opset 17 exports, does not yet)."""
    g = taso_egg.load_onnx(_vit_block())
    out = extract_graph(saturate(g, rules=_split_rules()), cost_model=AnalyticCost()).graph
    assert "Slice" in {n.op_type for n in taso_egg.export_onnx(out).graph.node}
    again, _ = roundtrip(taso_egg.export_onnx(out), opaque_ok={"Gelu"})
    assert ops_of(again)["split"] >= 3


def test_vit_block_imports_with_no_opaque_node_and_one_qkv_split():
    g, exported = roundtrip(_vit_block())
    assert ops_of(g)["opaque"] == 0
    # q, k and v: a split each, one part read from each (a Slice, as the Gather was)
    assert Counter(n.op_type for n in exported.graph.node)["Slice"] == 4
    # the three splits are one e-node: extracted, one Split whose three parts are read
    out = extract_graph(saturate(g, rules=[]), cost_model=AnalyticCost()).graph
    _, exported = check_against_ort(out)
    assert Counter(n.op_type for n in exported.graph.node)["Split"] == 1


def test_class_token_select_moves_up_to_the_out_projection():
    """Saturated with the token-select rules, the extracted block computes the last
    layer's MLP and out-projection for token 0 alone: its matmuls do about 1/S of that
    work, and the result agrees with onnxruntime on the original."""
    model = _vit_block()
    g = taso_egg.load_onnx(model)
    sat = saturate(g, rules=_split_rules())
    out = extract_graph(sat, cost_model=AnalyticCost()).graph
    rows = sorted(n.inputs[0].shape[-2] if len(n.inputs[0].shape) > 1 else 1
                  for n in out.nodes.values() if n.op == "matmul" and n.inputs[1].shape in ((E, 2 * E), (2 * E, E)))
    assert rows == [1, 1]  # the MLP's two matmuls, on one token
    assert _flops_of_matmuls(out) < 0.7 * _flops_of_matmuls(g)
    feeds = {"x": rand(1, S, E)}
    ours, exported = check_against_ort(out, feeds)
    from test_onnx_io import onnx_outputs
    want = onnx_outputs(model, feeds)["y"]
    np.testing.assert_allclose(ours["y"], want, rtol=1e-4, atol=1e-5)


def test_without_the_rules_every_token_is_computed():
    g = taso_egg.load_onnx(_vit_block())
    sat = saturate(g, rules=[r for r in _split_rules() if not r.name.startswith("split-")])
    out = extract_graph(sat, cost_model=AnalyticCost()).graph
    rows = [n.inputs[0].shape[-2] for n in out.nodes.values()
            if n.op == "matmul" and n.inputs[1].shape == (2 * E, E)]
    assert rows == [S]


def test_a_select_of_another_token_is_not_pushed_through_a_layernorm_of_its_axis():
    """A part along the normalized axis is not a layernorm of the part: the rule's guard
    keeps it from firing there."""
    model = make_model([_n("LayerNormalization", ["x", "s", "b"], ["h"], axis=-1),
                        _n("Gather", ["h", "i"], ["y"], axis=2)],
                       [vi("x", [2, 3, 20])], [vi("y", None)],
                       [init("s", rand(20)), init("b", rand(20)), init("i", np.array(0, np.int64))])
    g = taso_egg.load_onnx(model)
    out = extract_graph(saturate(g, rules=_split_rules()), cost_model=AnalyticCost()).graph
    ln = [n for n in out.nodes.values() if n.op == "layernorm"]
    assert [n.inputs[0].shape for n in ln] == [(2, 3, 20)]
    check_against_ort(out)
