"""The graph IR: build-time shape errors, ordering, cycles, dangling edges,
structural hashing, DAG sharing, implicit outputs and weight data."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import taso_egg
from taso_egg import ExecutionError, GraphError, ShapeError, Tensor
from taso_egg.graph import Graph

from conftest import check_against_ort, rel_err


# --- shape errors at build time ----------------------------------------------------

def _g():
    g = taso_egg.new_graph()
    return g, g.new_input((2, 4), name="a"), g.new_input((5, 3), name="b")


def test_matmul_mismatch_names_op_and_shapes():
    g, a, b = _g()
    with pytest.raises(ShapeError, match=r"matmul.*\(4 vs 5\)") as e:
        g.matmul(a, b)
    assert "[2, 4]" in str(e.value) and "[5, 3]" in str(e.value)


def test_conv_channel_mismatch_names_op_and_shapes():
    g = taso_egg.new_graph()
    x = g.new_input((1, 3, 4, 4), name="x")
    w = g.new_weight((2, 2, 3, 3), name="w")
    with pytest.raises(ShapeError, match="conv2d") as e:
        g.conv2d(x, w)
    assert "[1, 3, 4, 4]" in str(e.value) and "[2, 2, 3, 3]" in str(e.value)


def test_conv_out_channels_not_divisible_by_groups():
    g = taso_egg.new_graph()
    x = g.new_input((1, 4, 4, 4), name="x")
    w = g.new_weight((3, 2, 3, 3), name="w")  # groups 2, 3 out channels
    with pytest.raises(ShapeError, match="conv2d.*groups"):
        g.conv2d(x, w)


def test_conv_bias_shape_checked():
    g = taso_egg.new_graph()
    x = g.new_input((1, 2, 4, 4), name="x")
    w = g.new_weight((3, 2, 3, 3), name="w")
    with pytest.raises(ShapeError, match=r"conv2d.*bias.*\(3,\)"):
        g.conv2d(x, w, bias=g.new_weight((2,), name="b"))


def test_conv_kernel_larger_than_input():
    g = taso_egg.new_graph()
    x = g.new_input((1, 2, 2, 2), name="x")
    with pytest.raises(ShapeError, match="conv2d"):
        g.conv2d(x, g.new_weight((3, 2, 3, 3), name="w"), padding="VALID")


def test_bad_activation_and_padding():
    g = taso_egg.new_graph()
    x = g.new_input((1, 2, 4, 4), name="x")
    w = g.new_weight((2, 2, 3, 3), name="w")
    with pytest.raises(ShapeError, match="conv2d.*activation"):
        g.conv2d(x, w, activation="gelu")
    with pytest.raises(ShapeError, match="conv2d.*padding"):
        g.conv2d(x, w, padding="FULL")
    with pytest.raises(ShapeError, match="maxpool2d.*padding"):
        g.maxpool2d(x, (2, 2), (2, 2), (1, 1, 1))


@pytest.mark.parametrize("make", [
    lambda g: g.new_input((2, -1), name="n"),
    lambda g: g.new_weight((-3,), name="w"),
    lambda g: g.constant("one", (2, -1)),
    lambda g: g.reshape(g.new_input((2, 4), name="a"), (-2, -4)),
    lambda g: g.split(g.new_input((2, 4), name="a"), 1, [5, -1]),
], ids=["input", "weight", "const_one", "reshape", "split"])
def test_negative_dims_rejected(make):
    g = taso_egg.new_graph()
    with pytest.raises(ShapeError, match="negative dimension"):
        make(g)


def test_negative_dim_error_names_op():
    with pytest.raises(ShapeError, match=r"input.*\[2, -1\]"):
        taso_egg.new_graph().new_input((2, -1), name="n")
    with pytest.raises(ShapeError, match=r"weight.*\[-3\]"):
        taso_egg.new_graph().new_weight((-3,), name="w")


def test_concat_mismatch():
    g, a, b = _g()
    with pytest.raises(ShapeError, match="concat") as e:
        g.concat(0, [a, b])
    assert "[2, 4]" in str(e.value) and "[5, 3]" in str(e.value)
    with pytest.raises(ShapeError, match="concat"):
        g.concat(0, [a, g.new_input((2, 4, 1), name="r3")])


def test_bad_perm():
    g, a, _ = _g()
    with pytest.raises(ShapeError, match=r"transpose.*\[0, 0\].*\[2, 4\]"):
        g.transpose(a, (0, 0))
    with pytest.raises(ShapeError, match="transpose"):
        g.transpose(a, (0, 1, 2))


def test_reshape_size_mismatch():
    g, a, _ = _g()
    with pytest.raises(ShapeError, match=r"reshape.*8 elements.*\[3, 3\]"):
        g.reshape(a, (3, 3))


def test_split_sizes_not_summing():
    g, a, _ = _g()
    with pytest.raises(ShapeError, match=r"split.*\[1, 2\].*\(4\)"):
        g.split(a, 1, [1, 2])
    with pytest.raises(ShapeError, match="split"):
        g.split(a, 1, 3)


def test_broadcast_mismatch():
    g, a, b = _g()
    with pytest.raises(ShapeError, match=r"ewadd.*\[2, 4\].*\[5, 3\]"):
        g.add(a, b)
    with pytest.raises(ShapeError, match="ewmul"):
        g.mul(a, b)


def test_pool_and_enlarge_errors():
    g = taso_egg.new_graph()
    x = g.new_input((1, 2, 4, 4), name="x")
    with pytest.raises(ShapeError, match="maxpool2d"):
        g.maxpool2d(g.new_input((2, 4), name="r2"), (2, 2), (2, 2))
    with pytest.raises(ShapeError, match="avgpool2d.*strides"):
        g.avgpool2d(x, (2, 2), (0, 1))
    with pytest.raises(ShapeError, match="enlarge"):
        g.enlarge(g.new_weight((2, 2, 3, 3), name="w3"), g.new_weight((2, 2, 4, 4), name="w4"))


def test_weight_data_shape_mismatch():
    with pytest.raises(ShapeError, match="weight"):
        taso_egg.new_graph().new_weight((2, 3), data=np.zeros((3, 2), np.float32), name="w")


def test_failed_build_leaves_graph_unchanged():
    g, a, b = _g()
    before = (len(g.nodes), g.structural_hash())
    with pytest.raises(ShapeError):
        g.matmul(a, b)
    assert (len(g.nodes), g.structural_hash()) == before
    g.matmul(a, g.new_input((4, 3), name="c"))  # still usable


def test_failed_new_input_does_not_burn_its_name():
    g = taso_egg.new_graph()
    with pytest.raises(ShapeError):
        g.new_input((2, -1), name="x")
    g.new_input((2, 1), name="x")  # the corrected retry must work


def test_add_node_checks():
    g, a, _ = _g()
    with pytest.raises(GraphError, match="unknown operator"):
        g.add_node("hardmax", (a,))
    with pytest.raises(ShapeError, match="relu.*1..1 inputs, got 2"):
        g.add_node("relu", (a, a))
    with pytest.raises(ShapeError, match="unknown parameter"):
        g.add_node("relu", (a,), alpha=0.1)
    other = taso_egg.new_graph()
    foreign = other.new_input((2, 4), name="f")
    foreign = dataclasses.replace(foreign, node=999)
    with pytest.raises(GraphError, match="not a tensor of this graph"):
        g.relu(foreign)
    with pytest.raises(GraphError, match="duplicate input name 'a'"):
        g.new_input((1,), name="a")
    g.mark_output(g.relu(a), "y")
    with pytest.raises(GraphError, match="duplicate output name 'y'"):
        g.mark_output(g.tanh(a), "y")


def test_params_are_canonical_and_hashable():
    g = taso_egg.new_graph()
    x = g.new_input((1, 2, 4, 4), name="x")
    y = g.maxpool2d(x, [2, 2], [2, 2], [0, 0, 0, 0])
    params = g.nodes[y.node].params
    assert params["kernel"] == (2, 2) and params["padding"] == (0, 0, 0, 0)
    hash(tuple(sorted(params.items())))


# --- order, cycles, dangling edges -------------------------------------------------

def _rewired():
    """x -> relu (id 1), x -> tanh (id 2); then relu is rewired to read tanh, so the
    lower id depends on the higher one, as after a rewrite."""
    g = taso_egg.new_graph()
    x = g.new_input((3, 4), name="x")
    r = g.relu(x)
    t = g.tanh(x)
    g.nodes[r.node].inputs = (t,)
    g.mark_output(r, "y")
    return g, x, r, t


def test_topo_order_respects_dependencies():
    g, x, r, t = _rewired()
    order = [n.id for n in g.topo_order()]
    assert sorted(order) == sorted(g.nodes)
    pos = {nid: i for i, nid in enumerate(order)}
    for n in g.nodes.values():
        for inp in n.inputs:
            assert pos[inp.node] < pos[n.id]
    assert pos[t.node] < pos[r.node]
    g.validate()
    out = taso_egg.run(g, {"x": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)})["y"]
    assert np.allclose(out, np.maximum(np.tanh(np.linspace(-2, 2, 12).reshape(3, 4)), 0))


def test_topo_order_is_deterministic():
    g = taso_egg.new_graph()
    xs = [g.new_input((2,), name=f"x{i}") for i in range(4)]
    for i in range(3):
        g.add(xs[i], xs[i + 1])
    assert [n.id for n in g.topo_order()] == [0, 1, 2, 3, 4, 5, 6]


def test_cycle_detected_and_named():
    g = taso_egg.new_graph()
    x = g.new_input((3, 4), name="x")
    r = g.relu(x)
    t = g.tanh(r)
    s = g.sigmoid(t)
    g.mark_output(s, "y")
    g.nodes[r.node].inputs = (t,)  # relu <- tanh <- relu
    for call in (g.topo_order, g.validate, lambda: taso_egg.run(g, {"x": np.zeros((3, 4), np.float32)}),
                 lambda: taso_egg.export_onnx(g), g.structural_hash):
        with pytest.raises(GraphError, match=r"cycle.*node \d+ \((relu|tanh)\)"):
            call()


def test_self_loop_detected():
    g = taso_egg.new_graph()
    r = g.relu(g.new_input((2,), name="x"))
    g.nodes[r.node].inputs = (r,)
    with pytest.raises(GraphError, match=r"cycle.*relu"):
        g.validate()


def test_dangling_input_missing_node():
    g = taso_egg.new_graph()
    x = g.new_input((3, 4), name="x")
    r = g.relu(x)
    g.nodes[r.node].inputs = (Tensor(999, 0, x.type),)
    with pytest.raises(GraphError, match=r"node \d+ \(relu\).*dangling"):
        g.validate()
    with pytest.raises(GraphError, match=r"relu.*missing node 999"):
        g.topo_order()


def test_dangling_input_missing_output_index():
    g = taso_egg.new_graph()
    x = g.new_input((3, 4), name="x")
    r = g.relu(x)
    g.nodes[r.node].inputs = (Tensor(x.node, 1, x.type),)
    with pytest.raises(GraphError, match="dangling"):
        g.validate()


def test_validate_catches_type_disagreement():
    g = taso_egg.new_graph()
    x = g.new_input((3, 4), name="x")
    y = g.new_input((4, 3), name="y")
    r = g.relu(x)
    g.nodes[r.node].inputs = (y,)  # stored output type [3, 4] no longer follows
    with pytest.raises(ShapeError, match="relu"):
        g.validate()


def test_validate_catches_output_to_removed_node():
    g = taso_egg.new_graph()
    r = g.relu(g.new_input((3,), name="x"))
    g.mark_output(r, "y")
    del g.nodes[r.node]
    with pytest.raises(GraphError, match="'y'"):
        g.validate()


# --- structural hash ---------------------------------------------------------------

def _block(order: str, strides=(1, 1), wname="w"):
    g = taso_egg.new_graph()
    if order == "forward":
        x = g.new_input((1, 2, 6, 6), name="x")
        w = g.new_weight((4, 2, 3, 3), name=wname)
        b = g.new_weight((4,), name="b")
        c = g.conv2d(x, w, strides=strides, bias=b)
        r = g.relu(c)
        t = g.tanh(c)
        g.mark_output(g.add(r, t), "y")
        g.mark_output(r, "r")
    else:  # leaves first in another order, branches built the other way round
        b = g.new_weight((4,), name="b")
        w = g.new_weight((4, 2, 3, 3), name=wname)
        x = g.new_input((1, 2, 6, 6), name="x")
        c = g.conv2d(x, w, strides=strides, bias=b)
        t = g.tanh(c)
        r = g.relu(c)
        g.mark_output(g.add(r, t), "y")
        g.mark_output(r, "r")
    return g


def test_structural_hash_ignores_insertion_order():
    a, b = _block("forward"), _block("reverse")
    assert [n.op for n in a.nodes.values()] != [n.op for n in b.nodes.values()]
    assert a.structural_hash() == b.structural_hash()


def test_structural_hash_sees_params_names_and_wiring():
    base = _block("forward").structural_hash()
    assert _block("forward", strides=(2, 2)).structural_hash() != base
    assert _block("forward", wname="w2").structural_hash() != base
    g = _block("forward")
    add = next(n for n in g.nodes.values() if n.op == "ewadd")
    add.inputs = add.inputs[::-1]  # add(t, r): same value, different wiring
    assert g.structural_hash() != base


def test_structural_hash_ignores_weight_data():
    a, b = _block("forward"), _block("forward")
    for n in b.weights():
        b.weight_data[n.id] = np.zeros(n.params["shape"], np.float32)
    assert a.structural_hash() == b.structural_hash()


# --- DAGs, implicit outputs, weights -------------------------------------------------

def test_shared_subgraph_runs_correctly():
    g = taso_egg.new_graph()
    x = g.new_input((2, 3), name="x")
    w = g.new_weight((3, 3), name="w")
    h = g.matmul(x, w)                 # used four times
    a = g.relu(h)
    b = g.tanh(h)
    s = g.add(a, b)
    y = g.mul(s, h)
    z = g.add(y, g.matmul(h, w))       # w shared too
    g.mark_output(z, "z")
    g.mark_output(h, "h")
    xv = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    out, _ = check_against_ort(g, {"x": xv})
    wv = g.weight_array(g.nodes[w.node]).astype(np.float64)
    hv = xv @ wv
    ref = (np.maximum(hv, 0) + np.tanh(hv)) * hv + hv @ wv
    assert rel_err(ref, out["z"]) < 1e-5
    assert rel_err(hv, out["h"]) < 1e-6


def test_implicit_outputs_are_sinks():
    g = taso_egg.new_graph()
    x = g.new_input((4, 6), name="x")
    g.new_weight((3,), name="unused_weight")  # a leaf is never an output
    r = g.relu(x)
    p0, p1 = g.split(r, 1, [2, 4])
    t = g.tanh(p0)
    assert [t_ for _, t_ in g.outputs] == [p1, t]
    assert [name for name, _ in g.outputs] == ["output0", "output1"]
    out = taso_egg.run(g)
    xv = taso_egg.random_inputs(g)["x"]
    assert np.array_equal(out["output0"], np.maximum(xv, 0)[:, 2:])
    assert np.allclose(out["output1"], np.tanh(np.maximum(xv, 0)[:, :2]))
    check_against_ort(g)
    g.mark_output(r, "r")  # once marked, only marked outputs count
    assert [name for name, _ in g.outputs] == ["r"]


def test_weight_data_is_deterministic_by_name():
    def build():
        g = taso_egg.new_graph()
        w = g.new_weight((4, 3), name="w1")
        v = g.new_weight((4, 3), name="w2")
        return g, g.weight_array(g.nodes[w.node]), g.weight_array(g.nodes[v.node])

    g1, a1, b1 = build()
    _, a2, b2 = build()
    assert np.array_equal(a1, a2) and np.array_equal(b1, b2)
    assert not np.array_equal(a1, b1)
    assert a1.dtype == np.float32 and np.all(np.isfinite(a1)) and a1.std() > 0
    # cached: the same array every time, and it is what run and export use
    assert g1.weight_array(g1.weights()[0]) is a1


def test_weight_data_differs_for_names_sharing_a_suffix():
    g = taso_egg.new_graph()
    a = g.new_weight((4, 3), name="layer1.conv.weight")
    b = g.new_weight((4, 3), name="layer2.conv.weight")
    assert not np.array_equal(g.weight_array(g.nodes[a.node]), g.weight_array(g.nodes[b.node]))


def test_given_weight_data_is_used():
    g = taso_egg.new_graph()
    data = np.arange(6, dtype=np.float64).reshape(2, 3)
    x = g.new_input((2, 3), name="x", dtype="float64")
    w = g.new_weight((2, 3), data=data, name="w")
    assert w.dtype == "float64"
    g.mark_output(g.add(x, w), "y")
    out = taso_egg.run(g, {"x": np.zeros((2, 3))})["y"]
    assert np.array_equal(out, data)


def test_run_checks_feeds():
    g = taso_egg.new_graph()
    g.mark_output(g.relu(g.new_input((2, 3), name="x")), "y")
    with pytest.raises(ExecutionError, match="'x'.*not fed"):
        taso_egg.run(g, {})
    with pytest.raises(ExecutionError, match=r"'x'.*\[3, 2\]"):
        taso_egg.run(g, {"x": np.zeros((3, 2), np.float32)})


def test_summary_and_counts():
    g = _block("forward")
    assert g.op_counts() == {"conv2d": 1, "relu": 1, "tanh": 1, "ewadd": 1}
    assert "conv2d x1" in g.summary()
    assert isinstance(g, Graph)
