"""Operators' kernels against onnxruntime on the exported one-op graph over more
configurations than their contract's one example row (tests/test_operator_contract.py,
which every operator has), plus the algebraic identities of TASO's generated
constants and weight transforms."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import taso_egg
from taso_egg import ExportError, ShapeError
from taso_egg.check.runtime import onnx_outputs
from taso_egg.ops import OPS

from conftest import assert_close, check_against_ort, rel_err

ACTS = ("NONE", "RELU", "SIGMOID", "TANH")


def _w(g, rng, shape, name=None, positive=False):
    data = rng.standard_normal(shape).astype(np.float32)
    if positive:
        data = np.abs(data) + 0.5
    return g.new_weight(shape, data=data, name=name)


# --- conv2d ------------------------------------------------------------------------

# (N, C, H, W, O, groups, kh, kw, strides, padding, activation, bias)
CONV_CASES = [
    (1, 4, 7, 7, 6, 1, 3, 3, (1, 1), "SAME", "NONE", True),
    (2, 4, 8, 8, 4, 4, 3, 3, (2, 2), "SAME", "RELU", False),          # depth-wise
    (1, 4, 8, 6, 8, 4, 3, 3, (1, 1), "VALID", "SIGMOID", True),       # depth-wise x2
    (1, 6, 9, 7, 6, 2, 1, 3, (1, 1), "VALID", "TANH", True),          # 1x3, groups 2
    (1, 4, 8, 8, 8, 2, 3, 1, (2, 1), (1, 0, 2, 1), "RELU", True),     # 3x1, explicit
    (1, 3, 9, 9, 5, 1, 5, 5, (2, 2), "SAME", "NONE", False),          # 5x5 stride 2
    (1, 8, 10, 10, 8, 8, 5, 5, (1, 1), (2, 2, 2, 2), "SIGMOID", True),  # dw 5x5 explicit
    (1, 4, 6, 6, 4, 1, 1, 1, (1, 1), "VALID", "TANH", True),          # 1x1 fast path
    (1, 4, 7, 7, 4, 1, 1, 1, (2, 2), "SAME", "NONE", False),          # 1x1 stride 2
    (2, 6, 8, 8, 6, 3, 3, 3, (2, 2), "VALID", "RELU", True),
    (1, 2, 6, 6, 4, 1, 3, 3, (1, 2), (0, 1, 1, 0), "NONE", False),    # asymmetric pads
]


def _conv_graph(rng, n, c, h, w, o, groups, kh, kw, strides, padding, act, bias):
    g = taso_egg.new_graph()
    x = g.new_input((n, c, h, w), name="x")
    wt = _w(g, rng, (o, c // groups, kh, kw), "w")
    b = _w(g, rng, (o,), "b") if bias else None
    y = g.conv2d(x, wt, strides=strides, padding=padding, activation=act, bias=b)
    assert g.nodes[y.node].params["activation"] == act
    g.mark_output(y, "y")
    return g


@pytest.mark.parametrize("index", range(len(CONV_CASES)),
                         ids=["-".join(map(str, c)).replace(" ", "") for c in CONV_CASES])
def test_conv2d_matches_onnxruntime(index):
    case = CONV_CASES[index]
    rng = np.random.default_rng(100 + index)
    g = _conv_graph(rng, *case)
    _, model = check_against_ort(g)
    assert [n.op_type for n in model.graph.node][0] == "Conv"


@pytest.mark.parametrize("seed", range(8))
def test_conv2d_random_configurations(seed):
    rng = np.random.default_rng(seed)
    groups = int(rng.choice([1, 2, 4]))
    c = groups * int(rng.integers(1, 3))
    o = groups * int(rng.integers(1, 3))
    kh, kw = int(rng.choice([1, 3, 5])), int(rng.choice([1, 3]))
    h, w = int(rng.integers(kh, 10)), int(rng.integers(kw, 10))
    strides = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
    padding = ["SAME", "VALID", tuple(int(v) for v in rng.integers(0, 2, size=4))][seed % 3]
    act = ACTS[int(rng.integers(0, 4))]
    g = _conv_graph(rng, 2, c, h, w, o, groups, kh, kw, strides, padding, act, bool(seed % 2))
    check_against_ort(g)


def test_conv2d_every_activation_changes_the_result(rng):
    g = taso_egg.new_graph()
    x = g.new_input((1, 2, 5, 5), name="x")
    wt = _w(g, rng, (3, 2, 3, 3), "w")
    for act in ACTS:
        g.mark_output(g.conv2d(x, wt, activation=act), act)
    out = taso_egg.run(g, taso_egg.random_inputs(g))
    assert np.allclose(out["RELU"], np.maximum(out["NONE"], 0))
    assert np.allclose(out["SIGMOID"], 1 / (1 + np.exp(-out["NONE"].astype(np.float64))), atol=1e-6)
    assert np.allclose(out["TANH"], np.tanh(out["NONE"]), atol=1e-6)
    assert (out["NONE"] < 0).any()


@pytest.mark.parametrize("case", [((2, 2), "SAME", "RELU"), ((1, 1), (1, 0, 0, 1), "NONE"),
                                  ((1, 2), "VALID", "TANH")])
def test_conv2d_sum_matches_onnxruntime_and_its_parts(rng, case):
    strides, padding, act = case
    g = taso_egg.new_graph()
    x = g.new_input((2, 4, 7, 6), name="x")
    wt = _w(g, rng, (6, 2, 3, 3), "w")   # grouped
    plain = g.conv2d(x, wt, strides=strides, padding=padding)
    z = g.new_input(plain.shape, name="z")
    [fused] = g.add_node("conv2d_sum", [x, wt, z], strides=strides, padding=padding, activation=act)
    g.mark_output(fused, "fused")
    g.mark_output(plain, "plain")
    _, model = check_against_ort(g)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == 2 and ops.count("Add") == 1  # standard ONNX: runtimes fuse it again
    out = taso_egg.run(g, feeds := taso_egg.random_inputs(g))
    parts = out["plain"] + feeds["z"]
    expected = {"NONE": parts, "RELU": np.maximum(parts, 0), "TANH": np.tanh(parts)}[act]
    assert np.allclose(out["fused"], expected, atol=1e-5)
    with pytest.raises(ShapeError, match="output type"):
        g.add_node("conv2d_sum", [x, wt, x])


# --- matmul ------------------------------------------------------------------------

MATMUL_CASES = [
    ((3, 4), (4, 5), "NONE"),
    ((3, 4), (4, 5), "RELU"),
    ((2, 3, 4), (4, 5), "SIGMOID"),
    ((2, 3, 4), (2, 4, 5), "TANH"),
    ((2, 1, 3, 4), (3, 4, 6), "NONE"),      # batch dims broadcast
    ((1, 3, 4), (5, 4, 2), "RELU"),
]


@pytest.mark.parametrize("a_shape,b_shape,act", MATMUL_CASES)
def test_matmul_matches_onnxruntime(a_shape, b_shape, act):
    rng = np.random.default_rng(len(a_shape) * 10 + len(b_shape))
    g = taso_egg.new_graph()
    a = g.new_input(a_shape, name="a")
    b = _w(g, rng, b_shape, "b")
    g.mark_output(g.matmul(a, b, activation=act), "y")
    ours, _ = check_against_ort(g)
    feeds = taso_egg.random_inputs(g)
    ref = np.matmul(feeds["a"].astype(np.float64), g.weight_array(g.nodes[b.node]))
    ref = {"NONE": ref, "RELU": np.maximum(ref, 0), "SIGMOID": 1 / (1 + np.exp(-ref)),
           "TANH": np.tanh(ref)}[act]
    assert rel_err(ref, ours["y"]) < 1e-5


def test_matmul_of_two_inputs():
    g = taso_egg.new_graph()
    a, b = g.new_input((2, 3, 4), name="a"), g.new_input((2, 4, 3), name="b")
    g.mark_output(g.matmul(a, b), "y")
    check_against_ort(g)


# --- element-wise ------------------------------------------------------------------

BROADCAST_CASES = [
    ((2, 3, 4), (2, 3, 4)),
    ((2, 3, 4), (4,)),
    ((2, 1, 4), (3, 1)),
    ((1, 3, 1, 5), (2, 1, 4, 1)),
    ((3,), ()),
    ((), (2, 2)),
]


@pytest.mark.parametrize("op", ["add", "mul"])
@pytest.mark.parametrize("a_shape,b_shape", BROADCAST_CASES)
def test_ewadd_ewmul_broadcast(op, a_shape, b_shape):
    g = taso_egg.new_graph()
    a, b = g.new_input(a_shape, name="a"), g.new_input(b_shape, name="b")
    y = getattr(g, op)(a, b)
    assert g.nodes[y.node].op == {"add": "ewadd", "mul": "ewmul"}[op]
    assert y.shape == np.broadcast_shapes(a_shape, b_shape)
    g.mark_output(y, "y")
    ours, _ = check_against_ort(g)
    feeds = taso_egg.random_inputs(g)
    ref = feeds["a"] + feeds["b"] if op == "add" else feeds["a"] * feeds["b"]
    assert rel_err(ref, ours["y"]) < 1e-6


def test_ewadd_with_weight_operand(rng):
    g = taso_egg.new_graph()
    x = g.new_input((2, 3, 4, 4), name="x")
    g.mark_output(g.add(x, _w(g, rng, (1, 3, 1, 1), "b")), "y")
    check_against_ort(g)


@pytest.mark.parametrize("scalar", [0.5, -3.0, 0.0])
def test_smul_python_number(scalar):
    g = taso_egg.new_graph()
    x = g.new_input((2, 3, 4), name="x")
    y = g.scalar_mul(x, scalar)
    assert g.nodes[y.node].op == "smul"
    g.mark_output(y, "y")
    ours, _ = check_against_ort(g)
    assert np.allclose(ours["y"], taso_egg.random_inputs(g)["x"] * np.float32(scalar))


def test_smul_tensor_scalar_input():
    g = taso_egg.new_graph()
    x, s = g.new_input((3, 5), name="x"), g.new_input((), name="s")
    g.mark_output(g.scalar_mul(x, s), "y")
    check_against_ort(g)


def test_smul_rejects_non_scalar():
    g = taso_egg.new_graph()
    x, s = g.new_input((3, 5), name="x"), g.new_input((1,), name="s")
    with pytest.raises(ShapeError, match="smul"):
        g.scalar_mul(x, s)


@pytest.mark.parametrize("op", ["relu", "sigmoid", "tanh"])
@pytest.mark.parametrize("shape", [(7,), (2, 3, 4), (1, 2, 3, 3)])
def test_unary_matches_onnxruntime(op, shape):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    g.mark_output(getattr(g, op)(x), "y")
    feeds = {"x": (np.random.default_rng(3).standard_normal(shape) * 5).astype(np.float32)}
    ours, _ = check_against_ort(g, feeds)
    ref = {"relu": lambda v: np.maximum(v, 0), "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
           "tanh": np.tanh}[op](feeds["x"].astype(np.float64))
    assert rel_err(ref, ours["y"]) < 1e-6


def test_sigmoid_is_finite_for_large_inputs():
    g = taso_egg.new_graph()
    g.mark_output(g.sigmoid(g.new_input((4,), name="x")), "y")
    out = taso_egg.run(g, {"x": np.array([-1e4, -100, 100, 1e4], np.float32)})["y"]
    assert np.allclose(out, [0, 0, 1, 1], atol=1e-6)


# --- pooling -----------------------------------------------------------------------

# (shape, kernel, strides, padding, activation)
POOL_CASES = [
    ((1, 2, 6, 6), (2, 2), (2, 2), "VALID", "NONE"),
    ((2, 3, 7, 7), (3, 3), (1, 1), "SAME", "RELU"),
    ((1, 2, 8, 8), (3, 3), (2, 2), "SAME", "NONE"),        # odd pixel at the end
    ((1, 2, 7, 5), (3, 3), (2, 2), "VALID", "TANH"),
    ((1, 2, 6, 6), (3, 3), (1, 2), (1, 1, 1, 1), "NONE"),
    ((1, 2, 5, 6), (2, 3), (2, 1), (0, 1, 1, 2), "SIGMOID"),  # asymmetric explicit
]


@pytest.mark.parametrize("shape,kernel,strides,padding,act", POOL_CASES)
def test_maxpool2d_matches_onnxruntime(shape, kernel, strides, padding, act):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    g.mark_output(g.maxpool2d(x, kernel, strides, padding, activation=act), "y")
    check_against_ort(g)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("shape,kernel,strides,padding,act", POOL_CASES)
def test_avgpool2d_matches_onnxruntime(shape, kernel, strides, padding, act, count_include_pad):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    g.mark_output(g.avgpool2d(x, kernel, strides, padding, activation=act,
                              count_include_pad=count_include_pad), "y")
    check_against_ort(g)


def test_avgpool2d_count_include_pad_matters():
    g = taso_egg.new_graph()
    x = g.new_input((1, 1, 4, 4), name="x")
    g.mark_output(g.avgpool2d(x, (3, 3), (1, 1), "SAME", count_include_pad=1), "inc")
    g.mark_output(g.avgpool2d(x, (3, 3), (1, 1), "SAME", count_include_pad=0), "exc")
    out = taso_egg.run(g, {"x": np.ones((1, 1, 4, 4), np.float32)})
    assert np.allclose(out["exc"], 1.0)
    assert out["inc"][0, 0, 0, 0] == pytest.approx(4 / 9)
    assert out["inc"][0, 0, 1, 1] == pytest.approx(1.0)


def test_maxpool2d_padding_never_wins():
    g = taso_egg.new_graph()
    x = g.new_input((1, 1, 3, 3), name="x")
    g.mark_output(g.maxpool2d(x, (3, 3), (1, 1), "SAME"), "y")
    out = taso_egg.run(g, {"x": -np.ones((1, 1, 3, 3), np.float32)})["y"]
    assert np.all(out == -1)


@pytest.mark.parametrize("shape", [(1, 3, 5, 5), (2, 4, 1, 7)])
def test_global_avgpool(shape):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    y = g.global_avgpool(x)
    assert y.shape == shape[:2] + (1, 1)
    g.mark_output(y, "y")
    check_against_ort(g)


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3), (2, 3)), ((4, 1, 5), (3, 1)), ((2, 3), ())])
def test_sub_div_erf_match_onnxruntime(a_shape, b_shape):
    g = taso_egg.new_graph()
    a, b = g.new_input(a_shape, name="a"), g.new_input(b_shape, name="b")
    g.mark_output(g.add_node("ewsub", (a, b))[0], "sub")
    g.mark_output(g.add_node("ewdiv", (a, b))[0], "div")
    g.mark_output(g.add_node("erf", (a,))[0], "erf")
    feeds = {"a": np.linspace(-6, 6, int(np.prod(a_shape))).reshape(a_shape).astype(np.float32),
             "b": np.linspace(0.5, 2, int(np.prod(b_shape))).reshape(b_shape).astype(np.float32)}
    ours, _ = check_against_ort(g, feeds)
    assert np.isfinite(ours["div"]).all()
    ref = np.vectorize(math.erf)(feeds["a"].astype(np.float64))
    assert np.abs(ours["erf"] - ref).max() < 1e-6


@pytest.mark.parametrize("shape", [(7,), (2, 5), (2, 3, 16)])
def test_layernorm_matches_onnxruntime(shape, rng):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    scale = g.new_weight(shape[-1:], data=rng.standard_normal(shape[-1:]).astype(np.float32))
    bias = g.new_weight(shape[-1:], data=rng.standard_normal(shape[-1:]).astype(np.float32))
    (y,) = g.add_node("layernorm", (x, scale, bias), epsilon=1e-3)
    g.mark_output(y, "y")
    check_against_ort(g)
    with pytest.raises(ShapeError, match="last axis"):
        g.add_node("layernorm", (x, bias, g.new_weight((shape[-1] + 1,))))


@pytest.mark.parametrize("shape,axis", [((2, 7), 1), ((3, 4, 5), 0), ((2, 3, 4, 5), 2)])
def test_softmax_matches_onnxruntime(shape, axis):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    (y,) = g.add_node("softmax", (x,), axis=axis)
    g.mark_output(y, "y")
    ours, _ = check_against_ort(g)
    assert np.allclose(ours["y"].sum(axis=axis), 1, atol=1e-6)


# --- batchnorm ---------------------------------------------------------------------

@pytest.mark.parametrize("shape,eps", [((2, 3, 4, 4), 1e-5), ((4, 3), 1e-3), ((1, 5, 6), 0.1)])
def test_batchnorm(shape, eps, rng):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    c = shape[1]
    scale, bias, mean = (_w(g, rng, (c,), n) for n in ("scale", "bias", "mean"))
    var = _w(g, rng, (c,), "var", positive=True)
    g.mark_output(g.batchnorm(x, scale, bias, mean, var, epsilon=eps), "y")
    check_against_ort(g)


def test_batchnorm_rejects_wrong_parameter_shape(rng):
    g = taso_egg.new_graph()
    x = g.new_input((1, 3, 2, 2), name="x")
    p = _w(g, rng, (3,), "p")
    bad = _w(g, rng, (4,), "bad")
    with pytest.raises(ShapeError, match="batchnorm"):
        g.batchnorm(x, p, p, bad, p)


@pytest.mark.parametrize("eps", [1e-5, 0.1])
def test_bn_factor_and_shift_rebuild_batchnorm(eps, rng):
    """x * factor + shift == batchnorm(x), per channel; both ops export as ONNX
    arithmetic when their inputs are not weights (with weights they fold)."""
    c = 3
    g = taso_egg.new_graph()
    x = g.new_input((2, c, 4, 4), name="x")
    scale, bias, mean, var = (g.new_input((c,), name=n) for n in ("scale", "bias", "mean", "var"))
    [factor] = g.add_node("bn_factor", [scale, var], epsilon=eps)
    [shift] = g.add_node("bn_shift", [scale, bias, mean, var], epsilon=eps)
    folded = g.add(g.mul(x, g.reshape(factor, (1, c, 1, 1))), g.reshape(shift, (1, c, 1, 1)))
    g.mark_output(folded, "folded")
    g.mark_output(g.batchnorm(x, scale, bias, mean, var, epsilon=eps), "bn")
    feeds = {n: rng.standard_normal(s).astype(np.float32)
             for n, s in (("x", (2, c, 4, 4)), ("scale", (c,)), ("bias", (c,)), ("mean", (c,)))}
    feeds["var"] = rng.uniform(0.1, 2.0, c).astype(np.float32)
    ours, _ = check_against_ort(g, feeds)
    np.testing.assert_allclose(ours["folded"], ours["bn"], rtol=1e-5, atol=1e-5)


def test_bn_factor_rejects_mismatched_vectors(rng):
    g = taso_egg.new_graph()
    with pytest.raises(ShapeError, match="bn_factor"):
        g.add_node("bn_factor", [_w(g, rng, (3,), "s"), _w(g, rng, (4,), "v")])


# --- layout ------------------------------------------------------------------------

@pytest.mark.parametrize("shapes,axis", [
    ([(2, 3)], 0),
    ([(2, 3), (4, 3)], 0),
    ([(2, 1, 4), (2, 3, 4), (2, 2, 4)], 1),
    ([(1, 2, 3, 2), (1, 2, 3, 1), (1, 2, 3, 4), (1, 2, 3, 1)], 3),
    ([(2, 3), (2, 5)], -1),
])
def test_concat(shapes, axis):
    g = taso_egg.new_graph()
    xs = [g.new_input(s, name=f"x{i}") for i, s in enumerate(shapes)]
    y = g.concat(axis, xs)
    g.mark_output(y, "y")
    ours, _ = check_against_ort(g)
    feeds = taso_egg.random_inputs(g)
    assert np.array_equal(ours["y"], np.concatenate([feeds[f"x{i}"] for i in range(len(shapes))],
                                                    axis=axis))


@pytest.mark.parametrize("shape,axis,sizes", [
    ((6, 3), 0, [2, 4]),
    ((2, 7, 3), 1, [1, 2, 4]),
    ((2, 3, 4, 8), 3, [2, 2, 2, 2]),
    ((2, 3, 4, 8), -1, 4),           # TASO's "number of equal parts"
    ((5,), 0, [5]),
])
def test_split(shape, axis, sizes):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    parts = g.split(x, axis, sizes)
    n = sizes if isinstance(sizes, int) else len(sizes)
    assert len(parts) == n
    for i, p in enumerate(parts):
        g.mark_output(p, f"y{i}")
    ours, _ = check_against_ort(g)
    bounds = np.cumsum([p.shape[axis] for p in parts])[:-1]
    ref = np.split(taso_egg.random_inputs(g)["x"], bounds, axis=axis)
    for i, r in enumerate(ref):
        assert np.array_equal(ours[f"y{i}"], r)


@pytest.mark.parametrize("shape,target,expect", [
    ((2, 3, 4), (6, 4), (6, 4)),
    ((2, 3, 4), (-1,), (24,)),
    ((2, 3, 4), (2, -1), (2, 12)),
    ((2, 3, 4), (0, 2, -1), (2, 2, 6)),
    ((1, 8), (2, 2, 2), (2, 2, 2)),
])
def test_reshape(shape, target, expect):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    y = g.reshape(x, target)
    assert y.shape == expect
    assert -1 not in g.nodes[y.node].params["shape"]
    g.mark_output(y, "y")
    ours, _ = check_against_ort(g)
    assert np.array_equal(ours["y"], taso_egg.random_inputs(g)["x"].reshape(expect))


@pytest.mark.parametrize("shape,perm", [
    ((2, 3), (1, 0)),
    ((2, 3, 4), (2, 0, 1)),
    ((1, 2, 3, 4), (0, 2, 3, 1)),
    ((2, 3, 4), (0, 1, 2)),
])
def test_transpose(shape, perm):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    g.mark_output(g.transpose(x, perm), "y")
    ours, _ = check_against_ort(g)
    assert np.array_equal(ours["y"], taso_egg.random_inputs(g)["x"].transpose(perm))


@pytest.mark.parametrize("w_shape,ref_shape", [
    ((4, 2, 1, 1), (4, 2, 3, 3)),
    ((3, 1, 3, 1), (3, 1, 5, 3)),
    ((2, 2, 3, 3), (2, 2, 3, 3)),
])
def test_enlarge_non_weight_exported_as_pad(w_shape, ref_shape, rng):
    g = taso_egg.new_graph()
    w = g.new_input(w_shape, name="w")
    ref = _w(g, rng, ref_shape, "ref")
    y = g.enlarge(w, ref)
    assert y.shape == w_shape[:2] + ref_shape[2:]
    g.mark_output(y, "y")
    ours, model = check_against_ort(g)
    assert [n.op_type for n in model.graph.node] == ["Pad"]
    # the kernel stays centred: the original sits in the middle, zeros around it
    w_val = taso_egg.random_inputs(g)["w"]
    ph, pw = (ref_shape[2] - w_shape[2]) // 2, (ref_shape[3] - w_shape[3]) // 2
    assert np.array_equal(ours["y"][:, :, ph:ph + w_shape[2], pw:pw + w_shape[3]], w_val)
    assert np.abs(ours["y"]).sum() == pytest.approx(np.abs(w_val).sum())


def test_enlarged_kernel_conv_equals_original_conv(rng):
    g = taso_egg.new_graph()
    x = g.new_input((1, 3, 6, 6), name="x")
    w1 = _w(g, rng, (4, 3, 1, 3), "w1")
    w3 = _w(g, rng, (4, 3, 3, 3), "w3")
    g.mark_output(g.conv2d(x, w1), "small")
    g.mark_output(g.conv2d(x, g.enlarge(w1, w3)), "big")
    out, model = check_against_ort(g)
    assert rel_err(out["small"], out["big"]) < 1e-6
    # the weight-only enlarge is folded into an initializer
    assert "Pad" not in {n.op_type for n in model.graph.node}


# --- TASO's generated constants ----------------------------------------------------

@pytest.mark.parametrize("c,k,depthwise", [(3, 3, False), (4, 1, False), (4, 3, True),
                                           (2, 5, True), (5, 5, False)])
def test_const_iconv_is_identity(c, k, depthwise):
    g = taso_egg.new_graph()
    x = g.new_input((2, c, 5, 6), name="x")
    ic = g.constant("iconv", (c, 1 if depthwise else c, k, k))
    assert g.nodes[ic.node].op == "const_iconv"
    g.mark_output(g.conv2d(x, ic), "y")
    ours, model = check_against_ort(g)
    assert np.array_equal(ours["y"], taso_egg.random_inputs(g)["x"])
    assert len(model.graph.initializer) == 1  # folded into an initializer


def test_const_iconv_rejects_even_kernels():
    g = taso_egg.new_graph()
    with pytest.raises(ShapeError, match="const_iconv"):
        g.constant("iconv", (4, 4, 2, 2))


@pytest.mark.parametrize("shape", [(1, 4), (3, 2, 4)])
def test_const_imm_is_identity(shape):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    imm = g.constant("imm", (shape[-1], shape[-1]))
    assert g.nodes[imm.node].op == "const_imm"
    g.mark_output(g.matmul(x, imm), "y")
    ours, _ = check_against_ort(g)
    assert np.array_equal(ours["y"], taso_egg.random_inputs(g)["x"])


def test_const_imm_must_be_square():
    with pytest.raises(ShapeError, match="const_imm"):
        taso_egg.new_graph().constant("imm", (3, 4))


@pytest.mark.parametrize("shape", [(2, 3), (1, 2, 3, 3)])
def test_const_one_is_identity_for_ewmul(shape):
    g = taso_egg.new_graph()
    x = g.new_input(shape, name="x")
    one = g.constant("one", shape)
    assert g.nodes[one.node].op == "const_one"
    g.mark_output(g.mul(x, one), "y")
    ours, _ = check_against_ort(g)
    assert np.array_equal(ours["y"], taso_egg.random_inputs(g)["x"])


@pytest.mark.parametrize("c,k,hw", [(3, 3, (6, 6)), (2, 5, (7, 5)), (4, 1, (3, 4)), (2, 3, (5, 4))])
def test_const_pool_conv_equals_avgpool(c, k, hw):
    g = taso_egg.new_graph()
    x = g.new_input((2, c) + hw, name="x")
    pool = g.constant("pool", (c, 1, k, k))
    assert g.nodes[pool.node].op == "const_pool"
    g.mark_output(g.conv2d(x, pool, padding="SAME"), "conv")
    g.mark_output(g.avgpool2d(x, (k, k), (1, 1), "SAME", count_include_pad=1), "pool")
    out, _ = check_against_ort(g)
    assert rel_err(out["pool"], out["conv"]) < 1e-6


# --- merge_gconv -------------------------------------------------------------------

@pytest.mark.parametrize("c,o,groups,count,k", [
    (4, 4, 4, 2, 3),
    (4, 4, 4, 4, 3),
    (8, 8, 4, 2, 1),
    (6, 12, 6, 3, 3),
    (4, 8, 2, 2, 3),
    (4, 4, 2, 1, 3),
])
def test_merge_gconv_preserves_conv(c, o, groups, count, k, rng):
    g = taso_egg.new_graph()
    x = g.new_input((2, c, 5, 5), name="x")
    w = _w(g, rng, (o, c // groups, k, k), "w")
    merged = g.merge_gconv(w, groups, count)
    assert merged.shape == (o, c // groups * count, k, k)
    y0 = g.conv2d(x, w)
    y1 = g.conv2d(x, merged)
    assert c // merged.shape[1] == groups // count  # the merged conv has groups/count groups
    g.mark_output(y0, "orig")
    g.mark_output(y1, "merged")
    out = taso_egg.run(g, taso_egg.random_inputs(g))
    assert rel_err(out["orig"], out["merged"]) < 1e-5


def test_merge_gconv_on_weight_is_folded_at_export(rng):
    g = taso_egg.new_graph()
    x = g.new_input((1, 4, 5, 5), name="x")
    w = _w(g, rng, (4, 1, 3, 3), "w")
    g.mark_output(g.conv2d(x, g.merge_gconv(w, 4, 2), activation="RELU"), "y")
    _, model = check_against_ort(g)
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert onnx.helper.get_attribute_value(next(a for a in conv.attribute if a.name == "group")) == 2


def test_merge_gconv_of_non_weight_cannot_export(rng):
    g = taso_egg.new_graph()
    w = g.new_input((4, 1, 3, 3), name="w")
    g.mark_output(g.merge_gconv(w, 4, 2), "y")
    with pytest.raises(ExportError, match="merge_gconv"):
        taso_egg.export_onnx(g)


def test_merge_gconv_rejects_bad_groups(rng):
    g = taso_egg.new_graph()
    w = _w(g, rng, (4, 1, 3, 3), "w")
    with pytest.raises(ShapeError, match="merge_gconv"):
        g.merge_gconv(w, 4, 3)


# --- opaque --------------------------------------------------------------------------

def test_opaque_node_runs_and_exports():
    attr = onnx.helper.make_attribute("axis", -1).SerializeToString(deterministic=True)
    g = taso_egg.new_graph()
    x = g.new_input((2, 5), name="x")
    (y,) = g.add_node("opaque", (x,), op_type="Softmax", opset=17, attrs=(attr,),
                      out_types=(((2, 5), "float32"),))
    g.mark_output(y, "y")
    ours, model = check_against_ort(g)
    v = taso_egg.random_inputs(g)["x"].astype(np.float64)
    ref = np.exp(v) / np.exp(v).sum(-1, keepdims=True)
    assert rel_err(ref, ours["y"]) < 1e-6
    assert [n.op_type for n in model.graph.node] == ["Softmax"]


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_relu6_pow_match_onnxruntime(opset, approximate):
    """gelu exports as ONNX Gelu from opset 20, as onnxruntime's contrib Gelu/FastGelu
    before; relu6 as Clip; pow with its exponent as a constant."""
    g = taso_egg.graph.Graph(opset=opset)
    x = g.new_input((2, 3, 16), name="x")
    g.mark_output(g.add_node("gelu", (x,), approximate=approximate)[0], "gelu")
    g.mark_output(g.add_node("relu6", (x,))[0], "relu6")
    g.mark_output(g.add_node("pow", (x,), exponent=3.0)[0], "cube")
    feeds = {"x": np.linspace(-8, 8, 96).reshape(2, 3, 16).astype(np.float32)}
    ours, model = check_against_ort(g, feeds)
    v = feeds["x"].astype(np.float64)
    if approximate == "none":
        ref = 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
    else:
        ref = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    assert np.abs(ours["gelu"] - ref).max() < 1e-5
    assert np.array_equal(ours["relu6"], np.clip(feeds["x"], 0, 6))
    gelu = [n for n in model.graph.node if "Gelu" in n.op_type]
    assert [(n.op_type, n.domain or "") for n in gelu] == (
        [("Gelu", "")] if opset >= 20 else [("FastGelu" if approximate == "tanh" else "Gelu", "com.microsoft")])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_in_float64_exports_its_formula(approximate):
    """onnxruntime's contrib Gelu takes float32 only: before opset 20 a float64 gelu
    exports as the formula in standard operators (run here by onnx's reference
    evaluator: onnxruntime's CPU Erf has no float64 kernel either)."""
    from onnx.reference import ReferenceEvaluator

    g = taso_egg.graph.Graph(opset=17)
    x = g.new_input((3, 4), name="x", dtype="float64")
    g.mark_output(g.add_node("gelu", (x,), approximate=approximate)[0], "y")
    model = taso_egg.export_onnx(g)
    onnx.checker.check_model(model)
    assert all(n.domain == "" for n in model.graph.node)
    feeds = {"x": np.linspace(-5, 5, 12).reshape(3, 4)}
    (theirs,) = ReferenceEvaluator(model).run(None, feeds)
    assert rel_err(taso_egg.run(g, feeds)["y"], theirs) < 1e-6  # its Erf rounds to float32


@pytest.mark.filterwarnings("ignore:invalid value")  # softmax of a fully masked row: NaN, as in ONNX
def test_mask_operators_match_onnxruntime():
    """isnan, where, equal, logical_and, cast and expand on a BERT-like mask."""
    g = taso_egg.new_graph()
    scores = g.new_input((1, 2, 4, 4), name="scores")
    mask = g.new_input((1, 1, 1, 4), name="mask", dtype="int64")
    flag = g.add_node("cast", (mask,), to="bool")[0]
    keep = g.add_node("logical_and", (flag, g.add_node("equal", (mask, mask))[0]))[0]
    big = g.add_node("expand", (keep,), shape=(1, 2, 4, 4))[0]
    neg = g.new_weight((1, 1, 1, 1), data=np.full((1, 1, 1, 1), -np.inf, np.float32))
    zero = g.new_weight((1, 1, 1, 1), data=np.zeros((1, 1, 1, 1), np.float32))
    masked = g.add_node("where", (big, scores, neg))[0]
    p = g.add_node("softmax", (masked,), axis=3)[0]
    g.mark_output(g.add_node("where", (g.add_node("isnan", (p,))[0], zero, p))[0], "p")
    g.mark_output(big, "big")
    feeds = {"scores": np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4) / 8,
             "mask": np.array([[[[1, 1, 0, 0]]]], dtype=np.int64)}
    ours, _ = check_against_ort(g, feeds)
    assert ours["big"].dtype == np.bool_ and ours["big"].shape == (1, 2, 4, 4)
    assert np.all(ours["p"][..., 2:] == 0) and np.allclose(ours["p"].sum(-1), 1)
    feeds["mask"][:] = 0  # every position masked: softmax is NaN, where makes it 0
    ours, _ = check_against_ort(g, feeds)
    assert np.all(ours["p"] == 0)


@pytest.mark.filterwarnings("ignore:invalid value")  # softmax of a fully masked row: NaN, as in ONNX
def test_nan_to_zero_matches_onnxruntime():
    """Where(IsNaN(p), 0, p) imports as nan_to_zero and exports as those two nodes: a
    fully masked row's NaNs become 0, the others are kept."""
    g = taso_egg.new_graph()
    scores = g.new_input((1, 2, 4, 4), name="scores")
    g.mark_output(g.add_node("nan_to_zero", (g.add_node("softmax", (scores,), axis=3)[0],))[0], "p")
    scores_data = np.linspace(-2, 2, 32, dtype=np.float32).reshape(1, 2, 4, 4)
    scores_data[0, 1, 2] = -np.inf
    ours, model = check_against_ort(g, {"scores": scores_data})
    assert [n.op_type for n in model.graph.node] == ["Softmax", "IsNaN", "Where"]
    assert np.all(ours["p"][0, 1, 2] == 0) and np.allclose(np.delete(ours["p"].reshape(8, 4), 6, 0).sum(-1), 1)
    again = taso_egg.load_onnx(model)
    assert again.op_counts(runtime_only=True) == {"softmax": 1, "nan_to_zero": 1}


def test_scalar_is_its_value_and_folds():
    g = taso_egg.new_graph()
    x = g.new_input((2, 3), name="x")
    g.mark_output(g.scalar_mul(x, g.add_node("scalar", (), value=0.5)[0]), "y")
    ours, model = check_against_ort(g)
    assert [n.op_type for n in model.graph.node] == ["Mul"]
    assert np.array_equal(ours["y"], taso_egg.random_inputs(g)["x"] * np.float32(0.5))


# --- the table itself ----------------------------------------------------------------

ISSUE_OPS = {
    "input", "weight", "conv2d", "matmul", "ewadd", "ewmul", "smul", "relu", "sigmoid",
    "tanh", "maxpool2d", "avgpool2d", "global_avgpool", "batchnorm", "concat", "split",
    "reshape", "transpose", "enlarge", "merge_gconv", "const_iconv", "const_imm",
    "const_one", "const_pool", "opaque",
}



def test_table_has_every_issue_operator():
    assert ISSUE_OPS <= set(OPS), f"missing: {sorted(ISSUE_OPS - set(OPS))}"


def test_every_spec_is_well_formed():
    for name, spec in OPS.items():
        assert spec.name == name
        lo, hi = spec.inputs
        assert lo >= 0 and (hi is None or hi >= lo)
        if spec.is_leaf:
            assert lo == hi == 0
        if spec.is_constant and not spec.is_leaf:
            pytest.fail(f"{name}: constant but not a leaf")
        # every non-leaf operator can run at export time: either an ONNX form, or it
        # only ever folds (weight transforms)
        if spec.export is None and not spec.is_leaf:
            assert name in {"merge_gconv"}, f"{name} has no export"


@pytest.mark.parametrize("kind,shape", [("iconv", (2, 2, 3, 3)), ("imm", (3, 3)),
                                        ("one", (2, 3)), ("pool", (2, 1, 3, 3))])
def test_constants_fold_at_export(kind, shape):
    g = taso_egg.new_graph()
    g.mark_output(g.constant(kind, shape), "c")
    model = taso_egg.export_onnx(g)
    out = onnx_outputs(model, {})
    ours = taso_egg.run(g, {})
    assert_close(ours, out, 0.0)
