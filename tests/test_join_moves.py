"""Data movement in steps written as one step (product/join_moves.py): a tree of
splits of one tensor along one axis becomes one split, a reshape of a reshape one
reshape; the graph computes the same."""

from __future__ import annotations

import numpy as np

from taso_egg import executor
from taso_egg.graph import Graph
from taso_egg.product.join_moves import join_moves


def _ops(g: Graph) -> list[str]:
    return sorted(n.op for n in g.nodes.values() if n.op not in ("input", "weight"))


def _packed_projection() -> Graph:
    """q | k | v packed in one product, cut as an extraction leaves it: q and k|v, then
    k|v into k and v; a part cut on another axis stays its own split."""
    g = Graph(opset=17)
    x = g.new_input((2, 3, 8), "x")
    w = g.new_weight((8, 24), np.random.default_rng(0).standard_normal((8, 24)).astype(np.float32), "w")
    q, kv = g.split(g.matmul(x, w), 2, (12, 12))
    k, v = g.split(kv, 2, (6, 6))
    g.mark_output(g.reshape(g.reshape(q, (2, 3, 3, 4)), (6, 12)), "q")
    g.mark_output(g.relu(k), "k")
    first, second = g.split(v, 1, (1, 2))
    g.mark_output(first, "v0")
    g.mark_output(second, "v1")
    return g


def test_a_split_tree_and_a_reshape_chain_are_joined_and_compute_the_same():
    g = _packed_projection()
    classes = {(n.id, i): ("class", n.id, i) for n in g.nodes.values() for i in range(len(n.outputs))}
    joined = join_moves(g, classes)
    assert _ops(g).count("split") == 3 and _ops(g).count("reshape") == 2
    splits = [n for n in joined.nodes.values() if n.op == "split"]
    assert sorted(n.params["sizes"] for n in splits) == [(1, 2), (12, 6, 6)]
    assert _ops(joined).count("reshape") == 1
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)}
    want, got = executor.run(g, feeds), executor.run(joined, feeds)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    # each part read keeps the e-class of the part it replaces
    one = next(n for n in splits if n.params["sizes"] == (12, 6, 6))
    old_k = next(n for n in g.nodes.values() if n.op == "split" and n.params["sizes"] == (6, 6))
    assert classes[(one.id, 1)] == ("class", old_k.id, 0)


def test_overlapping_parts_are_left_as_they_are():
    """Two splits of one tensor whose parts read overlap cannot be one split."""
    g = Graph(opset=17)
    x = g.new_input((4, 6), "x")
    a, _ = g.split(x, 1, (4, 2))
    _, b = g.split(x, 1, (2, 4))
    g.mark_output(a, "a")
    g.mark_output(b, "b")
    assert join_moves(g) is g
