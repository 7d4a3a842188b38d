"""Numeric soundness of rules: every shipped corpus rule's two sides (the study file's
included) agree on random data of its :example shapes, and planted wrong rules are
caught (so the check can fail)."""

from __future__ import annotations

import numpy as np
import pytest

from taso_egg.errors import RuleError, VerificationError
from taso_egg.rules.instantiate import check_rule_numerically, instantiate
from taso_egg.rules.corpus import load_corpus
from taso_egg.rules.syntax import parse_rules

try:
    CORPUS = load_corpus(study=True)  # the study file's rules too: every shipped rule
    CORPUS_ERROR = None
except RuleError as e:  # reported by test_corpus_loads, not as a collection error
    CORPUS, CORPUS_ERROR = [], e


def test_corpus_loads_and_is_not_empty():
    if CORPUS_ERROR is not None:
        raise CORPUS_ERROR
    assert CORPUS, "load_corpus() found no rules in rules/*.rules"


@pytest.mark.parametrize("rule", CORPUS, ids=[r.name for r in CORPUS])
def test_corpus_rule_holds_numerically(rule):
    assert rule.example, f"{rule.where}: no :example, so no numeric check"
    for seed in (0, 1):
        err = check_rule_numerically(rule, seed=seed)
        assert err <= 1e-5


# --- a small corpus of sound rules, independent of rules/*.rules --------------------

SOUND = """
(rule conv-relu-fusion
  :lhs (relu (conv2d ?s ?p NONE ?x ?w))
  :rhs (conv2d ?s ?p RELU ?x ?w)
  :example ((?x [1 4 5 5]) (?w [6 4 3 3]) (?s [1 1]) (?p SAME)))

(rule matmul-assoc
  :lhs (matmul NONE (matmul NONE ?a ?b) ?c)
  :rhs (matmul NONE ?a (matmul NONE ?b ?c))
  :example ((?a [2 3]) (?b [3 4]) (?c [4 5])))

(rule split-concat-0
  :lhs (proj 0 (split ?ax ?sizes (concat ?ax ?a ?b)))
  :rhs ?a
  :if ((= (len ?sizes) 2) (= (at ?sizes 0) (dim ?a ?ax)))
  :example ((?ax 1) (?a [2 3]) (?b [2 5]) (?sizes [3 5])))

(rule split-concat-1
  :lhs (proj 1 (split ?ax ?sizes (concat ?ax ?a ?b)))
  :rhs ?b
  :if ((= (len ?sizes) 2) (= (at ?sizes 0) (dim ?a ?ax)))
  :example ((?ax 0) (?a [2 3]) (?b [4 3]) (?sizes [2 4])))

(multi merge-matmul-shared-input
  :lhs ((matmul ?act ?x ?w1) (matmul ?act ?x ?w2))
  :rhs ((proj 0 (split 1 (vec (dim ?w1 1) (dim ?w2 1)) (matmul ?act ?x (concat 1 ?w1 ?w2))))
        (proj 1 (split 1 (vec (dim ?w1 1) (dim ?w2 1)) (matmul ?act ?x (concat 1 ?w1 ?w2)))))
  :if ((weight ?w1) (weight ?w2) (before ?w1 ?w2) (= (rank ?w1) 2) (= (dim ?w1 0) (dim ?w2 0)))
  :example ((?x [2 4]) (?w1 [4 3]) (?w2 [4 5]) (?act RELU)))

(rule ewmul-one
  :lhs (ewmul ?x (const_one ?s))
  :rhs ?x
  :if ((= ?s (shape ?x)))
  :example ((?x [2 3]) (?s [2 3])))

(rule matmul-identity
  :lhs (matmul NONE ?x (const_imm [3 3]))
  :rhs ?x
  :example ((?x [2 3])))

(rule conv-identity
  :lhs (conv2d [1 1] SAME NONE ?x (const_iconv [4 4 3 3]))
  :rhs ?x
  :example ((?x [1 4 5 5])))

(rule avgpool-as-conv
  :lhs (avgpool2d ?k [1 1] SAME NONE ?x)
  :rhs (conv2d [1 1] SAME NONE ?x (const_pool (vec (dim ?x 1) 1 (at ?k 0) (at ?k 1))))
  :if ((= (at ?k 0) 3) (= (at ?k 1) 3))
  :example ((?x [1 3 5 5]) (?k [3 3])))

(rule transpose-twice
  :lhs (transpose ?p (transpose ?p ?x))
  :rhs ?x
  :if ((= ?p [1 0]))
  :example ((?x [3 4]) (?p [1 0])))

(rule reshape-via-flat
  :lhs (reshape ?s ?x)
  :rhs (reshape ?s (reshape (vec (* (dim ?x 0) (+ (- (dim ?x 1) 1) 1))) ?x))
  :if ((= (rank ?x) 2) (= (len ?s) 3))
  :example ((?x [2 6]) (?s [3 2 2])))

(rule smul-distributes
  :lhs (smul (ewadd ?a ?b) ?s)
  :rhs (ewadd (smul ?a ?s) (smul ?b ?s))
  :example ((?a [2 3]) (?b [2 3]) (?s [])))

(rule conv-concat-weights
  :lhs (conv2d ?st ?pd ?act ?x (concat 0 ?w1 ?w2))
  :rhs (concat 1 (conv2d ?st ?pd ?act ?x ?w1) (conv2d ?st ?pd ?act ?x ?w2))
  :if ((weight ?w1) (weight ?w2))
  :example ((?x [1 2 4 4]) (?w1 [3 2 3 3]) (?w2 [5 2 3 3]) (?st [1 1]) (?pd SAME) (?act TANH)))
"""

# wrong by design: each must be rejected with VerificationError
WRONG = """
(rule relu-over-ewadd
  :lhs (relu (ewadd ?a ?b))
  :rhs (ewadd (relu ?a) (relu ?b))
  :example ((?a [3 4]) (?b [3 4])))

(rule split-concat-wrong-index
  :lhs (proj 1 (split ?ax ?sizes (concat ?ax ?a ?b)))
  :rhs ?a
  :example ((?ax 1) (?a [2 3]) (?b [2 3]) (?sizes [3 3])))

(rule matmul-commutes
  :lhs (matmul NONE ?a ?b)
  :rhs (matmul NONE ?b ?a)
  :example ((?a [3 3]) (?b [3 3])))

(rule split-concat-wrong-shape
  :lhs (proj 1 (split ?ax ?sizes (concat ?ax ?a ?b)))
  :rhs ?a
  :example ((?ax 1) (?a [2 3]) (?b [2 5]) (?sizes [3 5])))

(multi merge-swapped-outputs
  :lhs ((matmul NONE ?x ?w1) (matmul NONE ?x ?w2))
  :rhs ((proj 1 (split 1 (vec (dim ?w1 1) (dim ?w2 1)) (matmul NONE ?x (concat 1 ?w1 ?w2))))
        (proj 0 (split 1 (vec (dim ?w1 1) (dim ?w2 1)) (matmul NONE ?x (concat 1 ?w1 ?w2)))))
  :if ((weight ?w1) (weight ?w2))
  :example ((?x [2 4]) (?w1 [4 3]) (?w2 [4 3])))

(rule sigmoid-as-tanh
  :lhs (conv2d [1 1] SAME SIGMOID ?x ?w)
  :rhs (conv2d [1 1] SAME TANH ?x ?w)
  :example ((?x [1 2 3 3]) (?w [2 2 1 1])))
"""

SOUND_RULES = parse_rules(SOUND, "sound.rules")
WRONG_RULES = parse_rules(WRONG, "wrong.rules")


@pytest.mark.parametrize("rule", SOUND_RULES, ids=[r.name for r in SOUND_RULES])
def test_sound_rules_pass(rule):
    assert check_rule_numerically(rule) <= 1e-5


@pytest.mark.parametrize("rule", WRONG_RULES, ids=[r.name for r in WRONG_RULES])
def test_wrong_rules_are_rejected(rule):
    with pytest.raises(VerificationError) as info:
        check_rule_numerically(rule)
    assert "wrong.rules" in str(info.value) and rule.name in str(info.value)


# --- instantiate -------------------------------------------------------------------


def by_name(name):
    return next(r for r in SOUND_RULES if r.name == name)


def test_instantiate_builds_one_graph_with_both_sides():
    g, lhs, rhs = instantiate(by_name("merge-matmul-shared-input"))
    assert [n.params["name"] for n in g.inputs()] == ["x"]
    assert sorted(n.params["name"] for n in g.weights()) == ["w1", "w2"]
    assert [name for name, _ in g.outputs] == ["lhs0", "rhs0", "lhs1", "rhs1"]
    assert [t.shape for t in lhs] == [(2, 3), (2, 5)] == [t.shape for t in rhs]
    # the two rhs projections share one split (structurally equal subterms are built once)
    assert g.op_counts()["split"] == 1 and g.op_counts()["concat"] == 1
    g.validate()


def test_instantiate_weights_are_seeded():
    rule = by_name("merge-matmul-shared-input")
    g1, _, _ = instantiate(rule, seed=3)
    g2, _, _ = instantiate(rule, seed=3)
    g3, _, _ = instantiate(rule, seed=4)
    w = lambda g: np.concatenate([g.weight_array(n).ravel() for n in g.weights()])
    assert np.array_equal(w(g1), w(g2)) and not np.array_equal(w(g1), w(g3))


def test_instantiate_with_bindings():
    rule = by_name("matmul-assoc")
    g, lhs, rhs = instantiate(rule, {"?a": [5, 2], "b": (2, 7), "c": [7, 1]})
    assert lhs[0].shape == rhs[0].shape == (5, 1)
    assert check_rule_numerically(rule, bindings={"a": [4, 3]}) <= 1e-5
    with pytest.raises(RuleError, match="unknown variable"):
        instantiate(rule, {"zz": [1]})


def test_param_expressions_are_evaluated_from_shapes():
    g, lhs, _ = instantiate(by_name("reshape-via-flat"))
    reshapes = [n for n in g.nodes.values() if n.op == "reshape"]
    assert sorted(n.params["shape"] for n in reshapes) == [(3, 2, 2), (3, 2, 2), (12,)]


def test_failed_guard_is_a_rule_error():
    (rule,) = parse_rules("""(rule g
      :lhs (proj 0 (split ?ax ?sizes (concat ?ax ?a ?b)))
      :rhs ?a
      :if ((= (len ?sizes) 2) (= (at ?sizes 0) (dim ?a ?ax)))
      :example ((?ax 1) (?a [2 3]) (?b [2 5]) (?sizes [4 4])))""", "g.rules")
    with pytest.raises(RuleError, match=r"g\.rules:1: rule 'g': the example violates guard "
                                        r"\(= \(at \?sizes 0\) \(dim \?a \?ax\)\)"):
        check_rule_numerically(rule)


def test_missing_example_is_a_rule_error():
    (rule,) = parse_rules("(rule n :lhs (relu ?x) :rhs ?x)", "n.rules")
    with pytest.raises(RuleError, match="n.rules:1: rule 'n': has no :example"):
        instantiate(rule)
    g, lhs, rhs = instantiate(rule, {"x": [2]})
    assert rhs[0].shape == (2,)


def test_ill_typed_example_is_a_rule_error():
    (rule,) = parse_rules("""(rule t
      :lhs (matmul NONE ?a ?b) :rhs (matmul NONE ?a ?b)
      :example ((?a [2 3]) (?b [4 5])))""", "t.rules")
    with pytest.raises(RuleError, match=r"t\.rules:1: rule 't': \(matmul NONE \?a \?b\) does not "
                                        r"type-check on the example: .*inner dimensions differ"):
        instantiate(rule)
