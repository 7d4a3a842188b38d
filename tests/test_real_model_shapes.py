"""Models shaped like fresh torchvision / transformers exports go through
``taso-egg optimize``: GELU written out as Div/Erf/Mul/Add (BERT), Clip with scalar
bounds (MobileNetV2), Resize, LSTM, opset-20 Gelu (the dynamo exporter), an unused
graph input, an opset-1 file. Each used to crash; each must now write a model that
onnxruntime runs to the same outputs as the input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import taso_egg
from taso_egg.check.runtime import onnx_outputs
from taso_egg.cli import main
from taso_egg.onnx_io.reading import upgraded
from taso_egg.options import OptimizeOptions

from conftest import assert_close, init, make_model, vi

RNG = np.random.default_rng(7)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _scalar(value):
    return np.array(value, np.float32)  # 0-d, as exporters write constants


def bert_gelu():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Div", ["hb", "sqrt2"], ["d"]),
             helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["hb", "e1"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    return make_model(nodes, [vi("x", [2, 8, 16])], [vi("y", [2, 8, 16])],
                      [init("W", _f(16, 16)), init("b", _f(16)), init("sqrt2", _scalar(2 ** 0.5)),
                       init("one", _scalar(1.0)), init("half", _scalar(0.5))])


def _conv_sandwich(middle, out_hw, extra_inits=(), opset=17):
    """conv -> middle node(s) -> conv, NCHW 1x4x8x8."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), *middle,
             helper.make_node("Conv", ["mid", "w2"], ["y"], pads=[1, 1, 1, 1])]
    return make_model(nodes, [vi("x", [1, 4, 8, 8])], [vi("y", [1, 4, *out_hw])],
                      [init("w1", _f(4, 4, 3, 3)), init("w2", _f(4, 4, 3, 3)), *extra_inits],
                      opset=opset)


def mobilenet_clip():
    return _conv_sandwich([helper.make_node("Clip", ["c1", "lo", "hi"], ["mid"])], (8, 8),
                          [init("lo", _scalar(0.0)), init("hi", _scalar(6.0))])


def resize():
    return _conv_sandwich([helper.make_node("Resize", ["c1", "", "scales"], ["mid"], mode="nearest")],
                          (16, 16), [init("scales", np.array([1, 1, 2, 2], np.float32))])


def lstm():
    hidden = 8
    nodes = [helper.make_node("MatMul", ["x", "W0"], ["h"]),
             helper.make_node("LSTM", ["h", "W", "R"], ["seq", "last"], hidden_size=hidden),
             helper.make_node("Relu", ["last"], ["y"])]
    return make_model(nodes, [vi("x", [5, 2, 16])], [vi("y", [1, 2, hidden])],
                      [init("W0", _f(16, 16)), init("W", _f(1, 4 * hidden, 16)),
                       init("R", _f(1, 4 * hidden, hidden))])


def gelu_opset20():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Gelu", ["h"], ["y"])]
    return make_model(nodes, [vi("x", [4, 16])], [vi("y", [4, 16])], [init("W", _f(16, 16))], opset=20)


def opset1():
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return make_model(nodes, [vi("x", [4, 16])], [vi("y", [4, 16])], [init("W", _f(16, 16))], opset=1)


def unused_input_qkv():
    """Three matmuls of one input summed (which the rules merge into one), beside a graph
    input nothing reads: the written model must still take it, in its place."""
    nodes = [helper.make_node("MatMul", ["x", w], [w + "o"]) for w in ("wq", "wk", "wv")]
    nodes += [helper.make_node("Add", ["wqo", "wko"], ["s"]), helper.make_node("Add", ["s", "wvo"], ["y"])]
    return make_model(nodes, [vi("unused", [3]), vi("x", [16, 64])], [vi("y", [16, 64])],
                      [init(w, _f(64, 64)) for w in ("wq", "wk", "wv")])


MODELS = {"bert-gelu": bert_gelu, "mobilenet-clip": mobilenet_clip, "resize": resize, "lstm": lstm,
          "gelu-opset20": gelu_opset20, "opset1": opset1, "unused-input": unused_input_qkv}


def _feeds(model):
    feeds = {}
    for v in model.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        feeds[v.name] = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", sorted(MODELS))
def test_optimize_goes_through(name, tmp_path, capsys):
    model = MODELS[name]()
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), "-o", str(out), "--measure", "0", "--extractor", "greedy-dag"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "wrote" in captured.out
    written = onnx.load(out)
    onnx.checker.check_model(written)
    assert [i.name for i in written.graph.input] == [i.name for i in model.graph.input]
    runnable = upgraded  # onnxruntime runs no opset 1: compare both at opset 13
    assert_close(onnx_outputs(runnable(model), _feeds(model)),
                 onnx_outputs(runnable(written), _feeds(model)), rtol=1e-4)


def test_the_unused_input_survives_a_rewrite(tmp_path, capsys):
    """The q/k/v sum is rewritten (fewer matmuls) and the unused input is still there."""
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(unused_input_qkv(), src)
    assert main(["optimize", str(src), "-o", str(out), "--measure", "0", "--profile", "analytic"]) == 0
    assert "result: the extracted graph replaces the input" in capsys.readouterr().out
    written = onnx.load(out)
    assert sum(n.op_type == "MatMul" for n in written.graph.node) < 3
    assert [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in written.graph.input] \
        == [("unused", [3]), ("x", [16, 64])]


def test_api_keeps_unused_inputs_in_order():
    g = taso_egg.new_graph()
    g.new_input(dims=(3,), name="first_unused")
    x = g.new_input(dims=(16, 64), name="x")
    q, k, v = (g.matmul(x, g.new_weight(dims=(64, 64))) for _ in range(3))
    g.mark_output(g.add(g.add(q, k), v), "y")
    result = taso_egg.optimize(g, options=OptimizeOptions().replace(profile="analytic", measure=0))
    assert result.graph is not g
    assert [n.params["name"] for n in result.graph.inputs()] == ["first_unused", "x"]


def test_opaque_kernel_takes_zero_d_constants_in_float64():
    """The check runs in float64, where arithmetic on a 0-d array gives a NumPy scalar."""
    from taso_egg.executor import run
    from taso_egg.onnx_io.importer import load_onnx

    g = load_onnx(bert_gelu())
    feeds = {"x": _feeds(bert_gelu())["x"]}
    assert_close(run(g, feeds), run(g, feeds, float64=True), rtol=1e-5)


def test_opaque_node_without_a_float64_kernel_runs_in_float32():
    from taso_egg.ops.opaque import run_node

    x = RNG.standard_normal((1, 1, 2, 2))
    scales = np.array([1, 1, 2, 2], np.float64)
    args = ("Resize", "", 17, (helper.make_attribute("mode", "nearest").SerializeToString(),))
    (out,) = run_node(*args, ((x.shape, "float64"), ((4,), "float64")), 1, [x, scales], (1,))
    assert out.dtype == np.float64 and out.shape == (1, 1, 4, 4)
    assert np.allclose(out[0, 0, ::2, ::2], x[0, 0], rtol=1e-6)
