"""The rewrites real exports need (issue 16, items 0 and 2), on small models built with
onnx.helper: a conv with a bias folds the batchnorm after it, merged convs keep their
biases next to the conv, a 1x1 conv without padding is SAME, and a scalar factor or
divisor moves into the weights before it. Each goes in as ONNX, through ``optimize``
and back out, and is compared with the input in onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import helper

import taso_egg
from taso_egg.check.runtime import onnx_outputs
from taso_egg.cost import AnalyticCost
from taso_egg.egraph.saturate import Limits, saturate
from taso_egg.options import OptimizeOptions
from taso_egg.rules.corpus import load_corpus

from conftest import assert_close, init, make_model, vi

RNG = np.random.default_rng(16)
CORPUS = {r.name: r for r in load_corpus()}


def rand(*shape, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


def rules(*names):
    missing = [n for n in names if n not in CORPUS]
    assert not missing, f"not proved in the corpus: {missing}"
    return [CORPUS[n] for n in names]


class ConvCount:
    """Each conv costs 1, any other kernel 0.01: a cost model under which merging
    convs pays, to test what a merged result is written as. (On the analytic CPU costs
    two convs of one input cost about what the merge and its split cost, once a conv's
    bias add is priced as fused into it, as it runs.)"""

    name = "conv count"

    def cost(self, config) -> float:
        if config.op in ("input", "weight") or config.weight_only:
            return 0.0
        return 1.0 if config.op == "conv2d" else 0.01


def optimized(model, rule_names, cost_model=None):
    """The written model of ``optimize`` with these rules, analytic costs (unless
    given) and no min_gain, checked against the input in onnxruntime."""
    g = taso_egg.load_onnx(model)
    res = taso_egg.optimize(g, rules=rules(*rule_names), reference=model, options=OptimizeOptions().replace(model=cost_model or AnalyticCost(), min_gain=0.0, measure=0))
    assert res.stats.chosen == "result", res.stats.kept_input
    out = taso_egg.export_onnx(res.graph)
    feeds = taso_egg.random_inputs(g, 3)
    assert_close(onnx_outputs(model, feeds), onnx_outputs(out, feeds), 1e-5)
    return out


def producers(model):
    return {o: n for n in model.graph.node for o in n.output}


def types(model):
    return Counter(n.op_type for n in model.graph.node)


# --- batchnorm after a conv with a bias --------------------------------------------------

def test_conv_with_bias_and_batchnorm_exports_as_one_conv():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["y"])]
    inits = [init("w", rand(8, 4, 3, 3)), init("b", rand(8)), init("s", rand(8, positive=True)),
             init("bb", rand(8)), init("m", rand(8)), init("v", rand(8, positive=True))]
    model = make_model(nodes, [vi("x", [1, 4, 6, 6])], [vi("y", None)], inits)
    # the bias-less fold does not see through the bias add the bridge writes
    g = taso_egg.load_onnx(model)
    sat = saturate(g, rules=rules("conv-batchnorm-fold"), limits=Limits(iterations=2))
    assert not any(it.matches for it in sat.iterations)
    out = optimized(model, ["conv-bias-batchnorm-fold"])
    assert types(out) == {"Conv": 1, "Relu": 1}
    (conv,) = [n for n in out.graph.node if n.op_type == "Conv"]
    initializers = {t.name for t in out.graph.initializer}
    assert len(conv.input) == 3 and set(conv.input[1:]) <= initializers  # folded at export


# --- merged convs carry their biases -------------------------------------------------------

def _two_convs(relu_both: bool, k2: int = 3):
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["y1"]),
             helper.make_node("Conv", ["x", "w2", "b2"], ["c2" if relu_both else "y2"], pads=[k2 // 2] * 4)]
    if relu_both:
        nodes.append(helper.make_node("Relu", ["c2"], ["y2"]))
    inits = [init("w1", rand(16, 8, 3, 3)), init("b1", rand(16)), init("w2", rand(24, 8, k2, k2)),
             init("b2", rand(24))]
    return make_model(nodes, [vi("x", [1, 8, 10, 10])], [vi("y1", None), vi("y2", None)], inits)


MERGES = ("merge-conv-shared-input", "merge-conv-bias-shared-input", "relu-split-0", "relu-split-1")


def test_merged_convs_keep_their_biases_on_the_conv():
    """Conv(bias) -> Split -> Relu, which onnxruntime runs as one conv with its bias,
    not Conv -> Split -> Add -> Relu (the bias-less merge alone gives that)."""
    out = optimized(_two_convs(relu_both=False), MERGES, ConvCount())
    assert types(out) == {"Conv": 1, "Split": 1, "Relu": 1}
    prod = producers(out)
    (conv,) = [n for n in out.graph.node if n.op_type == "Conv"]
    (relu,) = [n for n in out.graph.node if n.op_type == "Relu"]
    assert len(conv.input) == 3 and prod[relu.input[0]].op_type == "Split"


def test_merged_convs_with_relus_relu_before_the_split():
    out = optimized(_two_convs(relu_both=True), MERGES, ConvCount())
    assert types(out) == {"Conv": 1, "Relu": 1, "Split": 1}
    prod = producers(out)
    (split,) = [n for n in out.graph.node if n.op_type == "Split"]
    relu = prod[split.input[0]]
    assert relu.op_type == "Relu" and len(prod[relu.input[0]].input) == 3  # Conv(x, w, b)


# --- padding: a 1x1 conv without padding is SAME -------------------------------------------

@pytest.mark.parametrize("attrs", [dict(), dict(pads=[0, 0, 0, 0]), dict(auto_pad="VALID"),
                                   dict(pads=[0, 0, 0, 0], strides=[2, 2])])
def test_1x1_conv_without_padding_imports_as_same_and_round_trips(attrs):
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    model = make_model([node], [vi("x", [1, 4, 7, 7])], [vi("y", None)], [init("w", rand(6, 4, 1, 1))])
    g = taso_egg.load_onnx(model)
    (conv,) = [n for n in g.nodes.values() if n.op == "conv2d"]
    assert conv.params["padding"] == "SAME"
    out = taso_egg.export_onnx(g)
    (exported,) = out.graph.node
    attributes = {a.name: helper.get_attribute_value(a) for a in exported.attribute}
    assert attributes["pads"] == [0, 0, 0, 0] and "auto_pad" not in attributes
    feeds = taso_egg.random_inputs(g, 0)
    assert_close(onnx_outputs(model, feeds), onnx_outputs(out, feeds), 1e-6)


@pytest.mark.parametrize("kernel, attrs, padding", [
    (3, dict(), "VALID"),                       # zero pads, but SAME would pad a 3x3
    (1, dict(pads=[1, 1, 1, 1]), (1, 1, 1, 1)),  # padding a 1x1 conv is not SAME
    (3, dict(pads=[1, 1, 1, 1]), "SAME"),
])
def test_other_paddings_keep_their_form(kernel, attrs, padding):
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    model = make_model([node], [vi("x", [1, 4, 7, 7])], [vi("y", None)],
                       [init("w", rand(6, 4, kernel, kernel))])
    (conv,) = [n for n in taso_egg.load_onnx(model).nodes.values() if n.op == "conv2d"]
    assert conv.params["padding"] == padding


def test_a_1x1_conv_beside_a_3x3_one_is_enlarged_and_merged():
    g = taso_egg.load_onnx(_two_convs(relu_both=True, k2=1))
    sat = saturate(g, rules=rules("merge-conv-bias-enlarge"), limits=Limits(iterations=2))
    assert sat.iterations[0].matches == {"merge-conv-bias-enlarge": 1}


# --- a scalar factor or divisor moves into the weights ---------------------------------------

SCALAR_RULES = ("ewadd-commutative", "smul-into-matmul-weight", "smul-through-bias", "smul-through-transpose",
                "smul-through-reshape", "scalar-div-into-matmul-weight", "div-through-bias",
                "scalar-div-through-transpose", "scalar-div-through-reshape",
                "scalar-div-into-conv-weight", "smul-into-conv-weight", "smul-through-matmul-left",
                "scalar-div-through-matmul-left")


def _attention_scores(scale_op: str):
    """softmax(q k^T * c) with q, k = x W + b split into heads, as transformers' exports
    write it: Mul of q by a 0-d constant after the transpose (SDPA), or Div of the
    scores by sqrt(d)."""
    b, s, h, heads = 1, 6, 8, 2
    d = h // heads
    nodes = []
    for n in "qk":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}m"]),
                  helper.make_node("Add", [f"b{n}", f"{n}m"], [f"{n}a"]),
                  helper.make_node("Reshape", [f"{n}a", "heads"], [f"{n}r"])]
    nodes += [helper.make_node("Transpose", ["qr"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["kr"], ["kt"], perm=[0, 2, 3, 1])]
    if scale_op == "Mul":
        c = np.float32(d ** -0.5)
        nodes += [helper.make_node("Mul", ["qt", "c"], ["qs"]), helper.make_node("MatMul", ["qs", "kt"], ["sc"])]
    else:
        c = np.float32(d ** 0.5)
        nodes += [helper.make_node("MatMul", ["qt", "kt"], ["s0"]), helper.make_node("Div", ["s0", "c"], ["sc"])]
    nodes.append(helper.make_node("Softmax", ["sc"], ["y"], axis=-1))
    inits = [init("wq", rand(h, h)), init("bq", rand(h)), init("wk", rand(h, h)), init("bk", rand(h)),
             init("heads", np.array([b, s, heads, d], np.int64)), init("c", np.array(c))]
    return make_model(nodes, [vi("x", [b, s, h])], [vi("y", None)], inits)


@pytest.mark.parametrize("scale_op", ["Mul", "Div"])
def test_attention_scale_folds_into_the_query_weights(scale_op):
    model = _attention_scores(scale_op)
    assert types(model)[scale_op] == 1
    out = optimized(model, SCALAR_RULES)
    assert scale_op not in types(out) and types(out)["MatMul"] == 3


def test_a_divisor_after_a_conv_and_its_bias_folds_into_both():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Div", ["c", "d"], ["y"])]
    model = make_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", None)],
                       [init("w", rand(5, 3, 3, 3)), init("b", rand(5)), init("d", np.array(np.float32(3.0)))])
    out = optimized(model, SCALAR_RULES)
    (conv,) = out.graph.node
    assert conv.op_type == "Conv" and len(conv.input) == 3


# --- a conv with its bias and activation is priced as the one kernel it is written as ------

def test_extraction_prices_a_biased_conv_as_the_fused_conv_it_writes():
    # conv+bias+relu twice and a residual add: the e-graph holds each as a three-input
    # conv e-node (convert.add_fused_convs), so the extractor's objective is what the
    # written graph costs, not conv + broadcast add + relu apart.
    from taso_egg.product.optimize_graph import extract_graph
    from taso_egg.cost import graph_cost
    from taso_egg.egraph.saturate import saturate

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["y"])]
    inits = [init("w1", rand(8, 8, 3, 3)), init("b1", rand(8)), init("w2", rand(8, 8, 3, 3)), init("b2", rand(8))]
    model = make_model(nodes, [vi("x", [1, 8, 10, 10])], [vi("y", None)], inits)
    g = taso_egg.load_onnx(model)
    sat = saturate(g, rules=[], count_classes=False)
    fused = [n for nodes in sat.tensor_egraph().classes.values() for n in nodes
             if n.op == "conv2d" and len(n.children) == 3]
    assert sorted(n.params["activation"] for n in fused) == ["NONE", "NONE", "RELU"]
    cost_model = AnalyticCost()
    ext = extract_graph(sat, "ilp", cost_model)
    assert ext.dag_cost == pytest.approx(graph_cost(ext.graph, cost_model), rel=1e-12)
    assert graph_cost(ext.graph, cost_model) < graph_cost(g, cost_model)  # the relu fused too
    assert sorted((n.op, len(n.inputs)) for n in ext.graph.nodes.values() if n.op not in ("input", "weight")) \
        == [("conv2d", 3), ("conv2d", 3), ("ewadd", 2)]
