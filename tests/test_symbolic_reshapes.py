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
