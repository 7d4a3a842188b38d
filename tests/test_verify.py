"""The numerical equivalence check: the exponent-tracking executor it runs on, and
that it passes equal graphs and fails different ones, also where float32 overflows."""

from __future__ import annotations

import numpy as np
import pytest

from taso_egg.research import zoo
from taso_egg.check.scaled_executor import run_scaled
from taso_egg.check.whole_graph import check_graphs_equivalent
from taso_egg.errors import VerificationError
from taso_egg.executor import random_inputs, run
from taso_egg.graph import new_graph


def _mixed_graph():
    """One of every kind of operator run_scaled treats differently."""
    g = new_graph()
    x = g.new_input((1, 4, 6, 6), name="x")
    # Scales far from 1 so that every tracked exponent matters.
    rng = np.random.default_rng(1)
    w1 = g.new_weight((4, 4, 3, 3), data=(rng.standard_normal((4, 4, 3, 3)) * 300).astype(np.float32),
                      name="w1")
    w2 = g.new_weight((4, 4, 1, 1), name="w2")
    a = g.conv2d(x, w1, activation="RELU")                       # multilinear
    b = g.conv2d(x, g.enlarge(w2, w1), activation="SIGMOID")     # enlarge; non-homogeneous
    c = g.concat(1, [a, g.add(a, b)])                            # additive
    left, right = g.split(c, 1, (3, 5))
    y = g.maxpool2d(g.mul(left, g.tanh(left)), (2, 2), (2, 2))
    s = g.new_weight((), name="s")
    scale, bias, mean = (g.new_weight((5,), name=n) for n in ("bn.s", "bn.b", "bn.m"))
    var = g.new_weight((5,), data=np.full(5, 0.5, np.float32), name="bn.v")
    z = g.batchnorm(g.scalar_mul(right, s), scale, bias, mean, var)
    g.mark_output(y, "y")
    g.mark_output(g.reshape(z, (5, 36)), "z")
    return g


def test_run_scaled_matches_float64_run():
    g = _mixed_graph()
    feeds = {k: v * 1e-3 for k, v in random_inputs(g).items()}
    plain = run(g, feeds, float64=True)
    scaled = run_scaled(g, feeds)
    assert set(scaled) == set(plain)
    for name, (m, e) in scaled.items():
        assert 0.5 <= np.max(np.abs(m)) < 1.0  # normalized
        np.testing.assert_allclose(np.ldexp(m, e), plain[name], rtol=1e-12, atol=0)


def _deep_bert():
    """Float32 overflows or vanishes on this one for any input of unit scale."""
    return zoo.bert(layers=6, batch=2, seq=4, hidden=16, heads=2)


def test_float32_overflows_on_the_deep_model():
    with np.errstate(all="ignore"):
        out = run(_deep_bert(), random_inputs(_deep_bert()))["y"]
    peak = np.max(np.abs(out))
    assert not (np.isfinite(peak) and 1e-30 < peak < 1e30)


def test_equivalent_deep_models_pass_and_perturbed_ones_fail():
    g = _deep_bert()
    assert check_graphs_equivalent(g, _deep_bert()) < 1e-10

    changed = _deep_bert()
    w = next(n for n in changed.weights() if n.params["name"] == "l3.wv")
    data = changed.weight_array(w).copy()
    data[0, 0] *= 1.01  # one weight, 1 %: a real bug of this size must not pass
    changed.weight_data[w.id] = data
    with pytest.raises(VerificationError, match="differs"):
        check_graphs_equivalent(g, changed)


def _zero_head(hidden_relu: bool = False):
    """x @ w1 (relu'd or not) @ head, where head is all zeros (as torchvision's ViT
    initializes its classifier): every output is 0 whatever the graph above it does."""
    g = new_graph()
    x = g.new_input((2, 3), name="x")
    h = g.matmul(x, g.new_weight((3, 4), name="w1"))
    if hidden_relu:
        h = g.relu(h)
    g.mark_output(g.matmul(h, g.new_weight((4, 5), data=np.zeros((4, 5), np.float32), name="head")), "y")
    return g


def test_outputs_zeroed_by_weights_are_checked_with_stand_in_weights():
    g, same = _zero_head(), _zero_head()
    assert check_graphs_equivalent(g, same) < 1e-12
    with pytest.raises(VerificationError, match="zero weights replaced.*differs"):
        check_graphs_equivalent(g, _zero_head(hidden_relu=True))  # equal on zeros, wrong above
    head = next(n for n in g.weights() if n.params["name"] == "head")
    assert not np.any(g.weight_array(head))  # the stand-ins are put back


def test_an_output_zero_for_any_weights_is_inconclusive():
    from onnx import helper

    from taso_egg.onnx_io.importer import load_onnx

    from conftest import make_model, vi

    def zeros():  # x - x: zero whatever the weights
        return load_onnx(make_model([helper.make_node("Sub", ["x", "x"], ["y"])], [vi("x", [2, 3])],
                                    [vi("y", [2, 3])]))
    with pytest.raises(VerificationError, match="inconclusive"):
        check_graphs_equivalent(zeros(), zeros())


def test_every_operator_declares_a_known_scaling():
    from taso_egg.ops import OPS

    assert {spec.scaling for spec in OPS.values()} <= {"", "multilinear", "additive", "first"}
    assert {n for n, s in OPS.items() if s.scaling == "additive"} == {"ewadd", "ewsub", "concat"}
