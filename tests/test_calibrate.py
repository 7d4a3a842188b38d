"""Calibrating the cost model on one onnxruntime profile of the input (``taso_egg.product.calibrate``,
``cost.calibrated``): the arithmetic on a synthetic profile, and the profiler's table of a
tiny model. No timings are asserted: measured seconds are whatever this machine took."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import taso_egg
from taso_egg.product.calibrate import kernel_units, runtime_profile, seconds_per_run
from taso_egg.cost import CalibratedCost, OpConfig, load_cost_model, node_config
from taso_egg.cost.calibrated import spread
from taso_egg.executor import random_inputs
from taso_egg.onnx_io.exporter import export_fed_named
from taso_egg.ops import OPS, TensorType
from taso_egg.product.timing import node_events


def _tiny_model():
    """x -> Conv -> Relu -> Add x (a residual) -> MatMul by a weight -> Add a bias."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w", (4, 4, 3, 3)), ("b", (4,)), ("m", (8, 8)), ("mb", (8,)))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["s"]),
             helper.make_node("MatMul", ["s", "m"], ["mm"]),
             helper.make_node("Add", ["mm", "mb"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _runtime_nodes(graph):
    """The graph's run-time nodes (not folded, not leaves) and their configurations."""
    folded = graph.weight_only_nodes()
    return {n.id: node_config(n, [t.node in folded for t in n.inputs])
            for n in graph.nodes.values() if n.id not in folded and not OPS[n.op].is_leaf}


def test_spread_shares_a_kernel_by_predicted_cost():
    measured, unattributed = spread([(3.0, [1, 2]), (0.5, [3]), (0.25, [])], {1: 2.0, 2: 1.0, 3: 0.0, 4: 5.0})
    assert measured == {1: 2.0, 2: 1.0, 3: 0.0, 4: 0.0}  # 4: computed by no kernel (fused away)
    assert unattributed == 0.75  # the kernels of nothing priced


def test_scales_per_runtime_kernel_given_to_operators():
    class Flat:  # every configuration predicted 1 s
        def cost(self, config):
            return 1.0

    x = TensorType((4,), "float32")
    relu, add = OpConfig.of("relu", {}, [x]), OpConfig.of("ewadd", {}, [x, x])
    neg = OpConfig.of("erf", {}, [x])
    cal = CalibratedCost.fit(Flat(), [(relu, 0.5, "Relu"), (relu, 1.5, "Relu"), (relu, 0.0, "FusedConv"),
                                      (add, 3.0, "FusedConv"), (add, 1.0, "Add"), (add, 1.0, "Add"),
                                      (neg, 4.0, "Add")])
    # Relu kernels: 2 s over 2 predicted; FusedConv: 3 s over 2; Add: 6 s over 3. Most of
    # ewadd's predicted cost runs in Add kernels: it takes their scale, as erf does.
    assert cal.by_op == {"relu": 1.0, "ewadd": 2.0, "erf": 2.0}
    assert cal.cost(OpConfig.of("relu", {}, [TensorType((2,), "float32")])) == 1.0
    assert cal.cost(OpConfig.of("ewmul", {}, [x, x])) == 11.0 / 7  # an operator the input lacks: overall


def test_synthetic_profile_maps_to_the_graph_nodes():
    """onnxruntime's profile json, made up, with what its fusions do to names: a conv
    with its activation and residual in NCHWc layout named after the tensor it computes,
    with reorders between; a MatMul and bias fused into a Gemm between two reshapes of
    its own; a copy of the output, which computes nothing new (its time the Gemm's); a
    kernel that reads only the input and computes nothing priced."""
    graph = taso_egg.load_onnx(_tiny_model())
    _, names = export_fed_named(graph)
    tensor = {graph.nodes[nid].op: onnx_name for onnx_name, (nid, _) in names.items()}  # one per op but ewadd
    residual = next(onnx_name for onnx_name, (nid, _) in names.items()  # the add the MatMul reads
                    if graph.nodes[nid].op == "ewadd" and graph.nodes[nid].inputs[0].node != graph.outputs[0][1].node
                    and graph.nodes[graph.nodes[nid].inputs[0].node].op == "relu")
    output = graph.outputs[0][0]
    ran = [("ReorderInput", ["x"], ["reorder_token_0"], "ReorderInput"),
           (f"{residual}_nchwc", ["reorder_token_0", "reorder_w", "b", "reorder_token_0"], ["reorder_token_1"], "Conv"),
           ("ReorderOutput", ["reorder_token_1"], [residual], "ReorderOutput"),
           ("gemm_input_reshape", [residual, "shape"], ["gemm_in"], "Reshape"),
           ("MatMulAddFusion", ["gemm_in", "m", "mb"], ["gemm_out"], "Gemm"),
           ("gemm_output_reshape", ["gemm_out", "shape2"], [output], "Reshape"),
           ("Copy", [output], ["unused"], "Identity"),
           ("Cast", ["x"], ["x_copy"], "Cast")]
    durations = {"ReorderInput": 10, f"{residual}_nchwc": 70, "ReorderOutput": 20, "gemm_input_reshape": 1,
                 "MatMulAddFusion": 28, "gemm_output_reshape": 1, "Copy": 5, "Cast": 2}
    events = [{"cat": "Session", "name": "model_run", "dur": 999}]
    for run in range(4):  # a warm-up run, then three, one of them under a burst of load
        events += [{"cat": "Node", "name": f"{n}_kernel_time", "dur": d * (5 if run == 2 else 1),
                    "args": {"op_name": "X"}} for n, d in durations.items()]
    seconds = seconds_per_run(node_events(events, runs=3), runs=3)
    assert seconds[f"{residual}_nchwc"] == pytest.approx(70e-6)  # the median run's
    units = kernel_units(graph, ran, names, seconds)
    assert [round(s * 1e6) for s, _, _ in units] == [100, 35, 2]
    assert [sorted(graph.nodes[n].op for n in nodes) for _, nodes, _ in units] == \
        [["conv2d", "ewadd", "relu"], ["ewadd", "matmul"], []]
    assert [kind for _, _, kind in units] == ["Conv", "Gemm", "Cast"]  # each unit's dearest kernel
    assert names[tensor["conv2d"]][0] in units[0][1]
    configs = _runtime_nodes(graph)
    base = load_cost_model()
    predicted = {nid: base.cost(c) for nid, c in configs.items()}
    measured, unattributed = spread(units, predicted)
    assert unattributed == pytest.approx(2e-6)
    assert sum(measured.values()) == pytest.approx(135e-6)
    kind = {n: k for _, nodes, k in units for n in nodes}
    cal = CalibratedCost.fit(base, [(configs[n], measured[n], kind[n]) for n in configs])
    # an operator that runs in one kind of kernel costs its share of that kernel's time
    for op in ("conv2d", "relu", "matmul"):
        (node,) = [n for n, c in configs.items() if c.op == op]
        assert cal.cost(configs[node]) == pytest.approx(measured[node])


def test_onnxruntime_profile_of_a_tiny_model_is_a_per_node_table():
    graph = taso_egg.load_onnx(_tiny_model())
    profile = runtime_profile(graph, random_inputs(graph), runs=2)
    configs = _runtime_nodes(graph)
    covered = [n for _, nodes, _ in profile.units for n in nodes]
    assert len(covered) == len(set(covered))  # no node computed twice
    assert set(configs) <= set(covered)       # every run-time node computed by some kernel
    assert all(seconds >= 0 and kind for seconds, _, kind in profile.units)
    assert profile.kernel_seconds == pytest.approx(sum(s for s, _, _ in profile.units))
    base = load_cost_model()
    predicted = {nid: base.cost(c) for nid, c in configs.items()}
    measured, _ = spread(profile.units, predicted)
    kind = {n: k for _, nodes, k in profile.units for n in nodes}
    cal = CalibratedCost.fit(base, [(configs[n], measured[n], kind[n]) for n in configs])
    assert {c.op for c in configs.values()} == set(cal.by_op)
    assert all(scale >= 0 for scale in cal.by_op.values())


def test_the_graph_onnxruntime_runs_is_written_without_its_weights(tmp_path):
    """The profile reads back only the graph onnxruntime runs: its weights go to the
    null device (GPT-2-large's profile spent 10 s of 39 writing 3.35 GB), and the graph
    still names them."""
    import onnx

    from taso_egg.product.timing import make_session

    table = numpy_helper.from_array(np.ones((1000, 256), np.float32), "table")  # 1 MB, not prepacked
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 256])], [table])
    source = tmp_path / "in.onnx"  # from a file, as the profile builds it: onnxruntime writes the weights
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source),
              save_as_external_data=True, location="in.data", size_threshold=0)
    path = tmp_path / "optimized.onnx"
    make_session(str(source), optimized_path=str(path))
    ran = onnx.load(str(path), load_external_data=False)
    assert [n.op_type for n in ran.graph.node] == ["Gather"] and [t.name for t in ran.graph.initializer] == ["table"]
    data = tmp_path / "optimized.onnx.data"
    assert not data.exists() or data.resolve() == Path(os.devnull).resolve()
