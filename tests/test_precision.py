"""A model's precision is the user's (issue 33): quantized and half-precision models
come back with their stored dtypes, Q/DQ nodes and file size, and are checked at
their own precision; what the operator table cannot model is carried, not fatal."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from taso_egg.check.runtime import onnx_outputs
from taso_egg.cli import main
from taso_egg.errors import VerificationError

from conftest import init, make_model, rel_err, vi


def _stored(model) -> Counter:
    """Elements stored per dtype in a model's initializers."""
    out = Counter()
    for t in model.graph.initializer:
        out[onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name] += int(np.prod(t.dims))
    return out


def _ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def _max_rel_error(reference, written, feeds) -> float:
    ref, got = onnx_outputs(reference, feeds), onnx_outputs(written, feeds)
    return max(rel_err(ref[k], got[k]) for k in ref)


# --- quantized (QDQ) ---------------------------------------------------------------------

def qdq_model():
    """onnxruntime's QDQ format: int8 weights behind DequantizeLinear, activations
    through QuantizeLinear/DequantizeLinear pairs around a conv and a matmul; then a
    float tail of two matmuls of one input (a merge the rewrites find)."""
    rng = np.random.default_rng(3)
    inits = [init("w_q", rng.integers(-127, 127, size=(4, 3, 3, 3)).astype(np.int8)),
             init("w_s", np.float32(0.02)), init("w_z", np.int8(0)),
             init("w2_q", rng.integers(-127, 127, size=(256, 16)).astype(np.int8)),
             init("w2_s", np.float32(0.01)), init("w2_z", np.int8(0)),
             init("x_s", np.float32(0.05)), init("x_z", np.uint8(128)),
             init("a_s", np.float32(0.1)), init("a_z", np.uint8(0)),
             init("bias", rng.standard_normal(4).astype(np.float32)),
             init("flat", np.array([1, 256], np.int64)),
             init("f1", rng.standard_normal((16, 32)).astype(np.float32)),
             init("f2", rng.standard_normal((16, 32)).astype(np.float32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w"]),
             helper.make_node("Conv", ["xd", "w", "bias"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "a_s", "a_z"], ["rq"]),
             helper.make_node("DequantizeLinear", ["rq", "a_s", "a_z"], ["rd"]),
             helper.make_node("Reshape", ["rd", "flat"], ["f"]),
             helper.make_node("DequantizeLinear", ["w2_q", "w2_s", "w2_z"], ["w2"]),
             helper.make_node("MatMul", ["f", "w2"], ["h"]),
             helper.make_node("MatMul", ["h", "f1"], ["y1"]),
             helper.make_node("MatMul", ["h", "f2"], ["y2"])]
    return make_model(nodes, [vi("x", [1, 3, 8, 8])], [vi("y1", [1, 32]), vi("y2", [1, 32])], inits)


def _x_feeds():
    return {"x": np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)}


@pytest.mark.parametrize("measure", ["0", "10"])
def test_a_qdq_model_keeps_its_int8_weights_and_q_dq_nodes(tmp_path, fake_timer, capsys, measure):
    """Whichever candidate is written (the result on its prediction, or the re-export
    measured fastest, as ResNet-18's de-quantized re-export was), it stores the int8
    weights as int8, keeps every Q/DQ node, does not grow, and computes what the input
    computes in onnxruntime."""
    path, out = tmp_path / "qdq.onnx", tmp_path / "qdq.opt.onnx"
    onnx.save(qdq_model(), path)
    fake_timer.ms = {"original": 2.0, "re-export": 1.0, "result": 1.5}
    assert main(["optimize", str(path), "-o", str(out), "--measure", measure]) == 0
    text = capsys.readouterr().out
    before, after = onnx.load(path), onnx.load(out)
    assert after.graph.node != before.graph.node, text  # something was written, not the input
    assert _stored(after)["int8"] == _stored(before)["int8"] == 4 * 27 + 256 * 16 + 2  # and 2 zero points
    assert _stored(after)["float32"] <= _stored(before)["float32"]  # no weight de-quantized
    for op in ("QuantizeLinear", "DequantizeLinear"):
        assert _ops(after)[op] == _ops(before)[op]
    assert out.stat().st_size <= path.stat().st_size * 1.1
    assert _max_rel_error(before, after, _x_feeds()) < 1e-5


def test_the_nodes_of_a_quantized_operator_stay_between_their_q_and_dq(tmp_path, capsys):
    """The conv and matmul that onnxruntime fuses with their DQ inputs and Q output
    into integer kernels are carried as they are; the float tail is optimized."""
    path, out = tmp_path / "qdq.onnx", tmp_path / "qdq.opt.onnx"
    onnx.save(qdq_model(), path)
    assert main(["optimize", str(path), "-o", str(out), "--measure", "0"]) == 0
    after = onnx.load(out)
    produced = {o: n for n in after.graph.node for o in n.output}
    conv = next(n for n in after.graph.node if n.op_type == "Conv")
    assert [produced[i].op_type for i in conv.input[:2]] == ["DequantizeLinear", "DequantizeLinear"]
    assert _ops(after)["MatMul"] == 2  # the quantized one, and the float tail's two merged


def test_the_precision_guard_refuses_a_de_quantized_model():
    """What main wrote for ResNet-18's QDQ export: DequantizeLinear of every weight
    folded into a float32 initializer."""
    from taso_egg.check.onnx_precision import check_precision_kept

    model = qdq_model()
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    dq = [n for n in folded.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w_q"][0]
    folded.graph.node.remove(dq)
    folded.graph.initializer.remove(next(t for t in folded.graph.initializer if t.name == "w_q"))
    folded.graph.initializer.append(init("w", (weights["w_q"] * weights["w_s"]).astype(np.float32)))
    with pytest.raises(VerificationError, match="changes the model's precision: it stores"):
        check_precision_kept(model, folded)
    check_precision_kept(model, model)


# --- float16 -----------------------------------------------------------------------------

def fp16_mlp():
    """A float16 MLP whose first layer is two matmuls of one input, added (the
    rewrites factor them into one), with two heads of one input (merged)."""
    rng = np.random.default_rng(1)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float16)

    inits = [init("w1", w(64, 128)), init("w1b", w(64, 128)), init("b1", w(128)),
             init("w2", w(128, 64)), init("w3", w(128, 64))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("MatMul", ["x", "w1b"], ["m1b"]),
             helper.make_node("Add", ["m1", "m1b"], ["s"]), helper.make_node("Add", ["s", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "w2"], ["y1"]), helper.make_node("MatMul", ["r1", "w3"], ["y2"])]
    f16 = TensorProto.FLOAT16
    return make_model(nodes, [vi("x", [32, 64], f16)], [vi("y1", [32, 64], f16), vi("y2", [32, 64], f16)],
                      inits)


def _optimized_and_checked(path, capsys) -> onnx.ModelProto:
    """``path`` through ``taso-egg optimize --measure 0``: what it wrote, after the
    check in onnxruntime said its outputs equal the input's."""
    out = path.with_suffix(".opt.onnx")
    assert main(["optimize", str(path), "-o", str(out), "--measure", "0"]) == 0
    assert "check: the written model's outputs equal the input's" in capsys.readouterr().out
    return onnx.load(out)


def test_an_fp16_mlp_is_accepted_and_written_with_fp16_weights(tmp_path, capsys):
    """float16's own round-off (a rounding step is 1e-3) is not mistaken for a wrong
    graph: main refused this model at 0.00067 against a 1e-4 tolerance."""
    path = tmp_path / "mlp16.onnx"
    onnx.save(fp16_mlp(), path)
    after = _optimized_and_checked(path, capsys)
    assert _ops(after)["MatMul"] < 4  # the result, not the input
    floats = {onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name for t in after.graph.initializer} - {"int64"}
    assert floats == {"float16"}
    assert [i.type.tensor_type.elem_type for i in after.graph.input] == [TensorProto.FLOAT16]
    feeds = {"x": np.random.default_rng(5).standard_normal((32, 64)).astype(np.float16)}
    assert _max_rel_error(onnx.load(path), after, feeds) < 4e-3


def test_a_cast_of_an_fp16_weight_is_not_folded_into_float32(tmp_path, capsys):
    """Mixed precision: a float16 weight cast to float32 before a float32 matmul stays
    a float16 initializer and a Cast (folding would store it twice as wide)."""
    rng = np.random.default_rng(2)
    model = make_model([helper.make_node("Cast", ["w16"], ["w"], to=TensorProto.FLOAT),
                        helper.make_node("MatMul", ["x", "w"], ["y"])],
                       [vi("x", [4, 32])], [vi("y", [4, 32])],
                       [init("w16", rng.standard_normal((32, 32)).astype(np.float16))])
    path, out = tmp_path / "mixed.onnx", tmp_path / "mixed.out.onnx"
    onnx.save(model, path)
    assert main(["convert", str(path), "-o", str(out)]) == 0
    after = onnx.load(out)
    assert _stored(after)["float16"] == 32 * 32 and _stored(after)["float32"] == 0
    assert "Cast" in _ops(after)


def test_the_tolerance_follows_the_precision_on_each_outputs_path():
    from taso_egg.check.onnx_precision import rounding_steps
    from taso_egg.check.tolerance import output_floor

    steps = rounding_steps(fp16_mlp())
    assert steps == {"y1": 2.0 ** -10, "y2": 2.0 ** -10}
    assert rounding_steps(qdq_model()) == {"y1": 2.0 ** -8, "y2": 2.0 ** -8}
    assert output_floor(2.0 ** -23) == 1e-4 and output_floor(2.0 ** -10) == 4 * 2.0 ** -10


# --- carried, not fatal --------------------------------------------------------------------

def _carrier(middle, extra_inits=(), value_info=(), domains=()):
    """x @ wa + x @ wb (the rewrites factor it), then ``middle`` (nodes from "s" to
    "c"), then two heads of "c" (merged): work for the rewrites on both sides of a node
    the table does not model."""
    rng = np.random.default_rng(4)
    w = {n: init(n, (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)) for n in ("wa", "wb", "w2", "w3")}
    nodes = [helper.make_node("MatMul", ["x", "wa"], ["ma"]), helper.make_node("MatMul", ["x", "wb"], ["mb"]),
             helper.make_node("Add", ["ma", "mb"], ["s"]), *middle,
             helper.make_node("MatMul", ["c", "w2"], ["y1"]), helper.make_node("MatMul", ["c", "w3"], ["y2"])]
    model = make_model(nodes, [vi("x", [4, 16])], [vi("y1", [4, 16]), vi("y2", [4, 16])],
                       [*w.values(), *extra_inits], domains=domains)
    model.graph.value_info.extend(value_info)
    return model


def custom_op_model(declared: bool = True):
    return _carrier([helper.make_node("Mystery", ["s"], ["c"], domain="com.example", alpha=0.5)],
                    value_info=[vi("c", [4, 16])] if declared else [], domains=[("com.example", 1)])


def loop_model():
    """A Loop whose body reads two tensors of the main graph without naming them as
    inputs: "s" (computed) and "scale" (an initializer)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["s", "scale"], ["p"]), helper.make_node("Add", ["acc_in", "p"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL), vi("acc_in", [4, 16])],
        [vi("cond_out", [], TensorProto.BOOL), vi("acc_out", [4, 16])])
    return _carrier([helper.make_node("Loop", ["n", "cond", "x"], ["c"], body=body)],
                    [init("n", np.int64(3)), init("cond", np.bool_(True)),
                     init("scale", np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32))])


@pytest.mark.parametrize("measure", ["0", "10"])
def test_a_custom_domain_op_is_carried_and_the_input_written(tmp_path, capsys, measure):
    """Nothing can run the custom operator (onnxruntime has no kernel for it), so
    nothing can time or check a changed model: the input is written, and the headline
    says why; no failure."""
    path, out = tmp_path / "custom.onnx", tmp_path / "custom.out.onnx"
    onnx.save(custom_op_model(), path)
    assert main(["optimize", str(path), "-o", str(out), "--measure", measure]) == 0
    text = capsys.readouterr().out
    assert out.read_bytes() == path.read_bytes()
    why = "no check can run on the result" if measure == "0" else "so no candidate can be timed"
    assert "result: the input, unchanged is written: " in text and why in text


def test_a_custom_op_no_one_can_type_is_carried_whole(tmp_path, capsys):
    """Its output's shape is declared nowhere and nothing can run it to learn it: the
    model is written unchanged, and inspect says so."""
    path, out = tmp_path / "custom.onnx", tmp_path / "custom.out.onnx"
    onnx.save(custom_op_model(declared=False), path)
    assert main(["optimize", str(path), "-o", str(out)]) == 0
    assert out.read_bytes() == path.read_bytes()
    assert "the input is written unchanged" in capsys.readouterr().err
    assert main(["inspect", str(path)]) == 0
    assert "carried whole (optimize writes it unchanged)" in capsys.readouterr().out


def test_a_loop_reading_outer_scope_tensors_goes_through(tmp_path, capsys):
    """The body's outer-scope reads are the node's inputs in the graph, so what they
    read is kept and ordered before it, and the written body reads them under the
    names they get there; the rewrites around the Loop apply and the result is
    checked in onnxruntime."""
    path = tmp_path / "loop.onnx"
    onnx.save(loop_model(), path)
    after = _optimized_and_checked(path, capsys)
    assert _ops(after)["Loop"] == 1 and _ops(after)["MatMul"] < 4
    feeds = {"x": np.random.default_rng(6).standard_normal((4, 16)).astype(np.float32)}
    assert _max_rel_error(onnx.load(path), after, feeds) < 1e-5
    assert main(["inspect", str(path)]) == 0
