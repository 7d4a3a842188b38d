"""The operators of real exports' last opaque nodes (issue 16, item 1): each ONNX
form imports onto the table, round-trips and matches onnxruntime; a BERT-like
attention block with its mask imports with no opaque node; only an embedding lookup
stays opaque."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import taso_egg
from taso_egg.product.optimize_graph import extract_graph
from taso_egg.egraph.saturate import saturate
from taso_egg.options import OptimizeOptions
from test_onnx_io import ops_of, rand, roundtrip

from conftest import check_against_ort, init, make_model, vi


def _one(op_type, inputs, inits=(), opset=17, **attrs):
    return make_model([helper.make_node(op_type, [n for n in ("x", "c1", "c2")[:inputs]], ["y"], **attrs)],
                      [vi("x", [2, 3, 8])], [vi("y", None)], inits, opset=opset)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_imports_as_gelu(approximate):
    g, exported = roundtrip(_one("Gelu", 1, opset=20, approximate=approximate))
    assert ops_of(g) == {"gelu": 1}
    assert [n.op_type for n in exported.graph.node] == ["Gelu"]


@pytest.mark.parametrize("bounds, op", [((0.0, 6.0), "relu6"), ((0.0, None), "relu"), ((-1.0, 1.0), "opaque")])
def test_clip_imports_as_relu6_or_relu(bounds, op):
    lo, hi = bounds
    inputs = ["x", "lo", "" if hi is None else "hi"]
    inits = [init("lo", np.array(lo, np.float32))] + ([] if hi is None else [init("hi", np.array(hi, np.float32))])
    model = make_model([helper.make_node("Clip", inputs, ["y"])], [vi("x", [2, 3, 8])], [vi("y", None)], inits)
    feeds = {"x": np.linspace(-9, 9, 48).reshape(2, 3, 8).astype(np.float32)}
    g, _ = roundtrip(model, feeds=feeds, opaque_ok={"Clip"})
    assert ops_of(g) == {op: 1}


def test_relu6_fuses_into_its_conv():
    """Conv -> Clip(0, 6), MobileNet's block, saturates into one conv with RELU6."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = [init("w", rand(4, 3, 3, 3)), init("lo", np.array(0, np.float32)), init("hi", np.array(6, np.float32))]
    model = make_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", None)], inits)
    g, _ = roundtrip(model)
    out = extract_graph(saturate(g)).graph
    assert [n.params["activation"] for n in out.nodes.values() if n.op == "conv2d"] == ["RELU6"]
    assert "relu6" not in ops_of(out)
    ours, exported = check_against_ort(out)
    assert [n.op_type for n in exported.graph.node] == ["Conv", "Clip"]


def test_pow_with_a_constant_exponent():
    g, _ = roundtrip(_one("Pow", 2, [init("c1", np.array(3.0, np.float32))]))
    assert ops_of(g) == {"pow": 1}
    # a run-time exponent is another operator
    model = make_model([helper.make_node("Pow", ["x", "e"], ["y"])], [vi("x", [4]), vi("e", [4])], [vi("y", None)])
    g, _ = roundtrip(model, feeds={"x": np.arange(1, 5, dtype=np.float32), "e": np.full(4, 2, np.float32)},
                     opaque_ok={"Pow"})
    assert ops_of(g) == {"opaque": 1}


def _attention_with_mask():
    """BERT's attention scores with its mask, as torch exports it: the int64
    attention_mask cast to bool, given two axes by a Gather of every index, and-ed with
    a constant causal-style mask, expanded, turned into an additive mask by Where; then
    Softmax -> IsNaN -> Where(isnan, 0, p), SDPA's guard for fully masked rows."""
    s = helper.make_node
    nodes = [
        s("Cast", ["mask"], ["flag"], to=TP.BOOL),
        s("Reshape", ["flag", "col"], ["flag_col"]),
        s("Gather", ["flag_col", "every"], ["flag4"], axis=0),
        s("Reshape", ["flag4", "row"], ["flag_row"]),
        s("And", ["keep", "flag_row"], ["both"]),
        s("Expand", ["both", "full"], ["both_full"]),
        s("Where", ["both_full", "zero1", "neginf"], ["additive"]),
        s("Add", ["scores", "additive"], ["masked"]),
        s("Softmax", ["masked"], ["p"], axis=-1),
        s("IsNaN", ["p"], ["nan"]),
        s("Where", ["nan", "zero0", "p"], ["y"]),
        s("Equal", ["mask", "one64"], ["eq"]),
    ]
    inits = [init("col", np.array([4, 1], np.int64)), init("every", np.arange(4, dtype=np.int64).reshape(1, 1, 1, 4)),
             init("row", np.array([1, 1, 1, 4], np.int64)), init("keep", np.ones((1, 1, 4, 1), bool)),
             init("full", np.array([1, 2, 4, 4], np.int64)), init("zero1", np.zeros(1, np.float32)),
             init("neginf", np.full(1, -np.inf, np.float32)), init("zero0", np.array(0, np.float32)),
             init("one64", np.array(1, np.int64))]
    return make_model(nodes, [vi("scores", [1, 2, 4, 4]), vi("mask", [1, 4], TP.INT64)],
                      [vi("y", None), vi("eq", None, TP.BOOL)], inits)


@pytest.mark.filterwarnings("ignore:invalid value")  # softmax of a fully masked row: NaN, as in ONNX
@pytest.mark.parametrize("mask", [[1, 1, 0, 1], [0, 0, 0, 0]], ids=["some-masked", "all-masked"])
def test_attention_mask_block_imports_with_no_opaque_node(mask):
    feeds = {"scores": np.linspace(-2, 2, 32).reshape(1, 2, 4, 4).astype(np.float32),
             "mask": np.array([mask], np.int64)}
    g, exported = roundtrip(_attention_with_mask(), feeds=feeds)
    counts = ops_of(g)
    assert counts["opaque"] == 0
    assert {"cast", "logical_and", "expand", "where", "nan_to_zero", "equal", "softmax"} <= set(counts)
    y = taso_egg.run(g, feeds)["y"]
    assert np.isfinite(y).all() and (y.sum(-1) == 0).all() == (not any(mask))
    onnx.checker.check_model(exported)


def test_the_mask_block_optimizes_and_checks():
    """optimize takes the mask operators through the e-graph (bool and int64 classes
    typed by OpSpec.out_dtype), extraction prices them, and the check passes."""
    g = taso_egg.load_onnx(_attention_with_mask())
    result = taso_egg.optimize(g, options=OptimizeOptions().replace(measure=0))
    assert Counter(n.op for n in result.graph.nodes.values())["opaque"] == 0
    feeds = {"scores": np.linspace(-2, 2, 32).reshape(1, 2, 4, 4).astype(np.float32),
             "mask": np.array([[1, 0, 1, 1]], np.int64)}
    want, got = taso_egg.run(g, feeds), taso_egg.run(result.graph, feeds)
    assert all(np.array_equal(want[k], got[k]) for k in want)


def test_only_an_embedding_lookup_stays_opaque():
    """A Gather of rows by a run-time index (an embedding) is opaque; a Gather of a known
    table by known indices folds; one of every index in order is a reshape."""
    s = helper.make_node
    nodes = [s("Gather", ["table", "ids"], ["emb"], axis=0),
             s("Gather", ["table", "pos"], ["pos_emb"], axis=0),
             s("Add", ["emb", "pos_emb"], ["y"])]
    inits = [init("table", rand(10, 8)), init("pos", np.array([[0, 1, 2]], np.int64))]
    model = make_model(nodes, [vi("ids", [1, 3], TP.INT64)], [vi("y", None)], inits)
    g, _ = roundtrip(model, feeds={"ids": np.array([[4, 0, 9]], np.int64)}, opaque_ok={"Gather"})
    assert ops_of(g) == {"opaque": 1, "ewadd": 1}
    gnd = make_model([s("GatherND", ["x", "idx"], ["y"])], [vi("x", [2, 3])], [vi("y", None)],
                     [init("idx", np.indices((2, 3)).reshape(2, -1).T.reshape(1, 6, 2))])
    g, _ = roundtrip(gnd)
    assert ops_of(g) == {"reshape": 1}
    shuffled = make_model([s("GatherND", ["x", "idx"], ["y"])], [vi("x", [2, 3])], [vi("y", None)],
                          [init("idx", np.indices((2, 3)).reshape(2, -1).T[::-1].reshape(1, 6, 2))])
    g, _ = roundtrip(shuffled, opaque_ok={"GatherND"})
    assert ops_of(g) == {"opaque": 1}


def test_cast_to_its_own_dtype_and_expand_to_its_own_shape_vanish():
    s = helper.make_node
    model = make_model([s("Cast", ["x"], ["c"], to=TP.FLOAT), s("Expand", ["c", "shape"], ["e"]),
                        s("Relu", ["e"], ["y"])],
                       [vi("x", [2, 3])], [vi("y", None)], [init("shape", np.array([1, 3], np.int64))])
    g, _ = roundtrip(model)
    assert ops_of(g) == {"relu": 1}


@pytest.mark.parametrize("half_first", [False, True], ids=["half-last", "half-first"])
@pytest.mark.parametrize("swap", [False, True], ids=["x-first", "x-second"])
def test_decomposed_gelu_is_recognized(half_first, swap):
    """Div(x, sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5, as torch exports GELU (and its
    operand orders), saturates into one gelu (rules gelu-from-erf*, proved from
    ax-gelu-erf), which exports as onnxruntime's Gelu before opset 20 and runs there."""
    s = helper.make_node
    mul = (lambda a, b, o: s("Mul", [b, a], [o])) if swap else (lambda a, b, o: s("Mul", [a, b], [o]))
    head = [s("Div", ["x", "sqrt2"], ["d"]), s("Erf", ["d"], ["e"]), s("Add", ["e", "one"], ["a"])]
    if half_first:
        tail = [mul("x", "half", "h"), mul("h", "a", "y")]
    else:
        tail = [mul("x", "a", "m"), mul("m", "half", "y")]
    inits = [init("sqrt2", np.array(math.sqrt(2), np.float32)), init("one", np.array(1, np.float32)),
             init("half", np.array(0.5, np.float32))]
    model = make_model(head + tail, [vi("x", [2, 3, 8])], [vi("y", None)], inits)
    g, _ = roundtrip(model)
    out = extract_graph(saturate(g)).graph
    assert ops_of(out) == {"gelu": 1}
    _, exported = check_against_ort(out, {"x": np.linspace(-6, 6, 48).reshape(2, 3, 8).astype(np.float32)})
    assert [(n.op_type, n.domain) for n in exported.graph.node] == [("Gelu", "com.microsoft")]


def test_a_wrong_constant_is_not_gelu():
    s = helper.make_node
    nodes = [s("Div", ["x", "c"], ["d"]), s("Erf", ["d"], ["e"]), s("Add", ["e", "one"], ["a"]),
             s("Mul", ["x", "a"], ["m"]), s("Mul", ["m", "half"], ["y"])]
    inits = [init("c", np.array(1.5, np.float32)), init("one", np.array(1, np.float32)),
             init("half", np.array(0.5, np.float32))]
    g = taso_egg.load_onnx(make_model(nodes, [vi("x", [2, 8])], [vi("y", None)], inits))
    assert "gelu" not in ops_of(extract_graph(saturate(g)).graph)


def test_gpt2s_tanh_gelu_is_recognized():
    """GPT-2's GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as the dynamo
    exporter writes it (Pow by 3, Mul, Add, Mul, Tanh, Add, Mul), saturates into one
    gelu with approximate='tanh' (gelu-tanh-from-formula, proved from ax-gelu-tanh)."""
    s = helper.make_node
    nodes = [s("Mul", ["x", "half"], ["h"]), s("Pow", ["x", "three"], ["cube"]),
             s("Mul", ["cube", "k"], ["kc"]), s("Add", ["x", "kc"], ["inner"]),
             s("Mul", ["inner", "c"], ["scaled"]), s("Tanh", ["scaled"], ["t"]),
             s("Add", ["t", "one"], ["a"]), s("Mul", ["h", "a"], ["y"])]
    inits = [init(n, np.array(v, np.float32)) for n, v in
             (("half", 0.5), ("three", 3.0), ("k", 0.044715), ("c", math.sqrt(2 / math.pi)), ("one", 1.0))]
    model = make_model(nodes, [vi("x", [2, 3, 8])], [vi("y", None)], inits)
    g, _ = roundtrip(model)
    out = extract_graph(saturate(g)).graph
    assert ops_of(out) == {"gelu": 1}
    assert [n.params["approximate"] for n in out.nodes.values() if n.op == "gelu"] == ["tanh"]
    _, exported = check_against_ort(out, {"x": np.linspace(-6, 6, 48).reshape(2, 3, 8).astype(np.float32)})
    assert [(n.op_type, n.domain) for n in exported.graph.node] == [("FastGelu", "com.microsoft")]
