"""Softmax, added as one declaration (taso_egg/ops/nn.py), two axioms and one rule: it
imports from ONNX as the table's operator, runs like onnxruntime, exports back, and
rewrites through the e-graph."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import helper

import taso_egg
from taso_egg.check.runtime import onnx_outputs
from taso_egg.graph import Graph
from taso_egg.options import OptimizeOptions
from taso_egg.rules.corpus import load_corpus

from conftest import assert_close, make_model, vi


@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 1), (17, 0), (11, 2)])
def test_onnx_softmax_imports_as_the_tables_operator(opset, axis):
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)],
                       [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])], opset=opset)
    g = taso_egg.load_onnx(model)
    assert Counter(n.op for n in g.nodes.values()) == {"input": 1, "softmax": 1}
    (node,) = [n for n in g.nodes.values() if n.op == "softmax"]
    assert 0 <= node.params["axis"] < 3
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32) * 4}
    want = onnx_outputs(model, feeds)
    assert_close(want, taso_egg.run(g, feeds), 1e-5)
    assert_close(want, onnx_outputs(taso_egg.export_onnx(g), feeds), 1e-5)


def test_softmax_kernel_is_stable_for_large_inputs():
    g = Graph()
    x = g.new_input((2, 5), name="x")
    g.mark_output(g.add_node("softmax", [x], axis=1)[0])
    out = taso_egg.run(g, {"x": np.array([[1e4, 0, -1e4, 3, 3]] * 2, np.float32)})
    (y,) = out.values()
    assert np.isfinite(y).all() and np.allclose(y.sum(axis=1), 1)


def test_two_softmaxes_of_a_concat_become_one():
    g = Graph()
    a, b = g.new_input((2, 3, 8)), g.new_input((2, 5, 8))
    g.mark_output(g.concat(1, [g.add_node("softmax", [a], axis=2)[0], g.add_node("softmax", [b], axis=2)[0]]))
    rules = [r for r in load_corpus() if r.name == "merge-softmax-concat"]
    assert rules, "the rule is in the proved corpus"
    res = taso_egg.optimize(g, rules=rules, options=OptimizeOptions().replace(profile="analytic", measure=0))
    assert res.graph.op_counts(runtime_only=True) == {"concat": 1, "softmax": 1}
    assert res.cost_after < res.cost_before


def test_softmax_along_the_concat_axis_is_not_merged():
    g = Graph()
    a, b = g.new_input((2, 3)), g.new_input((2, 5))
    g.mark_output(g.concat(1, [g.add_node("softmax", [a], axis=1)[0], g.add_node("softmax", [b], axis=1)[0]]))
    rules = [r for r in load_corpus() if r.name == "merge-softmax-concat"]
    res = taso_egg.optimize(g, rules=rules, options=OptimizeOptions().replace(profile="analytic", measure=0))
    assert res.graph.op_counts(runtime_only=True)["softmax"] == 2
