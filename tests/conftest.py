"""Shared helpers for the foundation tests: seeded data, output comparison, and the
"our executor vs the exported model in onnxruntime" check."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import taso_egg
from taso_egg.check.runtime import onnx_outputs

RTOL = 1e-5


def rel_err(ref, got) -> float:
    """Max abs difference relative to the reference's scale."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    assert ref.shape == got.shape, f"shape {got.shape} != expected {ref.shape}"
    if ref.size == 0:
        return 0.0
    assert np.all(np.isfinite(ref) == np.isfinite(got))
    scale = max(float(np.max(np.abs(ref))), 1e-12)
    return float(np.max(np.abs(got - ref))) / scale


def assert_close(expected: dict, actual: dict, rtol: float = RTOL) -> None:
    assert set(expected) == set(actual), f"outputs {sorted(actual)} != {sorted(expected)}"
    for name in expected:
        err = rel_err(expected[name], actual[name])
        assert err <= rtol, f"output {name!r}: relative error {err:.3g} > {rtol:g}"


def feeds_for(g, seed: int = 0) -> dict:
    return taso_egg.random_inputs(g, seed)


def check_against_ort(g, feeds=None, rtol: float = RTOL):
    """Run ``g`` with our kernels, export it, run the export in onnxruntime, compare.
    Returns (our outputs, the exported model)."""
    g.validate()
    feeds = feeds_for(g) if feeds is None else feeds
    ours = taso_egg.run(g, feeds)
    assert ours, "graph has no outputs"
    model = taso_egg.export_onnx(g)
    onnx.checker.check_model(model)
    theirs = onnx_outputs(model, feeds)
    assert_close(theirs, ours, rtol)
    return ours, model


def make_model(nodes, inputs, outputs, initializers=(), opset: int = 17, domains=()):
    """A small ONNX model from onnx.helper pieces (opset-appropriate IR version)."""
    from onnx import helper

    from taso_egg.ops.versions import ir_version_for

    graph = helper.make_graph(list(nodes), "test", list(inputs), list(outputs), list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in domains]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version_for(opset))


def vi(name, shape, elem=onnx.TensorProto.FLOAT):
    return onnx.helper.make_tensor_value_info(name, elem, shape)


def init(name, array):
    return onnx.numpy_helper.from_array(np.asarray(array), name)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def cluttered_conv_model():
    """relu(conv(x) + b), as exporters write such things: Identity nodes around the conv
    and the bias a Constant taken through Shape/Expand/CastLike. The importer folds it
    all, so its re-export is Conv, Add, Relu."""
    from onnx import helper

    rng = np.random.default_rng(5)
    bias = onnx.numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "b")
    nodes = [helper.make_node("Identity", ["x"], ["x1"]),
             helper.make_node("Conv", ["x1", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Identity", ["c"], ["c1"]),
             helper.make_node("Constant", [], ["b"], value=bias),
             helper.make_node("Shape", ["c1"], ["s"]),
             helper.make_node("Expand", ["b", "s"], ["be"]),
             helper.make_node("CastLike", ["be", "c1"], ["bc"]),
             helper.make_node("Add", ["c1", "bc"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return make_model(nodes, [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8])],
                      [init("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))])


@pytest.fixture
def fake_timer(monkeypatch):
    """Replace onnxruntime timing (``timing.ort_rounds``) with fixed milliseconds per
    candidate name: set ``fake_timer.ms`` to a dict (every round the same), or
    ``fake_timer.runs`` to lists (round by round, repeated from the start when the
    guard asks for more); ``fake_timer.timed`` lists the names timed per session and
    ``fake_timer.rounds`` how many rounds were asked for in all. ``fake_timer.predicted``
    (candidate name -> speedup, and the most it could reach) stands for the predictions
    that decide which candidates are timed (``decide.predicted_speedups``): a candidate
    it does not name is predicted faster, so the guard times every candidate unless a test says otherwise."""
    from types import SimpleNamespace

    from taso_egg.product import decide, timing

    state = SimpleNamespace(ms={}, timed=[], runs=None, rounds=0, predicted={})

    def predictions(models, *args, **kwargs):
        speedups = {name: state.predicted.get(name, 2.0) for name in models if name != "original"}
        return {name: decide.Prediction(s, s) for name, s in speedups.items()}

    monkeypatch.setattr(decide, "predicted_speedups", predictions)

    def ort_rounds(models, feeds, threads=1):
        state.timed.append(list(models))
        done = 0

        def next_round(names=None):
            nonlocal done
            done += 1
            state.rounds += 1
            if state.runs is not None:  # round by round, as given
                return {name: state.runs[name][(done - 1) % len(state.runs[name])] for name in models}
            return {name: state.ms[name] for name in models}

        return next_round

    monkeypatch.setattr(timing, "ort_rounds", ort_rounds)
    return state
