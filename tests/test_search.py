"""The backtracking search: pattern matcher, rewriting, search loop and CLI."""

from __future__ import annotations

import numpy as np
import pytest
from taso_egg.rules.instantiate import PatternBuilder, example_values
from taso_egg.rules.corpus import load_corpus
from taso_egg.rules.syntax import parse_rules

from taso_egg.research import zoo
from taso_egg.check.whole_graph import check_graphs_equivalent
from taso_egg.cli import main
from taso_egg.cost import AnalyticCost, graph_cost
from taso_egg.errors import LimitError
from taso_egg.graph import Graph
from taso_egg.research.search import (
    GraphIndex,
    Rejected,
    apply_match,
    backtracking_search,
    compile_rules,
    find_matches,
)
from taso_egg.research.search.search import _Search, _State

HAND = {r.name: r for r in load_corpus("taso_hand")}
COST = AnalyticCost()  # the search's default is a measured profile; tests need no file


def rule(text: str):
    return parse_rules(text)[0]


def matches(graph, *rules):
    return list(find_matches(GraphIndex(graph), compile_rules(rules)))


# --- matcher ---------------------------------------------------------------------


def test_nested_pattern_and_literal_parameter():
    g = Graph()
    x, w = g.new_input((2, 3), name="x"), g.new_weight((3, 4), name="w")
    fused = g.matmul(x, w, activation="RELU")
    plain = g.relu(g.matmul(x, w))
    g.mark_output(g.add(plain, g.relu(fused)), "y")
    (m,) = matches(g, HAND["matmul-relu-fusion"])  # relu(matmul RELU ..) is not NONE
    assert m.roots == (plain,)
    assert m.tensors == {"a": x, "b": w}
    assert len(m.nodes) == 2


def test_repeated_tensor_variable_binds_one_tensor():
    r = rule("(rule twice :lhs (ewadd ?a ?a) :rhs (smul ?a ?a))")
    g = Graph()
    x, y = g.new_input((2, 2), name="x"), g.new_input((2, 2), name="y")
    same, other = g.add(x, x), g.add(x, y)
    g.mark_output(g.add(same, other))
    assert [m.roots[0] for m in matches(g, r)] == [same]


def test_repeated_parameter_variable_needs_equal_values():
    g = Graph()
    x = g.new_input((1, 4, 6, 6), name="x")
    w1, w2 = g.new_weight((3, 4, 3, 3), name="w1"), g.new_weight((3, 4, 3, 3), name="w2")
    same = g.add(g.conv2d(x, w1), g.conv2d(x, w2))
    differ = g.add(g.conv2d(x, w1), g.conv2d(x, w2, padding=(1, 1, 1, 1)))  # same shape
    g.mark_output(same, "a")
    g.mark_output(differ, "b")
    found = matches(g, HAND["conv-factor-weights"])
    assert [m.roots[0] for m in found] == [same]
    assert found[0].params == {"s": (1, 1), "p": "SAME"}


def test_proj_matches_the_right_output_of_a_split():
    g = Graph()
    a, b = g.new_input((2, 3), name="a"), g.new_input((2, 5), name="b")
    first, second = g.split(g.concat(1, [a, b]), 1, [3, 5])
    crossed = g.split(g.concat(0, [a, a]), 1, [1, 2])  # split axis differs from the concat's
    for i, t in enumerate((first, second, *crossed)):
        g.mark_output(t, f"o{i}")
    m1 = matches(g, HAND["split-concat-first"])
    m2 = matches(g, HAND["split-concat-second"])
    assert [m.roots[0] for m in m1] == [first]
    assert [m.roots[0] for m in m2] == [second]
    assert m2[0].tensors["b"] == b and m2[0].params == {"ax": 1, "sizes": (3, 5)}


def test_guards_over_parameter_expressions():
    r = rule("""(rule guarded :lhs (transpose ?p ?x) :rhs (transpose ?p ?x)
      :if ((= (+ (dim ?x 0) 1) 3) (< (rank ?x) 3) (= (at ?p 0) 1) (= (len ?p) 2)
           (!= (shape ?x) (vec 2 2)) (>= (* (dim ?x 1) 2) 6) (<= (/ (dim ?x 1) 2) 1)
           (> (- (dim ?x 1) 1) 1)))""")
    g = Graph()
    ok = g.transpose(g.new_input((2, 3), name="a"), (1, 0))
    bad = [g.transpose(g.new_input(s, name=f"b{i}"), (1, 0)) for i, s in enumerate([(3, 3), (2, 2), (2, 5)])]
    for i, t in enumerate([ok, *bad]):
        g.mark_output(t, f"o{i}")
    assert [m.roots[0] for m in matches(g, r)] == [ok]


def test_guard_that_cannot_be_evaluated_does_not_match():
    r = rule("(rule deep :lhs (relu ?x) :rhs (relu ?x) :if ((= (dim ?x 3) 1)))")
    g = Graph()
    g.mark_output(g.relu(g.new_input((2, 3), name="x")))
    assert matches(g, r) == []


def _three_matmuls(second_is_weight=True, derived=False):
    g = Graph()
    x = g.new_input((2, 4), name="x")
    w1 = g.new_weight((4, 3), name="w1")
    w2 = g.new_weight((4, 5), name="w2") if second_is_weight else g.new_input((4, 5), name="w2")
    if derived:
        w2 = g.relu(w2)
    w3 = g.new_weight((4, 2), name="w3")
    outs = [g.matmul(x, w) for w in (w1, w2, w3)]
    for i, t in enumerate(outs):
        g.mark_output(t, f"y{i}")
    return g, outs


def test_multi_pattern_weight_and_before_guards():
    merge = HAND["merge-matmul-shared-input"]
    g, outs = _three_matmuls()
    found = matches(g, merge)
    # each unordered pair once, in weight order
    assert {m.roots for m in found} == {(outs[0], outs[1]), (outs[0], outs[2]), (outs[1], outs[2])}
    assert len(found) == 3
    g, outs = _three_matmuls(second_is_weight=False)  # w2 is an input: only (w1, w3)
    assert [m.roots for m in matches(g, merge)] == [(outs[0], outs[2])]
    g, outs = _three_matmuls(derived=True)  # relu(w2) is computed from weights only
    assert len(matches(g, merge)) == 3


def test_multi_pattern_shared_variable_must_agree():
    g = Graph()
    x, z = g.new_input((2, 4), name="x"), g.new_input((2, 4), name="z")
    w1, w2 = g.new_weight((4, 3), name="w1"), g.new_weight((4, 5), name="w2")
    g.mark_output(g.matmul(x, w1), "a")
    g.mark_output(g.matmul(z, w2), "b")
    assert matches(g, HAND["merge-matmul-shared-input"]) == []


# --- rewriting ---------------------------------------------------------------------


def _lhs_graph(r):
    """The rule's lhs on its example: variables are inputs (weights where guarded).
    Weights get random data unless an operator (batchnorm's variance) claimed its own."""
    values = example_values(r)
    g = Graph()
    rng = np.random.default_rng(0)
    tensors = {v: g.new_weight(values[v], name=v) if v in r.weight_vars() else g.new_input(values[v], name=v)
               for v in r.tensor_vars()}
    b = PatternBuilder(r, values, g, tensors)
    for i, p in enumerate(r.lhs):
        g.mark_output(b.tensor(p), f"out{i}")
    for v in r.weight_vars():
        if tensors[v].node not in g.weight_data:
            g.weight_data[tensors[v].node] = rng.standard_normal(values[v]).astype(np.float32)
    return g


@pytest.mark.parametrize("name", sorted(HAND))
def test_every_hand_rule_rewrites_its_example_to_an_equivalent_graph(name):
    r = HAND[name]
    g = _lhs_graph(r)
    index = GraphIndex(g)
    found = matches(g, r)
    assert found, f"{name} does not match its own example"
    for m in found:
        new = apply_match(index, m).graph
        new.validate()
        assert new.structural_hash() != g.structural_hash()
        assert [n for n, _ in new.outputs] == [n for n, _ in g.outputs]
        check_graphs_equivalent(g, new, what=name)
    g.validate()  # the original is left as it was


def test_rewrite_drops_dead_nodes_but_keeps_inputs():
    g = Graph()
    a, b = g.new_input((2, 3), name="a"), g.new_input((2, 5), name="b")
    first, _ = g.split(g.concat(1, [a, g.relu(b)]), 1, [3, 5])
    g.mark_output(g.tanh(first), "y")
    (m,) = matches(g, HAND["split-concat-first"])
    rw = apply_match(GraphIndex(g), m)
    assert rw.graph.op_counts() == {"tanh": 1}
    assert {n.params["name"] for n in rw.graph.inputs()} == {"a", "b"}
    assert sorted(n.op for n in rw.removed) == ["concat", "relu", "split"]
    check_graphs_equivalent(g, rw.graph)


def test_rhs_that_does_not_type_check_is_rejected():
    r = rule("(rule bad :lhs (ewadd ?a ?b) :rhs (transpose [1 0] ?a))")
    g = Graph()
    g.mark_output(g.add(g.new_input((2, 3), name="a"), g.new_input((2, 3), name="b")))
    (m,) = matches(g, r)
    with pytest.raises(Rejected) as err:
        apply_match(GraphIndex(g), m)
    assert err.value.reason == "shape"


def test_multi_rule_that_would_feed_its_own_output_is_rejected():
    # Without `before`, the merge can pair x.w1 with x.(x.w1): a cycle.
    r = rule("""(multi merge-no-order
      :lhs ((matmul NONE ?x ?w1) (matmul NONE ?x ?w2))
      :rhs ((proj 0 (split 1 (vec (dim ?w1 1) (dim ?w2 1)) (matmul NONE ?x (concat 1 ?w1 ?w2))))
            (proj 1 (split 1 (vec (dim ?w1 1) (dim ?w2 1)) (matmul NONE ?x (concat 1 ?w1 ?w2)))))
      :if ((weight ?w1) (weight ?w2) (= (dim ?w1 0) (dim ?w2 0))))""")
    g = Graph()
    x, w1 = g.new_weight((4, 4), name="x"), g.new_weight((4, 4), name="w1")
    inner = g.matmul(x, w1)
    g.mark_output(g.matmul(x, inner), "y")
    index = GraphIndex(g)
    reasons = []
    for m in matches(g, r):
        try:
            apply_match(index, m)
            reasons.append("ok")
        except Rejected as e:
            reasons.append(e.reason)
    assert reasons == ["cycle", "cycle"]


@pytest.mark.parametrize("build", [zoo.bert_small, zoo.nasrnn_small])
def test_incremental_cost_and_hash_equal_full_recomputation(build):
    search = _Search(COST, compile_rules(load_corpus()))
    state = _State(build(), search)
    count = 0
    for m in find_matches(state.index, search.matchers):
        rw = apply_match(state.index, m)
        assert search.candidate_hash(state, rw) == rw.graph.structural_hash()
        assert search.candidate_cost(state, rw) == pytest.approx(graph_cost(rw.graph, search.model),
                                                                 rel=1e-12)
        count += 1
    assert count > 5


# --- search ------------------------------------------------------------------------


@pytest.mark.parametrize("build,budget", [(zoo.bert_small, 20), (zoo.nasrnn_small, 15)])
def test_search_lowers_cost_and_keeps_the_function(build, budget):
    g = build()
    result = backtracking_search(g, budget=budget, cost_model=COST)
    assert result.cost_before == pytest.approx(graph_cost(g, COST))
    assert result.cost_after == pytest.approx(graph_cost(result.graph, COST))
    assert result.cost_after < result.cost_before
    assert result.check_error is not None and result.check_error < 1e-4
    check_graphs_equivalent(g, result.graph, seed=1)
    result.graph.validate()
    assert result.graphs_explored == budget == len(result.steps)
    assert result.graphs_generated == result.graphs_queued + sum(result.rejected.values())
    assert [s.best_cost for s in result.steps] == sorted((s.best_cost for s in result.steps), reverse=True)


def test_alpha_one_is_greedy_and_relaxation_keeps_more():
    g = zoo.nasrnn_small(steps=1)
    greedy = backtracking_search(g, budget=5, alpha=1.0, verify=False, cost_model=COST)
    relaxed = backtracking_search(g, budget=5, alpha=1.05, verify=False, cost_model=COST)
    # commuted operands cost the same: kept by the relaxed search only
    assert greedy.rejected["cost"] > relaxed.rejected["cost"]
    assert relaxed.graphs_queued > greedy.graphs_queued
    for s in greedy.steps[1:]:
        assert s.cost < greedy.steps[0].cost  # every queued graph beat the best at its time


def test_budget_and_empty_queue_stop_the_search():
    g = Graph()
    g.mark_output(g.relu(g.matmul(g.new_input((2, 3), name="x"), g.new_weight((3, 4), name="w"))))
    result = backtracking_search(g, budget=50, cost_model=COST)
    assert result.stop_reason == "queue empty"
    assert result.graphs_explored == 2  # the input, then the fused matmul
    assert result.graph.op_counts() == {"matmul": 1}
    one = backtracking_search(zoo.bert_small(), budget=3, cost_model=COST)
    assert one.stop_reason == "budget (3)" and one.graphs_explored == 3


def test_search_is_deterministic():
    a = backtracking_search(zoo.nasrnn_small(steps=1), budget=8, verify=False, cost_model=COST)
    b = backtracking_search(zoo.nasrnn_small(steps=1), budget=8, verify=False, cost_model=COST)
    assert a.graph.structural_hash() == b.graph.structural_hash()
    assert [(s.cost, s.queue_size, s.generated, s.rejected) for s in a.steps] == \
        [(s.cost, s.queue_size, s.generated, s.rejected) for s in b.steps]


def test_time_limit_stops_the_search():
    result = backtracking_search(zoo.nasrnn_small(), budget=10_000, time_limit=0.3, verify=False,
                                 cost_model=COST)
    assert result.stop_reason.startswith("time limit")
    assert result.graphs_explored < 10_000


@pytest.mark.parametrize("kwargs", [{"budget": 0}, {"alpha": 0.9}, {"time_limit": -1}])
def test_bad_limits_are_refused(kwargs):
    with pytest.raises(LimitError):
        backtracking_search(zoo.bert_small(), cost_model=COST, **kwargs)


# --- CLI ---------------------------------------------------------------------------


def test_cli_search_writes_a_checked_model(tmp_path, capsys):
    from taso_egg.onnx_io.importer import load_onnx

    out = tmp_path / "bert.onnx"
    assert main(["search", "bert-small", "-o", str(out), "--budget", "5", "--profile", "analytic"]) == 0
    text = capsys.readouterr().out
    assert "graphs explored" in text and "check: outputs equal" in text
    check_graphs_equivalent(zoo.bert_small(), load_onnx(str(out)))


def test_cli_search_rejects_an_unknown_model(tmp_path, capsys):
    assert main(["search", "no-such-model", "-o", str(tmp_path / "x.onnx")]) == 1
    assert "neither an ONNX file nor a zoo model" in capsys.readouterr().err


def test_cli_search_writes_the_input_when_the_result_measures_slower(tmp_path, capsys, monkeypatch):
    """The guard optimize applies: a result measured slower in onnxruntime is not written."""
    import onnx

    from taso_egg.product import timing
    from taso_egg.onnx_io.exporter import export_onnx

    monkeypatch.setattr(timing, "ort_rounds", lambda models, feeds, threads=1:
                        lambda names=None: {"original": 1.0, "optimized": 2.0})
    out = tmp_path / "bert.onnx"
    assert main(["search", "bert-small", "-o", str(out), "--budget", "5", "--profile", "analytic"]) == 0
    text = capsys.readouterr().out
    assert "check: outputs equal" in text  # the search did find a cheaper graph
    assert "writing the input graph instead: the result measured slower" in text
    assert onnx.load(out).graph == export_onnx(zoo.bert_small()).graph
