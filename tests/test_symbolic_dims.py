"""Models with symbolic dims: optimized without a flag, written back with the input's
interface (names, order, dtypes, dim_params), correct at sizes other than the ones
they were optimized at; freezing is asked for, never a side effect; conflicting
shapes are refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from taso_egg.cli import main

RNG = np.random.default_rng(0)


def _weight(name, *shape, scale=0.3):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _ints(name, values):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.array(values, dtype=np.int64), f"{name}_value"))


def _save(tmp_path, graph, name="in.onnx"):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _mlp(tmp_path):
    """Two matmuls of one input summed (merged into one by the rules), batch symbolic."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    return _save(tmp_path, helper.make_graph(nodes, "mlp", [x], [y], [_weight("w1", 16, 32), _weight("w2", 16, 32)]))


def _conv(tmp_path):
    """Conv, BatchNorm (folded into the conv by the rules), Relu, global pool, then a
    flatten to [batch, channels] by a Shape-derived Reshape target."""
    x = helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 8, 8])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 4])
    c = 4
    nodes = [helper.make_node("Conv", ["image", "w"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c0", "s", "b", "m", "v"], ["c1"]),
             helper.make_node("Relu", ["c1"], ["c2"]),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"]),
             helper.make_node("Shape", ["image"], ["sh"]), _ints("i0", [0]),
             helper.make_node("Gather", ["sh", "i0"], ["n"], axis=0), _ints("ch", [c]),
             helper.make_node("Concat", ["n", "ch"], ["target"], axis=0),
             helper.make_node("Reshape", ["p", "target"], ["logits"])]
    inits = [_weight("w", c, 3, 3, 3), _weight("s", c), _weight("b", c), _weight("m", c),
             numpy_helper.from_array(np.abs(RNG.standard_normal(c)).astype(np.float32) + 0.5, "v")]
    return _save(tmp_path, helper.make_graph(nodes, "conv", [x], [y], inits))


def _attention(tmp_path):
    """Self-attention over x [batch, seq, 32]: heads split off and merged back by
    Reshape targets built from Shape(x), a scale the rules move into a weight."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), _ints("i0", [0]), _ints("i1", [1]),
             helper.make_node("Gather", ["sh", "i0"], ["B"], axis=0),
             helper.make_node("Gather", ["sh", "i1"], ["S"], axis=0), _ints("heads", [4, 8]),
             helper.make_node("Concat", ["B", "S", "heads"], ["split_heads"], axis=0), _ints("hidden", [32]),
             helper.make_node("Concat", ["B", "S", "hidden"], ["merge_heads"], axis=0)]
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
                  helper.make_node("Reshape", [f"{n}0", "split_heads"], [f"{n}1"]),
                  helper.make_node("Transpose", [f"{n}1"], [f"{n}2"],
                                   perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3])]
    nodes += [helper.make_node("MatMul", ["q2", "k2"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v2"], ["o0"]),
              helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merge_heads"], ["o2"]),
              helper.make_node("MatMul", ["o2", "wo"], ["y"])]
    inits = [_weight(f"w{n}", 32, 32) for n in "qkvo"] + \
        [numpy_helper.from_array(np.array(0.35, dtype=np.float32), "scale")]
    return _save(tmp_path, helper.make_graph(nodes, "attention", [x], [y], inits))


def _optimize(capsys, path, out, *flags):
    rc = main(["optimize", str(path), "-o", str(out), "--measure", "0", *flags])
    return rc, capsys.readouterr()


def _assert_interface_kept(original, written):
    assert [v.SerializeToString() for v in written.graph.input] == \
        [v.SerializeToString() for v in original.graph.input]
    assert [v.SerializeToString() for v in written.graph.output] == \
        [v.SerializeToString() for v in original.graph.output]


def _assert_same_outputs(original_path, written_path, shapes):
    """The two files compute the same in onnxruntime at each input shape."""
    import onnxruntime as ort

    ref = ort.InferenceSession(str(original_path), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(written_path), providers=["CPUExecutionProvider"])
    for shape in shapes:
        feed = {ref.get_inputs()[0].name: RNG.standard_normal(shape).astype(np.float32)}
        expected, actual = ref.run(None, feed)[0], got.run(None, feed)[0]
        assert actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("build, shapes", [
    (_mlp, [(1, 16), (2, 16), (7, 16)]),
    (_conv, [(1, 3, 8, 8), (2, 3, 8, 8), (5, 3, 8, 8)]),
    (_attention, [(1, 64, 32), (2, 10, 32), (5, 7, 32)]),
])
def test_symbolic_dims_optimized_and_kept(tmp_path, capsys, build, shapes):
    path = build(tmp_path)
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out)
    assert rc == 0, cap.err
    assert "check: written with the input's symbolic dims" in cap.out
    original, written = onnx.load(path), onnx.load(out)
    assert len(written.graph.node) != len(original.graph.node) or \
        [n.op_type for n in written.graph.node] != [n.op_type for n in original.graph.node]  # rewritten
    _assert_interface_kept(original, written)
    _assert_same_outputs(path, out, shapes)


def test_result_is_not_written_when_a_size_is_not_a_product_of_the_symbols(tmp_path, capsys):
    """A Slice that drops the last position (its end is seq - 1) cannot be written
    with symbolic dims: the input is written, and the reason said."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", None, 32])
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), _ints("i1", [1]), _ints("one", [1]), _ints("zero", [0]),
             helper.make_node("Gather", ["sh", "i1"], ["S"], axis=0), helper.make_node("Sub", ["S", "one"], ["end"]),
             helper.make_node("Slice", ["x", "zero", "end", "i1"], ["xs"]),
             helper.make_node("MatMul", ["xs", "w1"], ["a"]), helper.make_node("MatMul", ["xs", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    path = _save(tmp_path, helper.make_graph(nodes, "sliced", [x], [y], [_weight("w1", 16, 32), _weight("w2", 16, 32)]))
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out)
    assert rc == 0, cap.err
    assert "the extracted graph cannot be written" in cap.out
    assert "not a product of the symbolic sizes" in cap.out
    assert out.read_bytes() == path.read_bytes()


def test_fix_shapes_freezes_only_when_asked(tmp_path, capsys):
    path = _mlp(tmp_path)
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out, "--input-shape", "x=4,16", "--fix-shapes")
    assert rc == 0, cap.err
    written = onnx.load(out)
    assert [d.dim_value for d in written.graph.input[0].type.tensor_type.shape.dim] == [4, 16]
    assert [d.dim_value for d in written.graph.output[0].type.tensor_type.shape.dim] == [4, 32]


def test_input_shape_sets_the_sizes_priced_not_the_interface(tmp_path, capsys):
    path = _mlp(tmp_path)
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out, "--input-shape", "x=4,16")
    assert rc == 0, cap.err
    assert "batch=4" in cap.err
    _assert_interface_kept(onnx.load(path), onnx.load(out))


def test_conflicting_input_shapes_refused(tmp_path, capsys):
    path = _mlp(tmp_path)
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out, "--input-shape", "x=2,16", "--input-shape", "x=3,16")
    assert rc == 1
    assert len(cap.err.strip().splitlines()) == 1 and "two shapes" in cap.err
    assert not out.exists()


def test_one_dim_name_given_two_sizes_refused(tmp_path, capsys):
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 8])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    path = _save(tmp_path, helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "add", [a, b], [y]))
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out, "--input-shape", "a=2,8", "--input-shape", "b=3,8")
    assert rc == 1
    assert len(cap.err.strip().splitlines()) == 1 and "'batch'" in cap.err
    assert not out.exists()


def test_convert_keeps_symbolic_dims(tmp_path, capsys):
    path = _attention(tmp_path)
    out = tmp_path / "out.onnx"
    assert main(["convert", str(path), "-o", str(out)]) == 0, capsys.readouterr().err
    _assert_interface_kept(onnx.load(path), onnx.load(out))
    _assert_same_outputs(path, out, [(3, 5, 32)])


def _assert_same_outputs_fed(original_path, written_path, feeds):
    """The two files compute the same in onnxruntime on each of ``feeds``."""
    import onnxruntime as ort

    ref = ort.InferenceSession(str(original_path), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(written_path), providers=["CPUExecutionProvider"])
    for feed in feeds:
        expected, actual = ref.run(None, feed)[0], got.run(None, feed)[0]
        assert actual.shape == expected.shape
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())


def _masked_attention(tmp_path):
    """BERT's way with a padding mask over x [batch, seq, 16], mask int64 [batch, seq]:
    the mask cast to bool, expanded over the queries to a shape built from Shape(mask),
    made an additive bias by Where; position ids from a Range over Shape(x)'s seq index
    a position table. Two projections of one input the rules merge."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])
    nodes = [helper.make_node("Shape", ["mask"], ["msh"]), _ints("i0", 0), _ints("i1", 1), _ints("zero", 0),
             _ints("one", 1), _ints("ax0", [0]), _ints("ax1", [1]),
             helper.make_node("Gather", ["msh", "i0"], ["B"], axis=0),
             helper.make_node("Gather", ["msh", "i1"], ["S"], axis=0),
             helper.make_node("Unsqueeze", ["B", "ax0"], ["B1"]), helper.make_node("Unsqueeze", ["S", "ax0"], ["S1"]),
             helper.make_node("Concat", ["B1", "S1", "S1"], ["bss"], axis=0),
             helper.make_node("Cast", ["mask"], ["mb"], to=TensorProto.BOOL),
             helper.make_node("Unsqueeze", ["mb", "ax1"], ["mb1"]),
             helper.make_node("Expand", ["mb1", "bss"], ["keep"]),
             helper.make_node("Where", ["keep", "no_bias", "bias"], ["attn_bias"]),
             helper.make_node("Shape", ["x"], ["xsh"]), helper.make_node("Gather", ["xsh", "i1"], ["Sx"], axis=0),
             helper.make_node("Range", ["zero", "Sx", "one"], ["pos"]),
             helper.make_node("Gather", ["positions", "pos"], ["pe"], axis=0),
             helper.make_node("Add", ["x", "pe"], ["h"])]
    for n in "qkv":
        nodes.append(helper.make_node("MatMul", ["h", f"w{n}"], [n]))
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Add", ["s0", "attn_bias"], ["s1"]),
              helper.make_node("Softmax", ["s1"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    inits = [_weight(f"w{n}", 16, 16) for n in "qkv"] + [_weight("positions", 128, 16),
             numpy_helper.from_array(np.array(0.0, dtype=np.float32), "no_bias"),
             numpy_helper.from_array(np.array(-1e4, dtype=np.float32), "bias")]
    return _save(tmp_path, helper.make_graph(nodes, "masked", [x, mask], [y], inits))


def test_attention_mask_from_shape_written_symbolically(tmp_path, capsys):
    """The mask, the Range and the position lookup depend on the sizes: they stay in
    the written graph, computed at run time, and the result is written with the
    input's symbolic dims, right at sizes it was not optimized at."""
    path = _masked_attention(tmp_path)
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out)
    assert rc == 0, cap.err
    assert "check: written with the input's symbolic dims" in cap.out, cap.out
    original, written = onnx.load(path), onnx.load(out)
    _assert_interface_kept(original, written)
    assert "Range" in {n.op_type for n in written.graph.node}  # computed at run time
    feeds = []
    for b, s in ((1, 64), (2, 10), (3, 7)):
        mask = (RNG.random((b, s)) < 0.7).astype(np.int64)
        mask[:, 0] = 1
        feeds.append({"x": RNG.standard_normal((b, s, 16)).astype(np.float32), "mask": mask})
    _assert_same_outputs_fed(path, out, feeds)


def _last_position(tmp_path, select):
    """Two projections of x [batch, seq, 16] summed, then the last position only (as
    GPT-2's logits[:, -1, :] exports): ``select`` is "gather" (Gather index -1) or
    "slice" (Slice -1 to INT64_MAX, then a Squeeze)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("MatMul", ["x", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), _ints("last", -1), _ints("last_v", [-1]),
             _ints("end", [np.iinfo(np.int64).max]), _ints("ax1", [1])]
    if select == "gather":
        nodes.append(helper.make_node("Gather", ["c", "last"], ["y"], axis=1))
    else:
        nodes += [helper.make_node("Slice", ["c", "last_v", "end", "ax1"], ["c1"]),
                  helper.make_node("Squeeze", ["c1", "ax1"], ["y"])]
    return _save(tmp_path, helper.make_graph(nodes, "last", [x], [y], [_weight("w1", 16, 32), _weight("w2", 16, 32)]))


@pytest.mark.parametrize("select", ["gather", "slice"])
def test_last_position_kept_counted_from_the_end(tmp_path, capsys, select):
    path = _last_position(tmp_path, select)
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out)
    assert rc == 0, cap.err
    assert "check: written with the input's symbolic dims" in cap.out, cap.out
    _assert_interface_kept(onnx.load(path), onnx.load(out))
    _assert_same_outputs(path, out, [(1, 64, 16), (2, 5, 16), (3, 100, 16)])


# --- a rewrite that holds only at the priced sizes (batch 1) --------------------------------


def _conv1d(nodes, x, w, b, width, out):
    """torch's Conv1D as TorchScript exports it (GPT-2): x.view(-1, nx), a Gemm,
    .view(x.size()[:-1] + (width,)): batch and positions merged into rows around it."""
    nodes += [helper.make_node("Shape", [x], [f"{x}_shape"]), _ints(f"{out}_0", [0]), _ints(f"{out}_2", [2]),
              helper.make_node("Slice", [f"{x}_shape", f"{out}_0", f"{out}_2", f"{out}_0"], [f"{out}_lead"]),
              _ints(f"{out}_width", [width]),
              helper.make_node("Concat", [f"{out}_lead", f"{out}_width"], [f"{out}_size"], axis=0),
              _ints(f"{out}_rows", [-1, 16]), helper.make_node("Reshape", [x, f"{out}_rows"], [f"{out}_flat"]),
              helper.make_node("Gemm", [f"{out}_flat", w, b], [f"{out}_gemm"]),
              helper.make_node("Reshape", [f"{out}_gemm", f"{out}_size"], [out])]


def _gpt2_mlp(tmp_path):
    """GPT-2's MLP as TorchScript exports it: two Conv1Ds, a Relu between, a residual add."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])
    nodes = []
    _conv1d(nodes, "x", "w1", "b1", 16, "a")
    nodes.append(helper.make_node("Relu", ["a"], ["r"]))
    _conv1d(nodes, "r", "w2", "b2", 16, "d")
    nodes.append(helper.make_node("Add", ["x", "d"], ["y"]))
    inits = [_weight("w1", 16, 16), _weight("b1", 16), _weight("w2", 16, 16), _weight("b2", 16)]
    return _save(tmp_path, helper.make_graph(nodes, "gpt2_mlp", [x], [y], inits))


def _class_token(tmp_path):
    """torch's MultiheadAttention out-projection as ViT exports it (rows positions-major:
    [positions * batch, width]), then the class token, x[:, 0]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 33, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]), helper.make_node("Shape", ["xt"], ["sh"]),
             _ints("rows", [-1, 64]), helper.make_node("Reshape", ["xt", "rows"], ["x2"]),
             helper.make_node("Gemm", ["x2", "w1", "b1"], ["a"], transB=1),
             helper.make_node("Reshape", ["a", "sh"], ["a3"]),
             helper.make_node("Transpose", ["a3"], ["c"], perm=[1, 0, 2]), _ints("zero", 0),
             helper.make_node("Gather", ["c", "zero"], ["t"], axis=1), helper.make_node("MatMul", ["t", "w2"], ["y"])]
    inits = [_weight("w1", 64, 64), _weight("b1", 64), _weight("w2", 64, 32)]
    return _save(tmp_path, helper.make_graph(nodes, "class_token", [x], [y], inits))


def _optimize_flat_adds_dear(path, out):
    """``optimize_onnx`` under costs that rank a 2-D bias add and a 3-D matmul dear (as
    a measured profile can: GPT-2's), so the extraction takes the Gemm's rows and adds
    its bias after the reshape back, a form sized at batch 1 only by a guess."""
    from dataclasses import dataclass

    from taso_egg.cost.model import AnalyticCost
    from taso_egg.onnx_io.exporter import save_atomically
    from taso_egg.product.optimize_onnx import optimize_onnx
    from taso_egg.options import CostOptions, DecisionOptions, OptimizeOptions

    @dataclass(frozen=True)
    class FlatAddsDear(AnalyticCost):
        name: str = "2-D adds and 3-D matmuls dear"

        def cost(self, config):
            dear = (config.op, len(config.outputs[0].shape)) in (("ewadd", 2), ("matmul", 3))
            return AnalyticCost.cost(self, config) * (10 if dear else 1)

    options = OptimizeOptions(decision=DecisionOptions(measure=0), costs=CostOptions(model=FlatAddsDear()))
    result = optimize_onnx(path, options=options)
    save_atomically(result.model, out)
    return result


def test_bias_added_after_the_rows_are_reshaped_back_is_written_symbolic(tmp_path):
    """The reshape back of a Gemm's rows, priced at batch 1, is sized at the second
    sizes as the input's reshape of the same rows is (not guessed as [1, batch * seq])."""
    path, out = _gpt2_mlp(tmp_path), tmp_path / "out.onnx"
    result = _optimize_flat_adds_dear(path, out)
    assert result.chosen == "result", result.result.stats.kept_input
    assert any("written with the input's symbolic dims" in note for note in result.notes), result.notes
    _assert_interface_kept(onnx.load(path), onnx.load(out))
    _assert_same_outputs(path, out, [(1, 64, 16), (2, 5, 16), (3, 67, 16)])


def test_class_token_from_merged_rows_extracted_again_until_written(tmp_path):
    """At batch 1 the class token is row 0 of the rows positions and batch are merged
    into; at batch 2 it is not. The graph that relies on it is refused, its e-nodes
    forbidden, and the graph extracted again is written, valid at every batch."""
    path, out = _class_token(tmp_path), tmp_path / "out.onnx"
    result = _optimize_flat_adds_dear(path, out)
    assert result.chosen == "result", result.result.stats.kept_input
    ext = result.result.stats.extraction
    assert ext.refused and ext.forbidden
    assert any("held only at the priced sizes" in note and "holds at both sizes" in note for note in result.notes), \
        result.notes
    assert result.result.cost_after < result.result.cost_before
    original, written = onnx.load(path), onnx.load(out)
    assert [n.op_type for n in written.graph.node] != [n.op_type for n in original.graph.node]
    _assert_interface_kept(original, written)
    _assert_same_outputs(path, out, [(1, 33, 64), (2, 33, 64), (5, 33, 64)])


def test_values_wrong_at_the_second_sizes_located_where_they_start(tmp_path):
    """``wrong_values`` runs the candidate at the second sizes against the input there,
    tensor by tensor: none differs when nothing is wrong; where one weight is, only it
    is named, not what is computed from it."""
    from taso_egg.product.optimize_graph import extract_graph
    from taso_egg.product.dynamic import retyped, wrong_values
    from taso_egg.egraph.saturate import saturate, tensor_classes
    from taso_egg.product.optimize_onnx import OnnxInput

    dyn = OnnxInput.read(_class_token(tmp_path)).dynamic
    sat = saturate(dyn.graph, rules=(), count_classes=False)
    ext, classes, made = extract_graph(sat), tensor_classes(sat), {}
    second = retyped(ext.graph, ext.classes, classes, dyn.graph, dyn.second_graph(), [], made)
    assert wrong_values(dyn, ext.graph, second, made, ext.classes, classes) == []
    w2 = next(n for n in second.nodes.values() if n.op == "weight" and n.params["name"] == "w2")
    second.weight_data[w2.id] = second.weight_array(w2) * 2
    bad = wrong_values(dyn, ext.graph, second, made, ext.classes, classes)
    assert [ext.graph.nodes[key[0]].params.get("name") for key in bad] == ["w2"]


def test_the_guard_times_each_candidate_as_it_is_written(tmp_path, capsys, monkeypatch):
    """What is timed is what would be written: the re-export and the result with the
    input's symbolic dims, not exported at the priced sizes (onnxruntime fuses a
    graph with fixed sizes differently: a BERT ran 4 % slower so), and the written file
    is the model timed."""
    from taso_egg.product import decide, timing
    from taso_egg.onnx_io.fed import feed

    timed = {}

    def recording(models, feeds, threads=1):
        for name, model in models.items():
            dims = feed(model).model.graph.input[0].type.tensor_type.shape.dim
            timed[name] = [d.dim_param or d.dim_value for d in dims]
        return lambda names=None: {name: 2.0 if name == "original" else 1.0 for name in (names or models)}

    monkeypatch.setattr(timing, "ort_rounds", recording)
    # every candidate predicted to gain, so that each is timed (what the profiles would
    # predict of this small model is noise)
    monkeypatch.setattr(decide, "predicted_speedups",
                        lambda models, *args, **kwargs: {name: decide.Prediction(2.0, 2.0) for name in models
                                                          if name != "original"})
    path, out = _attention(tmp_path), tmp_path / "out.onnx"
    rc = main(["optimize", str(path), "-o", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert {"original", "re-export", "result"} <= set(timed) and all(dims == ["batch", "seq", 32] for dims in timed.values())
    assert "check: written with the input's symbolic dims" in cap.out
    _assert_interface_kept(onnx.load(path), onnx.load(out))


def test_a_window_longer_than_the_default_sizes_grows_them_where_onnx_cannot_infer(tmp_path, capsys, monkeypatch):
    """A speech encoder's strided 1-D convolutions outlast 64 samples; where ONNX's
    shape inference fails (as on onnxslim's wav2vec2) the importer learns an opaque
    node's types by running it, which at too small a size fails in onnxruntime: the
    sizes grow, as where inference types the node, instead of the run failing."""
    x = helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", "samples"])
    y = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4, "frames"])
    nodes = [_ints("axis", [1]), helper.make_node("Unsqueeze", ["audio", "axis"], ["a0"])]
    for i in range(3):
        nodes.append(helper.make_node("Conv", [f"a{i}", f"w{i}"], [f"c{i}"], kernel_shape=[10], strides=[5]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"a{i + 1}" if i < 2 else "r"]))
    nodes.append(helper.make_node("Mul", ["r", "two"], ["features"]))
    inits = [_weight("w0", 4, 1, 10), _weight("w1", 4, 4, 10), _weight("w2", 4, 4, 10),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    path = _save(tmp_path, helper.make_graph(nodes, "speech", [x], [y], inits))

    infer = onnx.shape_inference.infer_shapes

    def no_data_propagation(model, *args, **kwargs):  # the importer's inference, not the reader's check
        if kwargs.get("data_prop"):
            raise RuntimeError("inference with data propagation fails on this model")
        return infer(model, *args, **kwargs)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", no_data_propagation)
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out)
    assert rc == 0, cap.err
    assert "Invalid input shape" not in cap.err  # onnxruntime's own log stays quiet
    _assert_interface_kept(onnx.load(path), onnx.load(out))
    _assert_same_outputs(path, out, [(1, 600), (2, 1000)])


def test_an_empty_tensor_at_every_size_does_not_grow_the_sizes(tmp_path, capsys):
    """Phi-3's export splits each head into its rotated part and the rest, ``q[..., 32:]``
    of a 32-wide head: empty at every size, by design. The sizes stay at their defaults
    (growing them would never fill it: a 10 MB Phi-3 was sized at past 16384, took 195 s
    and peaked at 6.7 GB), and the model is optimized and written as any other."""
    from taso_egg.product.dynamic import DynamicModel

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 32])
    nodes = [_ints("start", [32]), _ints("end", [2 ** 62]), _ints("axis", [2]), _ints("zero", [0]),
             helper.make_node("MatMul", ["x", "w"], ["q"]),
             helper.make_node("Slice", ["q", "zero", "start", "axis"], ["rotated"]),
             helper.make_node("Slice", ["q", "start", "end", "axis"], ["rest"]),  # empty: [batch, seq, 0]
             helper.make_node("Sin", ["rotated"], ["s"]),
             helper.make_node("Concat", ["s", "rest"], ["y"], axis=2)]
    path = _save(tmp_path, helper.make_graph(nodes, "rotary", [x], [y], [_weight("w", 32, 32)]))
    dyn = DynamicModel.load(onnx.load(path))
    assert dyn.first == {"batch": 1, "seq": 64}
    out = tmp_path / "out.onnx"
    rc, cap = _optimize(capsys, path, out)
    assert rc == 0, cap.err
    _assert_interface_kept(onnx.load(path), onnx.load(out))
    _assert_same_outputs(path, out, [(1, 5, 32), (3, 9, 32)])
