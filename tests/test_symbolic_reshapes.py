"""A model with symbolic dims written back with Reshape targets that say their sizes
as ONNX lets them (0: the input's size at that axis; -1: what the element count
leaves) rather than computed from ``Shape`` at every run (product/symbolize.py,
``_ReshapeInputs``), and equal to the input at sizes it was not priced at, an empty
dim included."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def _heads_model() -> onnx.ModelProto:
    """x [batch, seq, 16] split into 4 heads of 4 and back, as an exporter writes it:
    each target computed from the input's Shape; then rows [batch * seq, 16]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array([4, 4], np.int64), "heads"),
             numpy_helper.from_array(np.array([16], np.int64), "hidden"),
             numpy_helper.from_array(np.array([-1, 16], np.int64), "rows")]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], axis=0),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Concat", ["batch", "seq", "heads"], ["split_shape"], axis=0),
        helper.make_node("Reshape", ["x", "split_shape"], ["split"]),
        helper.make_node("Transpose", ["split"], ["by_head"], perm=[0, 2, 1, 3]),
        helper.make_node("Relu", ["by_head"], ["act"]),
        helper.make_node("Transpose", ["act"], ["back"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["batch", "seq", "hidden"], ["merge_shape"], axis=0),
        helper.make_node("Reshape", ["back", "merge_shape"], ["merged"]),
        helper.make_node("MatMul", ["merged", "w"], ["projected"]),
        helper.make_node("Reshape", ["projected", "rows"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             ["batch", "seq", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 16])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_reshape_targets_are_constants_that_copy_the_input_sizes():
    """The re-export written with its symbolic dims: every target a constant (the
    batch and sequence copied, the rows inferred), no Shape computed, and equal to the
    input at other sizes, a sequence of 0 included."""
    from taso_egg.onnx_io.fed import FedModel
    from taso_egg.product.dynamic import DynamicModel, write_symbolic

    model = _heads_model()
    dyn = DynamicModel.load(model)
    written = write_symbolic(dyn, dyn.graph)
    assert written.model is not None, written.why
    out = written.model.model if isinstance(written.model, FedModel) else written.model
    produced = {o: n for n in out.graph.node for o in n.output}
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    targets = [inits.get(n.input[1]) for n in out.graph.node if n.op_type == "Reshape"]
    assert targets and all(t is not None for t in targets)
    assert not any(n.input[1] in produced for n in out.graph.node if n.op_type == "Reshape")
    assert sorted(t.tolist() for t in targets) == [[-1, 16], [0, 0, 4, 4], [0, 0, 16]]
    assert "Shape" not in {n.op_type for n in out.graph.node}
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                 for m in (model, out))
    for shape in [(1, 1, 16), (3, 5, 16), (2, 0, 16)]:
        x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        a, b = want.run(None, {"x": x})[0], got.run(None, {"x": x})[0]
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def _expanded_mask_model() -> onnx.ModelProto:
    """A mask [batch, 1, 1, total] broadcast against the positions [1, 1, seq, 1] and
    then expanded, as transformers' exports write it, to the shape it already has,
    computed from the inputs' Shape: [batch, 1, seq, total]."""
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.array(0, np.int64), "zero_scalar"),
             numpy_helper.from_array(np.array(1, np.int64), "one_scalar"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
             numpy_helper.from_array(np.array(0.0, np.float32), "keep"),
             numpy_helper.from_array(np.array(-1e4, np.float32), "hide")]
    nodes = [
        helper.make_node("Shape", ["mask"], ["mask_shape"]),
        helper.make_node("Shape", ["scores"], ["scores_shape"]),
        helper.make_node("Gather", ["mask_shape", "zero"], ["batch"], axis=0),
        helper.make_node("Gather", ["mask_shape", "one"], ["total"], axis=0),
        # the sequence length as the positions' Range gives it (what no import folds)
        helper.make_node("Gather", ["scores_shape", "one_scalar"], ["seq_scalar"], axis=0),
        helper.make_node("Range", ["zero_scalar", "seq_scalar", "one_scalar"], ["positions"]),
        helper.make_node("Shape", ["positions"], ["seq"]),
        helper.make_node("Concat", ["batch", "one", "seq", "total"], ["full"], axis=0),
        helper.make_node("Cast", ["mask"], ["kept"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["kept", "axes"], ["kept4"]),
        helper.make_node("Cast", ["scores"], ["scores_bool"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["scores_bool", "one"], ["rows"]),
        helper.make_node("And", ["kept4", "rows"], ["seen"]),
        helper.make_node("Expand", ["seen", "full"], ["seen_full"]),
        helper.make_node("Where", ["seen_full", "keep", "hide"], ["bias"]),
    ]
    graph = helper.make_graph(
        nodes, "mask", [helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "total"]),
                        helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", "seq", "total"])],
        [helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", 1, "seq", "total"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_an_expand_to_the_shape_a_tensor_has_is_not_written():
    """Its shape arithmetic goes with it; the model is equal at other sizes."""
    from taso_egg.onnx_io.fed import FedModel
    from taso_egg.product.dynamic import DynamicModel, write_symbolic

    model = _expanded_mask_model()
    dyn = DynamicModel.load(model)
    written = write_symbolic(dyn, dyn.graph)
    assert written.model is not None, written.why
    out = written.model.model if isinstance(written.model, FedModel) else written.model
    ops = [n.op_type for n in out.graph.node]
    assert "Expand" not in ops and "Range" not in ops, ops  # the Range only sized the Expand
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                 for m in (model, out))
    rng = np.random.default_rng(0)
    for batch, seq, total in [(1, 1, 1), (3, 4, 9), (2, 1, 6)]:
        feeds = {"mask": (rng.random((batch, total)) > 0.3).astype(np.int64),
                 "scores": rng.standard_normal((batch, seq, total)).astype(np.float32)}
        np.testing.assert_array_equal(got.run(None, feeds)[0], want.run(None, feeds)[0])
