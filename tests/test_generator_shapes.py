"""The generator's shape guards (generator/shape_guards.py): what typing asks of the
inputs, split sizes as the operands' dims, and the menu's new kinds (seconds each)."""

from __future__ import annotations

import re

import pytest

from taso_egg.generator.enumerate import LeafSpec, Menu, choice, enumerate_terms
from taso_egg.generator.pipeline import _first_orientations
from taso_egg.generator.emit import rules_from
from taso_egg.generator.prune import prune
from taso_egg.rules.instantiate import builds_on, check_rule_numerically, check_rule_on_other_shapes


def _rules(leaves, ops, size):
    e = enumerate_terms(Menu("t", tuple(leaves), tuple(ops)), size)
    return rules_from(e, prune(e), "t")


def _x(n):
    return [LeafSpec(f"x{i}", (2, 4), "activation", "x") for i in range(n)]


def _find(rules, lhs, rhs=None):
    found = [r for r in rules if " | ".join(map(str, r.lhs)) == lhs and (rhs is None or " | ".join(map(str, r.rhs)) == rhs)]
    assert found, f"no rule {lhs} => {rhs}"
    return found[0]


@pytest.fixture(scope="module")
def concat3():
    return _rules(_x(3), [choice("ewadd"), choice("ewmul"), choice("concat", axis=1)], 3)


def test_three_inputs_of_a_kind_and_only_the_equal_dims_typing_needs(concat3):
    assoc = _find(concat3, "(ewmul ?x0 (ewmul ?x1 ?x2))")
    assert "(= (shape ?x0) (shape ?x1))" in map(str, assoc.guards)
    # concat distributes over ewadd with three inputs: ?x1 and ?x2 keep their own widths
    rule = _find(concat3, "(concat 1 (ewadd ?x0 ?x1) (ewadd ?x0 ?x2))")
    guards = set(map(str, rule.guards))
    assert "(= (shape ?x0) (shape ?x1))" in guards and "(= (shape ?x0) (shape ?x2))" in guards
    chain = _find(concat3, "(concat 1 ?x0 (concat 1 ?x1 ?x2))")
    assert {"(= (dim ?x0 0) (dim ?x1 0))", "(= (dim ?x0 0) (dim ?x2 0))"} <= set(map(str, chain.guards))
    assert not any("shape" in str(g) for g in chain.guards)
    # the example gives the free widths distinct sizes, so the float checks vary them apart
    widths = {chain.example[v][1] for v in ("x0", "x1", "x2")}
    assert len(widths) == 3
    assert check_rule_on_other_shapes(chain), "no other shape checked"
    for r in (assoc, rule, chain):
        check_rule_numerically(r)


def test_split_sizes_are_the_dims_of_what_was_concatenated():
    rules = _rules(_x(1) + [LeafSpec("w0", (4, 4), "weight", "w"), LeafSpec("w1", (4, 4), "weight", "w")],
                   [choice("matmul", activation="NONE"), choice("concat", axis=1),
                    choice("split", ("concat",), axis=1)], 3)
    merge = _find(rules, "(matmul NONE ?x0 ?w0) | (matmul NONE ?x0 ?w1)")
    assert "(split 1 (vec (dim ?w0 1) (dim ?w1 1))" in str(merge.rhs[0])
    assert "(= (dim ?x0 1) (dim ?w0 0))" in map(str, merge.guards)
    assert merge.example["w0"][1] != merge.example["w1"][1]
    check_rule_numerically(merge)
    # on a left side the sizes are a variable that a guard ties to the dims
    part = _find(rules, "(proj 1 (split 1 ?sz0 (matmul NONE ?x0 (concat 1 ?w0 ?w1))))")
    assert str(part.rhs[0]) == "(matmul NONE ?x0 ?w1)"
    assert "(= ?sz0 (vec (dim ?w0 1) (dim ?w1 1)))" in map(str, part.guards)
    assert builds_on(part) and not builds_on(part, {"sz0": (2, 2 + sum(part.example["sz0"]) - 2)})
    check_rule_numerically(part)
    assert not any(re.search(r"split \d \[", r.to_text()) for r in rules)  # no literal sizes


def test_a_split_off_a_concat_boundary_gives_no_rule():
    e = enumerate_terms(Menu("t", tuple(_x(1)), (choice("concat", axis=0), choice("concat", axis=1),
                                                  choice("split", ("concat",), axis=1))), 3)
    p = prune(e)
    rules = rules_from(e, p, "t")
    assert p.dropped["split off a boundary"] > 0  # split 1 [2 2] of concat 0 ?x0 ?x0: a cut no operand makes
    assert not any(re.search(r"split \d \[", r.to_text()) for r in rules)


def test_broadcast_biases_and_division():
    leaves = _x(2) + [LeafSpec("b0", (1, 4), "bias", "b")]
    rules = _rules(leaves, [choice("ewadd"), choice("ewdiv")], 3)
    rule = _find(rules, "(ewadd (ewdiv ?x0 ?b0) (ewdiv ?x1 ?b0))")
    guards = set(map(str, rule.guards))
    assert {"(= (dim ?b0 0) 1)", "(= (dim ?x0 1) (dim ?b0 1))"} <= guards
    check_rule_numerically(rule)


def test_a_bias_is_never_a_kernel():
    leaves = [LeafSpec("X0", (2, 4, 5, 5), "activation", "X"), LeafSpec("K0", (4, 4, 3, 3), "weight", "K"),
              LeafSpec("C0", (1, 4, 1, 1), "bias", "C")]
    e = enumerate_terms(Menu("t", tuple(leaves), (choice("conv2d", ("data", "weight"), strides=(1, 1),
                                                         padding="SAME", activation="NONE"), choice("ewmul"))), 2)
    convs = [t for t in e.terms if t.op == "conv2d"]
    assert convs and not any("C0" in e.terms[t.children[1]].leaves for t in convs)
    assert any(t.op == "ewmul" and "C0" in t.leaves and t.nodes & {c.id for c in convs} for t in e.terms)


def test_reverse_orientations_are_found_as_one_equation(concat3):
    first = _first_orientations(concat3)
    twins = [i for i, j in enumerate(first) if i != j]
    assert twins
    for i in twins:
        a, b = concat3[first[i]], concat3[i]
        assert (a.lhs, a.rhs) == (b.rhs, b.lhs)


def test_broadcasting_operators_take_operands_of_one_rank():
    leaves = _x(1) + [LeafSpec("C0", (1, 4, 1, 1), "bias", "C")]
    e = enumerate_terms(Menu("t", tuple(leaves), (choice("ewadd"), choice("ewmul"))), 2)
    assert all(len({len(e.terms[c].shape) for c in t.children}) == 1 for t in e.terms if t.children)


def test_merges_of_activations_alone_are_dropped():
    e = enumerate_terms(Menu("t", tuple(_x(2)), (choice("relu"), choice("concat", axis=0),
                                                 choice("split", ("concat",), axis=0))), 3)
    p = prune(e)
    assert p.dropped["merges no weight"] > 0
    assert not any(r.multi for r in rules_from(e, p, "t"))


def test_a_constants_shape_is_a_parameter_tied_to_what_it_meets():
    from taso_egg.egraph.saturate import saturate
    from taso_egg.generator.emit import generalize_or_pin
    from taso_egg.graph import Graph
    from taso_egg.rules.prove.prover import prove_rule

    leaves = _x(1) + [LeafSpec("one", (2, 4), "const_one", "one"), LeafSpec("imm", (4, 4), "const_imm", "imm")]
    rules = _rules(leaves, [choice("ewmul"), choice("matmul", activation="NONE")], 1)
    one = generalize_or_pin(_find(rules, "(ewmul ?x0 (const_one ?sh0 float32))", "?x0"))
    assert "(= (shape ?x0) ?sh0)" in one.to_text()
    imm = generalize_or_pin(_find(rules, "(matmul NONE ?x0 (const_imm ?sh0 float32))", "?x0"))
    assert "(= (dim ?x0 1) (at ?sh0 0))" in imm.to_text() and "[4 4]" not in str(imm.guards)
    assert prove_rule(one, 10.0).status == prove_rule(imm, 10.0).status == "proved"

    def fires(x_shape, one_shape):  # on shapes other than the menu's
        g = Graph()
        x = g.new_input(x_shape, name="x")
        g.mark_output(g.relu(g.mul(x, g.constant("one", one_shape))), "y")
        sat = saturate(g, rules=[one], count_classes=False)
        return sum(it.matches.get(one.name, 0) for it in sat.iterations)

    assert fires((3, 5), (3, 5)) >= 1
    assert fires((3, 5), (1, 5)) == 0  # a broadcast ones tensor: the guard ties the shapes


def test_a_rule_holds_only_where_its_sides_shapes_agree():
    rules = _rules(_x(2), [choice("concat", axis=0), choice("split", ("concat",), axis=0)], 3)
    half = _find(rules, "(proj 0 (split 0 ?sz0 (concat 0 (concat 0 ?x0 ?x1) (concat 0 ?x0 ?x1))))",
                 "(concat 0 ?x0 ?x1)")
    # the first half has 2 x 2 rows, x0 and x1 together 2 + 3: equal only for equal shapes
    assert "(= (shape ?x0) (shape ?x1))" in half.to_text()
    assert check_rule_numerically(half) <= 1e-6 and check_rule_on_other_shapes(half)
