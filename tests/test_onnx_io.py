"""ONNX import and export: round trips of small hand-built models through every mapped
operator, folding, opaque operators, and bad input."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import taso_egg
from taso_egg import ExportError, GraphError, OnnxImportError, ShapeError
from taso_egg.check.runtime import onnx_outputs

from conftest import assert_close, init, make_model, vi

RNG = np.random.default_rng(2024)


def rand(*shape, positive=False):
    a = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if positive else a


def roundtrip(model, input_shapes=None, rtol=1e-5, feeds=None, opaque_ok=()):
    """Import, export, check; the export and our executor agree with the original in
    onnxruntime. Fails if anything except the op types in ``opaque_ok`` is opaque."""
    g = taso_egg.load_onnx(model, input_shapes)
    g.validate()
    opaque = Counter(n.params["op_type"] for n in g.nodes.values() if n.op == "opaque")
    assert set(opaque) <= set(opaque_ok), f"unexpectedly opaque: {dict(opaque)}"
    exported = taso_egg.export_onnx(g)
    onnx.checker.check_model(exported, full_check=True)
    feeds = taso_egg.random_inputs(g, 7) if feeds is None else feeds
    want = onnx_outputs(model, feeds)
    assert_close(want, onnx_outputs(exported, feeds), rtol)
    assert_close(want, taso_egg.run(g, feeds), rtol)
    return g, exported


def ops_of(g):
    return Counter(n.op for n in g.nodes.values() if n.op not in ("input", "weight"))


def types_of(model):
    return Counter(n.op_type for n in model.graph.node)


# --- Conv ------------------------------------------------------------------------------

CONV_ATTRS = [
    dict(),
    dict(pads=[1, 1, 1, 1]),
    dict(pads=[0, 1, 2, 1], strides=[2, 1]),
    dict(auto_pad="SAME_UPPER"),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(auto_pad="SAME_LOWER", strides=[2, 2]),   # odd pixel at the start: explicit pads
    dict(auto_pad="SAME_LOWER"),
    dict(auto_pad="VALID", strides=[2, 2]),
]


@pytest.mark.parametrize("attrs", CONV_ATTRS, ids=lambda a: str(a).replace(" ", ""))
@pytest.mark.parametrize("group,bias", [(1, True), (2, False), (4, True)])
def test_conv(attrs, group, bias):
    w = rand(4, 4 // group, 3, 3)
    inits = [init("w", w)] + ([init("b", rand(4))] if bias else [])
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], group=group,
                            kernel_shape=[3, 3], **attrs)
    model = make_model([node], [vi("x", [1, 4, 8, 8])], [vi("y", None)], inits)
    g, exported = roundtrip(model)
    assert ops_of(g) == {"conv2d": 1}
    assert types_of(exported) == {"Conv": 1}


def test_conv_nonsquare_kernel_and_relu_chain():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[0, 1, 0, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 3, 5, 6])], [vi("y", None)], [init("w", rand(5, 3, 1, 3))])
    g, _ = roundtrip(model)
    assert ops_of(g) == {"conv2d": 1, "relu": 1}


# --- Gemm / MatMul -------------------------------------------------------------------

@pytest.mark.parametrize("trans_a,trans_b,alpha,beta,c_shape", [
    (0, 0, 1.0, 1.0, None),
    (0, 1, 1.0, 1.0, (5,)),
    (1, 0, 0.5, 1.0, (3, 5)),
    (1, 1, 2.0, 0.25, (1, 5)),
    (0, 1, 1.0, -1.0, ()),
])
def test_gemm(trans_a, trans_b, alpha, beta, c_shape):
    a_shape = (4, 3) if trans_a else (3, 4)
    b_shape = (5, 4) if trans_b else (4, 5)
    ins = ["a", "b"] + (["c"] if c_shape is not None else [])
    inits = [init("b", rand(*b_shape))] + ([init("c", rand(*c_shape))] if c_shape is not None else [])
    node = helper.make_node("Gemm", ins, ["y"], transA=trans_a, transB=trans_b, alpha=alpha, beta=beta)
    model = make_model([node], [vi("a", list(a_shape))], [vi("y", [3, 5])], inits)
    g, _ = roundtrip(model)
    assert ops_of(g)["matmul"] == 1 and "opaque" not in ops_of(g)


@pytest.mark.parametrize("a_shape,b_shape,b_is_input", [
    ((3, 4), (4, 5), False),
    ((2, 3, 4), (4, 5), False),
    ((2, 3, 4), (2, 4, 5), True),
    ((2, 1, 3, 4), (3, 4, 2), True),
])
def test_matmul(a_shape, b_shape, b_is_input):
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    inputs = [vi("a", list(a_shape))] + ([vi("b", list(b_shape))] if b_is_input else [])
    inits = [] if b_is_input else [init("b", rand(*b_shape))]
    g, _ = roundtrip(make_model([node], inputs, [vi("y", None)], inits))
    assert ops_of(g) == {"matmul": 1}


# --- element-wise --------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("a_shape,b_shape,b_const", [
    ((2, 3, 4), (2, 3, 4), False),
    ((2, 3, 4), (4,), True),
    ((2, 1, 4), (3, 1), False),
    ((2, 3), (), True),         # scalar initializer
    ((), (2, 3), False),        # scalar input first
])
def test_add_mul(op, a_shape, b_shape, b_const):
    node = helper.make_node(op, ["a", "b"], ["y"])
    inputs = [vi("a", list(a_shape))] + ([] if b_const else [vi("b", list(b_shape))])
    inits = [init("b", rand(*b_shape))] if b_const else []
    g, _ = roundtrip(make_model([node], inputs, [vi("y", None)], inits))
    ops = ops_of(g)
    assert sum(ops.values()) == 1
    if op == "Add":
        assert ops == {"ewadd": 1}
    elif b_shape == () and a_shape != ():
        assert ops == {"smul": 1}
    else:
        assert ops in ({"ewmul": 1}, {"smul": 1})


def test_scalar_mul_on_the_left():
    node = helper.make_node("Mul", ["s", "x"], ["y"])
    g, _ = roundtrip(make_model([node], [vi("x", [2, 3])], [vi("y", None)],
                                [init("s", np.array(1.5, np.float32))]))
    assert ops_of(g) == {"smul": 1}


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Tanh"])
def test_unary(op):
    g, _ = roundtrip(make_model([helper.make_node(op, ["x"], ["y"])], [vi("x", [2, 3, 4])],
                                [vi("y", None)]))
    assert ops_of(g) == {op.lower(): 1}


# --- layout --------------------------------------------------------------------------

@pytest.mark.parametrize("shapes,axis", [([(2, 3), (2, 5)], 1), ([(1, 2), (3, 2), (2, 2)], 0),
                                         ([(1, 2, 3, 1), (1, 2, 3, 2)], -1)])
def test_concat(shapes, axis):
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Concat", names, ["y"], axis=axis)
    g, _ = roundtrip(make_model([node], [vi(n, list(s)) for n, s in zip(names, shapes)],
                                [vi("y", None)]))
    assert ops_of(g) == {"concat": 1}


def test_concat_with_initializer():
    node = helper.make_node("Concat", ["x", "c"], ["y"], axis=0)
    g, _ = roundtrip(make_model([node], [vi("x", [2, 3])], [vi("y", None)], [init("c", rand(1, 3))]))
    assert ops_of(g) == {"concat": 1}


@pytest.mark.parametrize("sizes,axis", [([1, 3], 1), ([2, 1, 1], 1), ([3, 3], 2)])
def test_split_opset13_with_split_input(sizes, axis):
    node = helper.make_node("Split", ["x", "s"], [f"y{i}" for i in range(len(sizes))], axis=axis)
    model = make_model([node], [vi("x", [2, 4, 6])], [vi(f"y{i}", None) for i in range(len(sizes))],
                       [init("s", np.array(sizes, np.int64))], opset=13)
    g, exported = roundtrip(model)
    assert ops_of(g) == {"split": 1}
    assert len(exported.graph.output) == len(sizes)


@pytest.mark.parametrize("n,dim", [(2, 6), (3, 6), (3, 7), (3, 8), (4, 6)])
def test_split_opset18_num_outputs(n, dim):
    node = helper.make_node("Split", ["x"], [f"y{i}" for i in range(n)], axis=-1, num_outputs=n)
    model = make_model([node], [vi("x", [2, dim])], [vi(f"y{i}", None) for i in range(n)], opset=18)
    g, _ = roundtrip(model)
    assert ops_of(g) == {"split": 1}


def test_split_opset18_impossible_num_outputs_is_a_shape_error():
    # 5 into 4 chunks of ceil(5/4) = 2 leaves nothing for the last: onnxruntime rejects it too
    node = helper.make_node("Split", ["x"], [f"y{i}" for i in range(4)], axis=-1, num_outputs=4)
    model = make_model([node], [vi("x", [2, 5])], [vi(f"y{i}", None) for i in range(4)], opset=18)
    with pytest.raises(ShapeError, match="Split"):
        taso_egg.load_onnx(model)


def test_split_without_sizes_opset13():
    node = helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0)
    model = make_model([node], [vi("x", [6, 2])], [vi(n, None) for n in "abc"], opset=13)
    roundtrip(model)


@pytest.mark.parametrize("target", [[0, -1], [-1], [0, 0, 2, -1], [6, 4], [2, 0, 2, 2, -1]])
def test_reshape(target):
    node = helper.make_node("Reshape", ["x", "t"], ["y"])
    model = make_model([node], [vi("x", [2, 3, 4])], [vi("y", None)],
                       [init("t", np.array(target, np.int64))])
    g, exported = roundtrip(model)
    assert ops_of(g) == {"reshape": 1}
    # the exported target shape is fully resolved
    shape_init = next(t for t in exported.graph.initializer)
    assert 0 not in onnx.numpy_helper.to_array(shape_init)
    assert -1 not in onnx.numpy_helper.to_array(shape_init)


@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -3])
def test_flatten(axis):
    node = helper.make_node("Flatten", ["x"], ["y"], axis=axis)
    g, _ = roundtrip(make_model([node], [vi("x", [2, 3, 2, 2])], [vi("y", None)]))
    assert ops_of(g) == {"reshape": 1}


@pytest.mark.parametrize("axes", [None, [0], [0, -1]])
def test_squeeze(axes):
    ins = ["x"] + (["axes"] if axes is not None else [])
    inits = [init("axes", np.array(axes, np.int64))] if axes is not None else []
    node = helper.make_node("Squeeze", ins, ["y"])
    g, _ = roundtrip(make_model([node], [vi("x", [1, 3, 1])], [vi("y", None)], inits))
    assert ops_of(g) == {"reshape": 1}


@pytest.mark.parametrize("axes", [[0], [1, -1], [0, 3]])
def test_unsqueeze(axes):
    node = helper.make_node("Unsqueeze", ["x", "axes"], ["y"])
    g, _ = roundtrip(make_model([node], [vi("x", [2, 3])], [vi("y", None)],
                                [init("axes", np.array(axes, np.int64))]))
    assert ops_of(g) == {"reshape": 1}


def test_opset11_squeeze_unsqueeze_attributes_are_upgraded():
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
             helper.make_node("Squeeze", ["u"], ["y"], axes=[0])]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", None)], opset=11)
    g, _ = roundtrip(model)
    assert ops_of(g) == {"reshape": 2}


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(perm):
    node = helper.make_node("Transpose", ["x"], ["y"], **({"perm": perm} if perm else {}))
    g, _ = roundtrip(make_model([node], [vi("x", [2, 3, 4])], [vi("y", None)]))
    assert ops_of(g) == {"transpose": 1}


# --- pooling, batchnorm ---------------------------------------------------------------

POOL_ATTRS = [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
    dict(kernel_shape=[3, 2], strides=[2, 1], auto_pad="VALID"),
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 1, 0]),
]


@pytest.mark.parametrize("attrs", POOL_ATTRS, ids=lambda a: str(a).replace(" ", ""))
def test_maxpool(attrs):
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    g, _ = roundtrip(make_model([node], [vi("x", [1, 2, 7, 8])], [vi("y", None)]))
    assert ops_of(g) == {"maxpool2d": 1}


@pytest.mark.parametrize("hw,attrs", [
    ((7, 7), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ((6, 6), dict(kernel_shape=[3, 3], strides=[2, 2])),
    ((8, 7), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((5, 9), dict(kernel_shape=[2, 3], strides=[2, 3])),
    ((8, 8), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
])
def test_maxpool_ceil_mode(hw, attrs):
    node = helper.make_node("MaxPool", ["x"], ["y"], ceil_mode=1, **attrs)
    g, _ = roundtrip(make_model([node], [vi("x", [1, 2, *hw])], [vi("y", None)]))
    assert ops_of(g) == {"maxpool2d": 1}


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("attrs", POOL_ATTRS, ids=lambda a: str(a).replace(" ", ""))
def test_averagepool(attrs, count_include_pad):
    node = helper.make_node("AveragePool", ["x"], ["y"], count_include_pad=count_include_pad,
                            **attrs)
    g, _ = roundtrip(make_model([node], [vi("x", [1, 2, 7, 8])], [vi("y", None)]))
    assert ops_of(g) == {"avgpool2d": 1}


def test_averagepool_ceil_mode_is_kept_correct():
    """ceil_mode's border windows average fewer elements than the kernel holds, which
    avgpool2d cannot state: the node stays opaque, and computes ONNX's result (the
    extra border row and column of a 5x5 input, each window's mean of what it covers)."""
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                            ceil_mode=1)
    g, _ = roundtrip(make_model([node], [vi("x", [1, 2, 5, 5])], [vi("y", None)]),
                     opaque_ok={"AveragePool"})
    assert ops_of(g) == {"opaque": 1}
    (pool,) = [n for n in g.nodes.values() if n.op == "opaque"]
    assert pool.params["op_type"] == "AveragePool"
    feeds = taso_egg.random_inputs(g, 7)
    (y,) = taso_egg.run(g, feeds).values()
    x = feeds["x"]
    expected = np.array([[[[x[0, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2].mean() for j in range(3)]
                           for i in range(3)] for c in range(2)]])
    assert y.shape == (1, 2, 3, 3)
    np.testing.assert_allclose(y, expected, rtol=1e-5)


def test_global_average_pool():
    node = helper.make_node("GlobalAveragePool", ["x"], ["y"])
    g, _ = roundtrip(make_model([node], [vi("x", [2, 3, 4, 5])], [vi("y", None)]))
    assert ops_of(g) == {"global_avgpool": 1}


@pytest.mark.parametrize("shape,eps", [((2, 3, 4, 4), 1e-5), ((2, 3), 1e-3)])
def test_batchnorm(shape, eps):
    c = shape[1]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=eps)
    inits = [init("s", rand(c)), init("b", rand(c)), init("m", rand(c)),
             init("v", rand(c, positive=True))]
    g, _ = roundtrip(make_model([node], [vi("x", list(shape))], [vi("y", None)], inits))
    assert ops_of(g) == {"batchnorm": 1}


# --- removal, constants, folding ---------------------------------------------------------

def test_identity_and_dropout_are_removed():
    nodes = [helper.make_node("Identity", ["x"], ["i"]),
             helper.make_node("Dropout", ["i"], ["d"]),
             helper.make_node("Relu", ["d"], ["r"]),
             helper.make_node("Dropout", ["r"], ["d2", ""]),
             helper.make_node("Identity", ["d2"], ["y"])]
    g, exported = roundtrip(make_model(nodes, [vi("x", [2, 3])], [vi("y", None)]))
    assert ops_of(g) == {"relu": 1}
    assert types_of(exported) == {"Relu": 1}


def test_dropout_with_used_mask_is_kept():
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"])]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("d", None), vi("mask", None, TP.BOOL)])
    g, exported = roundtrip(model, opaque_ok={"Dropout"})
    assert types_of(exported)["Dropout"] == 1


def test_constant_nodes_and_initializers():
    nodes = [
        helper.make_node("Constant", [], ["c1"], value=onnx.numpy_helper.from_array(rand(2, 3))),
        helper.make_node("Constant", [], ["c2"], value_float=0.5),
        helper.make_node("Constant", [], ["c3"], value_floats=[1.0, 2.0, 3.0]),
        helper.make_node("Constant", [], ["shape"], value_ints=[3, 2]),
        helper.make_node("Add", ["x", "c1"], ["a"]),
        helper.make_node("Mul", ["a", "c2"], ["m"]),
        helper.make_node("Add", ["m", "c3"], ["b"]),
        helper.make_node("Add", ["b", "w"], ["c"]),
        helper.make_node("Reshape", ["c", "shape"], ["y"]),
    ]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", None)], [init("w", rand(3))])
    g, exported = roundtrip(model)
    assert ops_of(g) == {"ewadd": 3, "smul": 1, "reshape": 1}
    assert "Constant" not in types_of(exported)


def test_outputs_that_are_inputs_or_constants():
    nodes = [helper.make_node("Identity", ["x"], ["y"]),
             helper.make_node("Identity", ["w"], ["z"]),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["r2"])]
    model = make_model(nodes, [vi("x", [2, 3])], [vi(n, None) for n in ("y", "z", "r", "r2")],
                       [init("w", rand(2, 3))])
    _, exported = roundtrip(model)
    assert [o.name for o in exported.graph.output] == ["y", "z", "r", "r2"]


def test_weight_only_mapped_arithmetic_stays_and_folds_at_export():
    """Add of two float initializers is kept in the graph (rewrites see it) and folded
    into one initializer on export."""
    nodes = [helper.make_node("Add", ["w1", "w2"], ["w"]), helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", None)],
                       [init("w1", rand(3, 4)), init("w2", rand(3, 4))])
    g, exported = roundtrip(model)
    assert ops_of(g) == {"ewadd": 1, "matmul": 1}
    assert types_of(exported) == {"MatMul": 1}


def test_shape_arithmetic_folds():
    """Shape -> Gather -> Concat -> Reshape, as exporters write it, folds to one reshape;
    Expand of a constant to a computed shape folds too."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Shape", ["flat"], ["fs"]),
        helper.make_node("Expand", ["b", "fs"], ["be"]),
        helper.make_node("Add", ["flat", "be"], ["y"]),
    ]
    inits = [init("i0", np.array(0, np.int64)), init("ax0", np.array([0], np.int64)),
             init("minus1", np.array([-1], np.int64)), init("b", rand(1, 12))]
    model = make_model(nodes, [vi("x", [2, 3, 4])], [vi("y", None)], inits)
    g, exported = roundtrip(model)
    assert ops_of(g) == {"reshape": 1, "ewadd": 1}
    assert not {"Shape", "Gather", "Concat", "Expand", "Unsqueeze"} & set(types_of(exported))


def test_castlike_of_constants_folds():
    nodes = [helper.make_node("Constant", [], ["c64"],
                              value=helper.make_tensor("v", TP.DOUBLE, [], [2.0])),
             helper.make_node("CastLike", ["c64", "like"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", None)],
                       [init("like", np.zeros((1,), np.float32))])
    g, _ = roundtrip(model)
    assert ops_of(g) == {"smul": 1}


def test_castlike_to_runtime_dtype_folds():
    nodes = [helper.make_node("Constant", [], ["c64"],
                              value=helper.make_tensor("v", TP.DOUBLE, [], [2.0])),
             helper.make_node("CastLike", ["c64", "x"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", None)])
    g, _ = roundtrip(model, opaque_ok={"CastLike"})
    assert "opaque" not in ops_of(g)


# --- opaque operators ------------------------------------------------------------------

def _opaque_model():
    s = helper.make_node
    nodes = [
        s("Softmax", ["x"], ["sm"], axis=-1),
        s("LayerNormalization", ["sm", "ln_s", "ln_b"], ["ln"], axis=-1, epsilon=1e-5),
        s("Erf", ["ln"], ["e"]),
        s("Gather", ["e", "idx"], ["g"], axis=1),
        s("Max", ["g", "zeros"], ["w"]),
        s("Relu", ["w"], ["r"]),
        s("Identity", ["r"], ["i"]),
        s("Shape", ["x"], ["shp"]),
        s("Reshape", ["i", "shp2"], ["y"]),
        s("Softmax", ["y"], ["y2"], axis=0),
    ]
    inits = [init("ln_s", rand(6)), init("ln_b", rand(6)), init("idx", np.array([0, 2, 5, 1], np.int64)),
             init("zeros", np.zeros((3, 4), np.float32)), init("shp2", np.array([4, 3], np.int64))]
    return make_model(nodes, [vi("x", [3, 6])], [vi("y2", None)], inits)


def test_opaque_operators_are_kept_none_dropped():
    model = _opaque_model()
    opaque_types = {"Gather", "Max"}
    g, exported = roundtrip(model, opaque_ok=opaque_types)
    before = types_of(model)
    kept = Counter(n.params["op_type"] for n in g.nodes.values() if n.op == "opaque")
    assert kept == {t: before[t] for t in opaque_types}
    after = types_of(exported)
    for t in opaque_types:
        assert after[t] == before[t], t
    # the rest mapped, Identity removed, Shape folded (unused)
    assert ops_of(g) - Counter({"opaque": sum(kept.values())}) == {
        "softmax": 2, "layernorm": 1, "erf": 1, "relu": 1, "reshape": 1}
    assert after == Counter({**{t: before[t] for t in opaque_types}, "Softmax": 2, "LayerNormalization": 1,
                             "Erf": 1, "Relu": 1, "Reshape": 1})
    # attributes survive (the table's softmax writes its axis non-negative)
    sm = [n for n in exported.graph.node if n.op_type == "Softmax"]
    assert sorted(helper.get_attribute_value(n.attribute[0]) for n in sm) == [0, 1]


def test_opaque_with_gap_in_optional_inputs():
    # Clip(x, '', max): an optional input left out in the middle
    node = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    model = make_model([node], [vi("x", [2, 5])], [vi("y", None)],
                       [init("hi", np.array(0.3, np.float32))])
    g, exported = roundtrip(model, opaque_ok={"Clip"})
    assert list(exported.graph.node[0].input)[1] == ""


def test_non_default_domain_operator():
    import onnxruntime

    node = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    model = make_model([node], [vi("x", [2, 5])], [vi("y", None)], domains=[("com.microsoft", 1)])
    try:
        onnx_outputs(model, {"x": np.zeros((2, 5), np.float32)})
    except onnxruntime.capi.onnxruntime_pybind11_state.Fail:  # pragma: no cover
        pytest.skip("onnxruntime lacks com.microsoft Gelu")
    g, exported = roundtrip(model, opaque_ok={"Gelu"})
    (n,) = [n for n in g.nodes.values() if n.op == "opaque"]
    assert n.params["domain"] == "com.microsoft"
    assert exported.graph.node[0].domain == "com.microsoft"
    assert {o.domain for o in exported.opset_import} >= {"", "com.microsoft"}


def test_unknown_operator_notice(caplog):
    nodes = [helper.make_node("Softplus", ["x"], ["a"]), helper.make_node("Softplus", ["a"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", None)])
    with caplog.at_level(logging.INFO, logger="taso_egg.onnx"):
        g = taso_egg.load_onnx(model)
    notices = [r for r in caplog.records if "Softplus" in r.getMessage()]
    assert len(notices) == 1  # once per operator type, not per node
    assert "\n" not in notices[0].getMessage() and "opaque" in notices[0].getMessage()
    assert ops_of(g) == {"opaque": 2}
    roundtrip(model, opaque_ok={"Softplus"})


# --- load forms ------------------------------------------------------------------------

def _small_model():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], transB=1)]
    inits = [init("w", rand(4, 3, 3, 3)), init("b", rand(4)), init("fc", rand(5, 4)), init("fcb", rand(5))]
    return make_model(nodes, [vi("x", [1, 3, 6, 6])], [vi("y", [1, 5])], inits)


def test_load_from_path_bytes_and_proto(tmp_path):
    model = _small_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    hashes = set()
    for source in (path, str(path), model.SerializeToString(), model):
        g = taso_egg.load_onnx(source)
        hashes.add(g.structural_hash())
    assert len(hashes) == 1
    roundtrip(model)


def test_export_to_path(tmp_path):
    g = taso_egg.load_onnx(_small_model())
    path = tmp_path / "out.onnx"
    model = taso_egg.export_onnx(g, path)
    assert onnx.load(path) == model
    assert not [p for p in tmp_path.iterdir() if p.name != "out.onnx"]  # no temp files left


# --- bad input ---------------------------------------------------------------------------

def test_truncated_file(tmp_path):
    data = _small_model().SerializeToString()
    path = tmp_path / "half.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxImportError, match="half.onnx"):
        taso_egg.load_onnx(path)
    with pytest.raises(OnnxImportError):
        taso_egg.load_onnx(data[: len(data) // 2])


def test_text_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not an ONNX model, just some text\n" * 3)
    with pytest.raises(OnnxImportError, match="notes.onnx"):
        taso_egg.load_onnx(path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(OnnxImportError, match="empty.onnx"):
        taso_egg.load_onnx(path)


def test_missing_file(tmp_path):
    with pytest.raises(OnnxImportError, match="nothere.onnx"):
        taso_egg.load_onnx(tmp_path / "nothere.onnx")


def _symbolic_model():
    node = helper.make_node("Relu", ["x"], ["y"])
    return make_model([node], [vi("x", ["batch", 3])], [vi("y", ["batch", 3])])


def test_symbolic_dimension_needs_input_shapes():
    with pytest.raises(OnnxImportError) as e:
        taso_egg.load_onnx(_symbolic_model())
    assert "'x'" in str(e.value) and "'batch'" in str(e.value)
    g, _ = roundtrip(_symbolic_model(), input_shapes={"x": (4, 3)})
    assert g.inputs()[0].outputs[0].shape == (4, 3)


def test_input_shapes_rank_mismatch():
    with pytest.raises(OnnxImportError, match="'x'.*rank"):
        taso_egg.load_onnx(_symbolic_model(), {"x": (4,)})


def test_cycle_in_onnx_graph():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="first"),
             helper.make_node("Tanh", ["a"], ["b"], name="second"),
             helper.make_node("Add", ["x", "a"], ["y"])]
    model = make_model(nodes, [vi("x", [2])], [vi("y", None)])
    with pytest.raises(GraphError, match=r"cycle.*'(first|second)'"):
        taso_egg.load_onnx(model)


def test_nodes_out_of_order_are_sorted():
    nodes = [helper.make_node("Tanh", ["a"], ["y"]), helper.make_node("Relu", ["x"], ["a"])]
    roundtrip(make_model(nodes, [vi("x", [2, 3])], [vi("y", None)]))


def test_missing_initializer():
    node = helper.make_node("MatMul", ["x", "w_missing"], ["y"], name="mm")
    model = make_model([node], [vi("x", [2, 3])], [vi("y", None)])
    with pytest.raises(OnnxImportError, match="'w_missing'"):
        taso_egg.load_onnx(model)


def test_output_produced_by_nothing():
    node = helper.make_node("Relu", ["x"], ["r"])
    model = make_model([node], [vi("x", [2, 3])], [vi("ghost", None)])
    with pytest.raises(OnnxImportError, match="'ghost'"):
        taso_egg.load_onnx(model)


def test_shape_mismatch_in_model_names_node():
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="bad_mm")
    model = make_model([node], [vi("x", [2, 3])], [vi("y", None)], [init("w", rand(4, 5))])
    with pytest.raises(ShapeError, match=r"bad_mm.*matmul.*\[2, 3\].*\[4, 5\]"):
        taso_egg.load_onnx(model)


def test_failed_export_writes_nothing(tmp_path):
    g = taso_egg.new_graph()
    w = g.new_input((4, 1, 3, 3), name="w")
    g.mark_output(g.merge_gconv(w, 4, 2), "y")
    path = tmp_path / "out.onnx"
    with pytest.raises(ExportError):
        taso_egg.export_onnx(g, path)
    assert list(tmp_path.iterdir()) == []
    path.write_bytes(b"previous contents")
    with pytest.raises(ExportError):
        taso_egg.export_onnx(g, path)
    assert path.read_bytes() == b"previous contents"
    assert list(tmp_path.iterdir()) == [path]


def test_export_to_missing_folder(tmp_path):
    g = taso_egg.load_onnx(_small_model())
    with pytest.raises(ExportError, match="does not exist"):
        taso_egg.export_onnx(g, tmp_path / "no" / "such" / "out.onnx")


def test_export_for_check_feeds_the_weights_the_written_model_holds():
    """The check runs the model export writes, its large weights fed (the graph's own
    arrays, not copies) instead of held as initializers."""
    from taso_egg.executor import random_inputs
    from taso_egg.onnx_io.exporter import FED_ELEMENTS, export_for_check, export_onnx
    from taso_egg.research.zoo import squeezenet_small

    g = squeezenet_small()
    written = export_onnx(g)
    checked, fed = export_for_check(g)
    assert fed and all(a.size >= FED_ELEMENTS and a.dtype.kind == "f" for a in fed.values())
    assert not any(i.name in fed for i in checked.graph.initializer)
    assert {i.name for i in written.graph.initializer} == {i.name for i in checked.graph.initializer} | set(fed)
    assert [i.name for i in written.graph.input] == [i.name for i in checked.graph.input if i.name not in fed]
    weights = [g.weight_array(n) for n in g.weights()]
    assert any(any(a is w for w in weights) for a in fed.values())  # shared, not copied
    feeds = random_inputs(g)
    assert_close(onnx_outputs(written, feeds), onnx_outputs((checked, fed), feeds), rtol=0)



def test_exports_over_the_same_weights_fold_each_value_once():
    """Two exports given one ``folds`` (the two sizes of a symbolic write) feed the same
    folded array, computed once, where a fold computes the same from the same weights:
    a 1B-wide Llama's merged projections were folded twice, 3.5 GB more at 32 layers.
    A fold from other weights, or one whose params differ, is computed apart."""
    from taso_egg.graph import Graph
    from taso_egg.onnx_io.exporter import export_fed

    rng = np.random.default_rng(0)
    w1, w2, w3 = (rng.standard_normal((64, 128)).astype(np.float32) for _ in range(3))

    def graph(second: np.ndarray, batch: int) -> Graph:
        g = Graph()
        x = g.new_input([batch, 64], name="x")
        merged = g.concat(1, [g.new_weight([64, 128], w1), g.new_weight([64, 128], second)])
        g.mark_output(g.matmul(x, merged), "y")
        return g

    folds: dict = {}
    first = export_fed(graph(w2, 2), folds=folds)
    again = export_fed(graph(w2, 3), folds=folds)
    other = export_fed(graph(w3, 3), folds=folds)
    (a,), (b,), (c,) = first.arrays.values(), again.arrays.values(), other.arrays.values()
    assert a is b and np.array_equal(a, np.concatenate([w1, w2], axis=1))
    assert c is not a and np.array_equal(c, np.concatenate([w1, w3], axis=1))
    assert len(folds) == 2
