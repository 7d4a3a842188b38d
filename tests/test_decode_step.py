"""Decoder models as deployed: dims the graph ties (a key/value cache concatenated
with the new position), an empty cache, and contrib operators that onnxruntime runs
in the default domain. Small ``onnx.helper`` models, shaped as exports are."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import taso_egg
from taso_egg.check.runtime import onnx_outputs
from taso_egg.cli import main
from taso_egg.product.dynamic import DynamicModel, check_at_sizes
from taso_egg.errors import OnnxImportError
from taso_egg.product.dims import Relation, dim_relations
from taso_egg.product.dims import interface, leading_symbols, representative_sizes, second_sizes

RNG = np.random.default_rng(0)
HEADS, HEAD = 2, 4
HIDDEN = HEADS * HEAD


def _weight(name, shape):
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def decode_step(mask_dim: str = "total", seq=1, wq: str = "Wq") -> onnx.ModelProto:
    """One attention layer's decode step: the new key concatenated to the past ones
    (``present``), the mask over all positions. The dims ``past`` and ``mask_dim`` are
    named apart; the Concat ties them (mask_dim = past + seq)."""
    inits = [_weight("Wq", (HIDDEN, HIDDEN)), _weight("Wk", (HIDDEN, HIDDEN)), _weight("Wo", (HIDDEN, HIDDEN)),
             numpy_helper.from_array(np.array([0, 0, HEADS, HEAD], np.int64), "heads"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([0, 0, HIDDEN], np.int64), "merged")]
    nodes = [
        helper.make_node("MatMul", ["x", "Wk"], ["k0"]), helper.make_node("Reshape", ["k0", "heads"], ["k1"]),
        helper.make_node("Transpose", ["k1"], ["k2"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["past", "k2"], ["present"], axis=2),
        helper.make_node("MatMul", ["x", wq], ["q0"]), helper.make_node("Reshape", ["q0", "heads"], ["q1"]),
        helper.make_node("Transpose", ["q1"], ["q2"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["present"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q2", "kt"], ["s"]),
        helper.make_node("Unsqueeze", ["mask", "one"], ["m1"]), helper.make_node("Unsqueeze", ["m1", "one"], ["m2"]),
        helper.make_node("Add", ["s", "m2"], ["s2"]), helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "present"], ["o"]),
        helper.make_node("Transpose", ["o"], ["o2"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o2", "merged"], ["o3"]),
        # two projections of one tensor: the merge the rules make
        helper.make_node("MatMul", ["o3", "Wo"], ["y0"]), helper.make_node("MatMul", ["o3", "Wq"], ["y1"]),
        helper.make_node("Add", ["y0", "y1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", seq, HIDDEN]),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", HEADS, "past", HEAD]),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", mask_dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", seq, HIDDEN]),
         helper.make_tensor_value_info("present", TensorProto.FLOAT, ["batch", HEADS, mask_dim, HEAD])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(batch, past, seq=1):
    return {"x": RNG.standard_normal((batch, seq, HIDDEN)).astype(np.float32),
            "past": RNG.standard_normal((batch, HEADS, past, HEAD)).astype(np.float32),
            "mask": RNG.standard_normal((batch, past + seq)).astype(np.float32)}


def test_the_dims_a_concat_ties_are_read_from_the_graph():
    model = decode_step()
    iface = interface(model)
    relations = dim_relations(model, iface.symbols, leading_symbols(iface))
    assert relations == {"total": Relation(1, (("past", 1),))}
    first = representative_sizes(iface, {}, relations)
    assert first["total"] == first["past"] + 1 and first["past"] > 1
    second = second_sizes(first, relations)
    assert second["total"] == second["past"] + 1 and second["past"] != first["past"]


def test_a_dim_named_as_an_expression_is_its_value():
    model = decode_step(mask_dim="past + sequence", seq="sequence")
    iface = interface(model)
    relations = dim_relations(model, iface.symbols, leading_symbols(iface))
    assert str(relations["past + sequence"]) == "sequence + past"
    sizes = representative_sizes(iface, {"x": (1, 5, HIDDEN)}, relations)
    assert sizes["past + sequence"] == sizes["past"] + 5


def test_a_decode_step_goes_through_written_symbolic_and_checked_at_an_empty_cache():
    model = decode_step()
    written, report = taso_egg.optimize_model(model, measure=0)
    assert report.written == "result"
    dyn = report.details.source.dynamic
    assert dyn.empty == {"batch": 1, "past": 0, "total": 1}  # the first call of a generation loop
    assert "batch=1, past=0, total=1" in check_at_sizes(dyn, written)  # compared there too
    assert [vi.name for vi in written.graph.input] == ["x", "past", "mask"]
    assert [d.dim_param or d.dim_value for d in written.graph.output[1].type.tensor_type.shape.dim] == \
        ["batch", HEADS, "total", HEAD]
    for batch, past in ((1, 0), (2, 31), (3, 7)):
        feeds = _feeds(batch, past)
        want, got = onnx_outputs(model, feeds), onnx_outputs(written, feeds)
        for name in ("y", "present"):
            assert np.allclose(want[name], got[name], rtol=1e-4, atol=1e-5)


def test_sizes_given_against_the_graph_s_tie_are_one_line(tmp_path, capsys):
    src = tmp_path / "step.onnx"
    onnx.save(decode_step(), src)
    code = main(["optimize", str(src), "-o", str(tmp_path / "out.onnx"),
                 "--input-shape", "past=1,2,8,4", "--input-shape", "mask=1,8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "'total'" in err[0] and "past + 1" in err[0]
    assert not (tmp_path / "out.onnx").exists()
    # the tied dim given alone sizes the dim it reads
    iface = interface(decode_step())
    relations = dim_relations(decode_step(), iface.symbols, leading_symbols(iface))
    assert representative_sizes(iface, {"mask": (1, 9)}, relations)["past"] == 8


def test_a_zero_size_dim_given_is_checked_there_and_ends(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 8])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g", [x], [y],
        [_weight("W", (16, 8))]), opset_imports=[helper.make_opsetid("", 17)])
    written, report = taso_egg.optimize_model(model, input_shapes={"x": (0, 5, 16)}, measure=0)
    dyn = report.details.source.dynamic
    assert dyn.first == {"N": 1} and dyn.empty == {"N": 0}
    assert onnx_outputs(written, {"x": np.zeros((0, 5, 16), np.float32)})["y"].shape == (0, 5, 8)
    with pytest.raises(OnnxImportError, match="empty"):
        taso_egg.optimize_model(model, input_shapes={"x": (0, 5, 16)}, fix_shapes=True, measure=0)


def _default_domain_rmsnorm() -> onnx.ModelProto:
    """SimplifiedLayerNormalization in the default domain, as onnxruntime-genai writes
    it: onnx's checker has no schema for it, onnxruntime runs it."""
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("SimplifiedLayerNormalization", ["h", "g"], ["n"], axis=-1, epsilon=1e-6),
             helper.make_node("MatMul", ["n", "W2"], ["a"]), helper.make_node("MatMul", ["n", "W"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 16])],
        [_weight("g", (16,)), _weight("W", (16, 16)), _weight("W2", (16, 16))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_default_domain_contrib_operator_onnxruntime_runs_is_carried():
    model = _default_domain_rmsnorm()
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    written, report = taso_egg.optimize_model(model, measure=0)
    assert report.written == "result"
    assert [n.op_type for n in written.graph.node].count("SimplifiedLayerNormalization") == 1
    assert [n.op_type for n in written.graph.node].count("MatMul") == 2  # the two reads of n merged
    feeds = {"x": RNG.standard_normal((2, 3, 16)).astype(np.float32)}
    assert np.allclose(onnx_outputs(model, feeds)["y"], onnx_outputs(written, feeds)["y"], rtol=1e-4, atol=1e-5)


def test_an_unknown_operator_onnxruntime_refuses_is_still_one_line(tmp_path, capsys):
    model = _default_domain_rmsnorm()
    model.graph.node[1].op_type = "NoSuchNormalization"
    src = tmp_path / "bad.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "out.onnx")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a valid ONNX model" in err[0] and "NoSuchNormalization" in err[0]


def _decomposed_rmsnorm(scale: np.ndarray) -> onnx.ModelProto:
    """An RMSNorm as torch exports Llama's (x / sqrt(mean(x^2) + eps) * scale, the
    reciprocal a Div of 1), then two projections of the norm that merge into one MatMul,
    and a rotary-like product by another constant 1.0, which the norm's 1.0 meets in the
    e-graph."""
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["var"]), helper.make_node("Sqrt", ["var"], ["rms"]),
             helper.make_node("Div", ["one", "rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["xn"]),
             helper.make_node("Mul", ["g", "xn"], ["n"]),
             helper.make_node("MatMul", ["n", "W"], ["a"]), helper.make_node("MatMul", ["n", "W2"], ["b"]),
             helper.make_node("Mul", ["b", "one_again"], ["b1"]), helper.make_node("Add", ["a", "b1"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 16])],
        [c("two", 2.0), c("eps", 1e-6), c("one", 1.0), c("one_again", 1.0),
         numpy_helper.from_array(scale, "g"), _weight("W", (16, 16)), _weight("W2", (16, 16))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _fused_by_onnxruntime(model: onnx.ModelProto, tmp_path) -> list[str]:
    """The operators onnxruntime runs of ``model`` after its own fusions."""
    from taso_egg.product.timing import make_session

    make_session(model, optimized_path=str(tmp_path / "optimized.onnx"))
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph.node]


def test_a_norm_onnxruntime_fuses_in_the_input_is_written_so_that_it_still_does(tmp_path):
    """The e-graph gives the scale the output's rank ([1, 1, 16]) and shares the 1.0
    constants; written as a Reshape of a shared 1.0 or with a 3-d scale, onnxruntime's
    RMSNorm fusion passes the norm by (five kernels in place of one, the written Llama
    decode step slower than its input). Both are written as the input had them."""
    model = _decomposed_rmsnorm(RNG.standard_normal(16).astype(np.float32))
    assert "SimplifiedLayerNormalization" in _fused_by_onnxruntime(model, tmp_path)
    written, report = taso_egg.optimize_model(model, measure=0)
    assert report.written == "result"
    assert [n.op_type for n in written.graph.node].count("MatMul") == 1  # the projections merged
    runs = _fused_by_onnxruntime(written, tmp_path)
    assert "SimplifiedLayerNormalization" in runs and "ReduceMean" not in runs
    feeds = {"x": RNG.standard_normal((2, 3, 16)).astype(np.float32)}
    assert np.allclose(onnx_outputs(model, feeds)["y"], onnx_outputs(written, feeds)["y"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dims", [["batch", "sequence", 16], [2, 3, 16]], ids=["symbolic", "fixed"])
def test_vectors_are_written_1_d_but_a_bias_a_gelu_reads_where_dims_are_symbolic(dims):
    """The e-graph gives a 1-d operand of Mul or Add the output's rank. Written back
    1-d, as exporters write them, onnxruntime fuses what it fuses in the input (an
    RMSNorm with its scale; a MatMul with its bias into Gemm where shapes are fixed).
    A bias that a GELU reads keeps its rank where dims are symbolic: onnxruntime then
    makes no Gemm of it but fuses Add and Gelu into BiasGelu, which measured slower
    than the two (BERT's result 1.061x against 1.077x)."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    nodes = [helper.make_node("Mul", ["x", "scale"], ["m"]), helper.make_node("Add", ["m", "bias"], ["h"]),
             helper.make_node("MatMul", ["h", "W"], ["a"]), helper.make_node("MatMul", ["h", "W2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["s"]),  # two projections of h: they merge (a predicted gain)
             helper.make_node("MatMul", ["s", "W3"], ["p"]), helper.make_node("Add", ["p", "gelu_bias"], ["q"]),
             helper.make_node("Gelu", ["q"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        [c("scale", scale := RNG.standard_normal(16)), c("bias", bias := RNG.standard_normal(16)),
         c("gelu_bias", gelu_bias := RNG.standard_normal(16)),
         _weight("W", (16, 16)), _weight("W2", (16, 16)), _weight("W3", (16, 16))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    written, report = taso_egg.optimize_model(model, measure=0)
    assert report.written == "result"
    found = {name: [list(t.dims) for t in written.graph.initializer
                    if list(t.dims[-1:]) == [16] and np.prod(t.dims) == 16
                    and np.allclose(numpy_helper.to_array(t).ravel(), value.astype(np.float32))]
             for name, value in (("scale", scale), ("bias", bias), ("gelu_bias", gelu_bias))}
    symbolic = isinstance(dims[0], str)
    assert found == {"scale": [[16]], "bias": [[16]], "gelu_bias": [[1, 1, 16]] if symbolic else [[16]]}


def test_the_input_runs_once_at_each_size_however_many_candidates_are_checked(monkeypatch):
    """Each candidate written with symbolic dims is compared with the input at every
    size; the input's outputs there are the same for all, so it runs once a size (a
    ViT's re-export and result each ran it at both sizes, a second apiece). A candidate
    that differs is still refused."""
    from taso_egg.check import runtime
    from taso_egg.errors import VerificationError

    model = decode_step()
    written, report = taso_egg.optimize_model(model, measure=0)
    dyn = report.details.source.dynamic
    runs = []
    real = runtime.onnx_outputs

    def counted(m, feeds):
        runs.append(m is dyn.reference)
        return real(m, feeds)

    monkeypatch.setattr(runtime, "onnx_outputs", counted)
    dyn._reference_outputs.clear()
    first = check_at_sizes(dyn, written)
    assert check_at_sizes(dyn, written) == first
    sizes = len(first)
    assert runs.count(True) == sizes and runs.count(False) == 2 * sizes
    broken = onnx.ModelProto()
    broken.CopyFrom(written)
    weight = next(t for t in broken.graph.initializer if t.dims and np.prod(t.dims) > 16)
    values = numpy_helper.to_array(weight) * 1.5
    weight.CopyFrom(numpy_helper.from_array(values.astype(np.float32), weight.name))
    with pytest.raises(VerificationError):
        check_at_sizes(dyn, broken)


def test_a_dim_an_opaque_node_takes_at_one_size_alone_is_held_there_at_both_sizes():
    """onnxruntime-genai names the cache's head size ``kv_cache_dim``, which its
    GroupQueryAttention takes at the head size alone and nothing else in the graph
    ties: the second sizes hold such a dim at the first's rather than refuse the model
    (before: exit 1, "should match")."""
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["n"], axis=-1, epsilon=1e-6),
             helper.make_node("Relu", ["n"], ["a"]), helper.make_node("Sigmoid", ["n"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    dims = ["batch", "sequence", "head_size"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], [_weight("g", (64,))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    dyn = DynamicModel.load(model)
    assert dyn.first["head_size"] == dyn.second["head_size"] == 64
    assert dyn.second["sequence"] != dyn.first["sequence"]  # the others still vary
    written, report = taso_egg.optimize_model(model, measure=0)
    assert interface(written).dims["x"] == tuple(dims)
    feeds = {"x": RNG.standard_normal((2, 3, 64)).astype(np.float32)}
    assert np.allclose(onnx_outputs(model, feeds)["y"], onnx_outputs(written, feeds)["y"], rtol=1e-5, atol=1e-6)


def test_a_contrib_operator_that_refuses_every_size_tried_leaves_the_model_written_unchanged(tmp_path, capsys):
    """A model onnxruntime runs only at sizes the defaults miss (onnxruntime-genai's
    GroupQueryAttention: a batch above 1 only for one new token) is carried whole and
    written unchanged with the reason (before: exit 1); at sizes the caller gives, the
    refusal is still an error in one line."""
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["n"], axis=-1, epsilon=1e-6),
             helper.make_node("Relu", ["n"], ["y"])]
    dims = ["batch", "sequence", "hidden"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], [_weight("g", (48,))])
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    assert main(["optimize", str(src), "-o", str(out)]) == 0
    said = capsys.readouterr()
    assert "the input, unchanged" in said.out and "no sizes the model takes were found" in said.err
    assert onnx.load(out).graph == onnx.load(src).graph
    assert main(["optimize", str(src), "-o", str(out), "--input-shape", "x=1,4,40"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SimplifiedLayerNormalization" in err[0] and "--input-shape" in err[0]


def test_a_model_that_takes_its_cache_is_priced_as_a_step_of_one_new_token():
    """optimum's decoder takes the new tokens and the cache in one model, its mask dim
    named ``past + sequence``: it is priced and timed as the step a generation loop runs
    for each token (``sequence`` = 1), and still checked at more new tokens (before: 64
    new tokens on a cache of 64, a prefill)."""
    model = decode_step(mask_dim="past + sequence", seq="sequence")
    dyn = DynamicModel.load(model)
    assert dyn.first["sequence"] == 1 and dyn.first["past"] > 1 and dyn.new_tokens == {"sequence"}
    assert dyn.second["sequence"] > 1 and dyn.empty["past"] == 0 and dyn.empty["sequence"] == 1
    # sizes given still rule, and a model with no cache keeps its defaults
    assert DynamicModel.load(model, {"x": (1, 5, HIDDEN)}).first["sequence"] == 5
    no_cache = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        [_weight("W", (HIDDEN, HIDDEN))]), opset_imports=[helper.make_opsetid("", 17)])
    assert DynamicModel.load(no_cache).first["sequence"] > 1


def _grouped_decode_step() -> onnx.ModelProto:
    """A decode step with grouped-query attention as transformers exports it: 4 query
    heads, 2 key/value heads, each cached head repeated for its group (repeat_kv:
    Unsqueeze, an Expand to a target computed from the cache's Shape, Reshape), the
    mask over every position named ``total`` as exporters name it."""
    heads, kv, head = 4, 2, 4
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q0"]), helper.make_node("Reshape", ["q0", "qs"], ["q1"]),
             helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3])]
    for c in ("k", "v"):
        nodes += [helper.make_node("MatMul", ["x", f"W{c}"], [f"{c}0"]),
                  helper.make_node("Reshape", [f"{c}0", "kvs"], [f"{c}1"]),
                  helper.make_node("Transpose", [f"{c}1"], [f"{c}2"], perm=[0, 2, 1, 3]),
                  helper.make_node("Concat", [f"past_{c}", f"{c}2"], [f"present_{c}"], axis=2),
                  helper.make_node("Shape", [f"present_{c}"], [f"{c}s"]),
                  helper.make_node("Gather", [f"{c}s", "i0"], [f"{c}b"], axis=0),
                  helper.make_node("Gather", [f"{c}s", "i2"], [f"{c}t"], axis=0),
                  helper.make_node("Concat", [f"{c}b", "kvg", f"{c}t", "hd"], [f"{c}to"], axis=0),
                  helper.make_node("Concat", [f"{c}b", "h", f"{c}t", "hd"], [f"{c}sh"], axis=0),
                  helper.make_node("Unsqueeze", [f"present_{c}", "i2"], [f"{c}u"]),
                  helper.make_node("Expand", [f"{c}u", f"{c}to"], [f"{c}e"]),
                  helper.make_node("Reshape", [f"{c}e", f"{c}sh"], [f"{c}r"])]
    nodes += [helper.make_node("Transpose", ["kr"], ["keys_t"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "keys_t"], ["s"]),
              helper.make_node("Unsqueeze", ["mask", "i12"], ["m"]), helper.make_node("Add", ["s", "m"], ["sm"]),
              helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vr"], ["o"]),
              helper.make_node("Transpose", ["o"], ["o1"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o1", "merged"], ["o2"]), helper.make_node("MatMul", ["o2", "Wo"], ["y"])]
    hidden = heads * head
    inits = [_weight("Wq", (hidden, hidden)), _weight("Wk", (hidden, kv * head)), _weight("Wv", (hidden, kv * head)),
             _weight("Wo", (hidden, hidden)), i64("qs", [0, 0, heads, head]), i64("kvs", [0, 0, kv, head]),
             i64("i0", [0]), i64("i2", [2]), i64("i12", [1, 2]), i64("kvg", [kv, heads // kv]), i64("hd", [head]), i64("h", [heads]),
             i64("merged", [0, 0, hidden])]
    cache = lambda name, t: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", kv, t, head])  # noqa: E731
    graph = helper.make_graph(
        nodes, "gqa_step",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, hidden]),
         cache("past_k", "past"), cache("past_v", "past"),
         helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "total"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1, hidden]),
         cache("present_k", "total"), cache("present_v", "total")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_grouped_query_attention_reads_its_cache_without_repeating_it():
    """repeat_kv's Expand (its target computed from the cache's Shape) is imported as the
    table's expand, and the proved rules matmul-repeated-keys/-values group the query
    heads by key head instead: the written step repeats nothing, and computes what the
    input does at both sizes and at an empty cache."""
    model = _grouped_decode_step()
    written, report = taso_egg.optimize_model(model, measure=0)
    assert report.written == "result"
    assert "Expand" not in {n.op_type for n in written.graph.node}
    for batch, past in ((1, 0), (2, 31), (3, 7)):
        feeds = {"x": RNG.standard_normal((batch, 1, 16)).astype(np.float32),
                 "past_k": RNG.standard_normal((batch, 2, past, 4)).astype(np.float32),
                 "past_v": RNG.standard_normal((batch, 2, past, 4)).astype(np.float32),
                 "mask": RNG.standard_normal((batch, past + 1)).astype(np.float32)}
        want, got = onnx_outputs(model, feeds), onnx_outputs(written, feeds)
        for name in ("y", "present_k", "present_v"):
            assert np.allclose(want[name], got[name], rtol=1e-4, atol=1e-5)
