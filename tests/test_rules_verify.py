"""The Z3 verifier: the axioms are sound (numerically, on their examples and on other
shapes), the hand rules are proved from them, and wrong rules are rejected by both
the prover and the float check."""

from __future__ import annotations

import pytest

from taso_egg.errors import RuleError, VerificationError
from taso_egg.rules.instantiate import check_rule_numerically, example_values, other_examples
from taso_egg.rules.corpus import load_rule_file
from taso_egg.rules.syntax import parse_rules
from taso_egg.rules.prove.driver import verify_rules
from taso_egg.rules.prove.prover import AXIOM_FILE, ProofResult, float_check, load_axioms, prove_rule

AXIOMS = load_axioms()
HAND = load_rule_file(AXIOM_FILE.with_name("taso_hand.rules"))
TIMEOUT = 10.0

# --- the axioms ---------------------------------------------------------------------


def test_axioms_load_and_cover_taso_list():
    names = [a.name for a in AXIOMS]
    assert len(names) >= 43 and len(set(names)) == len(names)
    assert all(n.startswith("ax-") for n in names)
    assert all(a.example for a in AXIOMS)


@pytest.mark.parametrize("axiom", AXIOMS, ids=[a.name for a in AXIOMS])
def test_axiom_holds_on_example_and_other_shapes(axiom):
    for seed in (0, 1):
        assert check_rule_numerically(axiom, seed=seed) <= 1e-5
    ok, why = float_check(axiom, trials=4)
    assert ok, why


# --- hand rules ---------------------------------------------------------------------


@pytest.mark.parametrize("rule", HAND, ids=[r.name for r in HAND])
def test_hand_rule_is_proved(rule):
    res = prove_rule(rule, TIMEOUT, AXIOMS)
    assert res.seconds < TIMEOUT
    assert res.status == "proved", res.reason
    assert res.axioms_used and set(res.axioms_used) <= {a.name for a in AXIOMS}
    assert res.reason == ""


# Two hand rules were once written without a guard they need; the prover caught both.
GUARDS_THE_PROVER_ASKED_FOR = {"merge-matmul-shared-input": "(= (rank ?x) 2)",
                               "merge-conv-enlarge": "(= ?s [1 1])"}


def _without_guard(name: str, guard: str):
    text = next(r for r in HAND if r.name == name).to_text()
    assert guard in text
    return parse_rules(text.replace(guard + " ", "", 1), "unguarded.rules")[0]


@pytest.mark.parametrize("name", sorted(GUARDS_THE_PROVER_ASKED_FOR))
def test_rule_without_its_guard_is_not_proved(name):
    res = prove_rule(_without_guard(name, GUARDS_THE_PROVER_ASKED_FOR[name]), TIMEOUT, AXIOMS)
    assert res.status == "unknown", res


def test_rules_without_their_guards_are_unsound():
    matmul = _without_guard("merge-matmul-shared-input", "(= (rank ?x) 2)")
    with pytest.raises(VerificationError, match="shape"):
        check_rule_numerically(matmul, bindings={"x": (2, 5, 4), "w1": (4, 3), "w2": (4, 2)})
    conv = _without_guard("merge-conv-enlarge", "(= ?s [1 1])")
    with pytest.raises(VerificationError, match="differs"):
        check_rule_numerically(conv, bindings={"x": (1, 4, 4, 4), "w1": (3, 4, 1, 1),
                                               "w2": (5, 4, 3, 3), "s": (2, 2)})
    enlarge = next(r for r in HAND if r.name == "merge-conv-enlarge")
    assert "ax-conv-enlarge" in prove_rule(enlarge, TIMEOUT, AXIOMS).axioms_used


def test_unsat_core_names_the_axioms_used():
    rule = next(r for r in HAND if r.name == "merge-conv-shared-input")
    res = prove_rule(rule, TIMEOUT, AXIOMS)
    assert set(res.axioms_used) == {"ax-concat-conv-shared-input", "ax-split-concat-0",
                                    "ax-split-concat-1"}


def test_proof_needs_its_axiom():
    rule = next(r for r in HAND if r.name == "conv-relu-fusion")
    assert prove_rule(rule, TIMEOUT, AXIOMS).axioms_used == ("ax-conv-relu",)
    without = [a for a in AXIOMS if a.name != "ax-conv-relu"]
    assert prove_rule(rule, TIMEOUT, without).status == "unknown"


def test_derived_rule_chains_axioms():
    (rule,) = parse_rules("""(rule factor-commuted
      :lhs (ewadd (ewmul ?c ?a) (ewmul ?b ?c))
      :rhs (ewmul ?c (ewadd ?a ?b))
      :example ((?a [2 3]) (?b [2 3]) (?c [2 3])))""")
    res = prove_rule(rule, TIMEOUT, AXIOMS)
    assert res.status == "proved"
    assert {"ax-ewmul-commutative", "ax-ewmul-distributes"} <= set(res.axioms_used)


# --- wrong rules: rejected by both the prover and the float check --------------------

WRONG = parse_rules("""
(rule split-of-nested-concat
  :doc "concat is associative, but splitting concat(concat(a, b), c) at b's width gives a, not b"
  :lhs (proj 0 (split 1 ?sizes (concat 1 (concat 1 ?a ?b) ?c)))
  :rhs ?b
  :if ((= (len ?sizes) 2) (= (at ?sizes 0) (dim ?b 1)))
  :example ((?a [2 3]) (?b [2 3]) (?c [2 2]) (?sizes [3 5])))

(rule split-of-nested-concat-wrong-sizes
  :lhs (proj 1 (split 1 ?sizes (concat 1 (concat 1 ?a ?b) ?c)))
  :rhs ?c
  :if ((= (len ?sizes) 2) (= (at ?sizes 0) (dim ?a 1)))
  :example ((?a [2 3]) (?b [2 1]) (?c [2 2]) (?sizes [3 3])))

(rule relu-over-ewadd
  :lhs (relu (ewadd ?a ?b))
  :rhs (ewadd (relu ?a) (relu ?b))
  :example ((?a [3 4]) (?b [3 4])))

(rule transpose-matmul-unswapped
  :lhs (transpose [1 0] (matmul NONE ?x ?y))
  :rhs (matmul NONE (transpose [1 0] ?x) (transpose [1 0] ?y))
  :example ((?x [3 3]) (?y [3 3])))

(rule relu-over-activated-conv
  :lhs (relu (conv2d ?s ?p SIGMOID ?x ?w))
  :rhs (conv2d ?s ?p RELU ?x ?w)
  :example ((?x [1 2 4 4]) (?w [3 2 3 3]) (?s [1 1]) (?p SAME)))

(rule enlarge-strided
  :lhs (conv2d [2 2] SAME NONE ?x (enlarge ?w ?r))
  :rhs (conv2d [2 2] SAME NONE ?x ?w)
  :example ((?x [1 2 4 4]) (?w [3 2 1 1]) (?r [3 2 3 3])))
""", "wrong.rules")


@pytest.mark.parametrize("rule", WRONG, ids=[r.name for r in WRONG])
def test_wrong_rule_is_refuted(rule):
    res = prove_rule(rule, TIMEOUT, AXIOMS)
    assert res.status == "refuted", res
    assert "float counterexample" in res.reason and rule.name in res.reason
    ok, why = float_check(rule)
    assert not ok and rule.name in why


def test_true_rule_outside_the_axioms_is_unknown_not_refuted():
    # its proof needs x = transpose(transpose(x)), a term E-matching cannot invent
    (rule,) = parse_rules("""(rule transpose-concat-1
      :lhs (transpose [1 0] (concat 1 ?x ?y))
      :rhs (concat 0 (transpose [1 0] ?x) (transpose [1 0] ?y))
      :example ((?x [2 3]) (?y [2 4])))""")
    res = prove_rule(rule, TIMEOUT, AXIOMS)
    assert res.status == "unknown" and "float check: agrees on the example" in res.reason


SLOW = """(rule slow
  :lhs (ewmul (ewadd ?a (ewadd ?b (ewadd ?c ?d)))
              (ewadd ?e (ewadd ?f (ewadd ?g (proj 0 (split 1 ?n (concat 1 ?h (concat 1 ?i ?j))))))))
  :rhs (ewmul (ewadd ?d (ewadd ?c (ewadd ?b ?a))) (ewadd ?g (ewadd ?f (ewadd ?e (concat 1 ?h ?i)))))
  :if ((= (len ?n) 2) (= (at ?n 0) (+ (dim ?h 1) (dim ?i 1))))
  :example ((?a [2 4]) (?b [2 4]) (?c [2 4]) (?d [2 4]) (?e [2 4]) (?f [2 4]) (?g [2 4])
            (?h [2 2]) (?i [2 2]) (?j [2 2]) (?n [4 2])))"""


def test_timeout_gives_unknown():
    (rule,) = parse_rules(SLOW)
    res = prove_rule(rule, 0.5, AXIOMS)
    assert res.status == "unknown" and "timeout" in res.reason
    assert res.seconds < 5


def test_unsupported_parameter_is_reported():
    (rule,) = parse_rules("""(rule explicit-pads
      :lhs (relu (conv2d [1 1] [1 1 1 1] NONE ?x ?w))
      :rhs (conv2d [1 1] [1 1 1 1] RELU ?x ?w)
      :example ((?x [1 2 4 4]) (?w [3 2 3 3])))""")
    res = prove_rule(rule, TIMEOUT, AXIOMS)
    assert res.status == "unsupported" and "(1, 1, 1, 1)" in res.reason


def test_bad_timeout_is_a_rule_error():
    with pytest.raises(RuleError, match="timeout"):
        prove_rule(HAND[0], 0)


def test_verify_rules_reports_progress():
    seen = []
    results = verify_rules(HAND[:3], TIMEOUT, progress=lambda i, n, r: seen.append((i, n, r.rule)))
    assert [r.status for r in results] == ["proved"] * 3
    assert all(isinstance(r, ProofResult) for r in results)
    assert seen == [(i, 3, r.name) for i, r in enumerate(HAND[:3])]


def test_parallel_verification_matches_serial():
    slow = parse_rules(SLOW)[0]  # first, and runs to its timeout: workers finish out of order
    rules = [slow] + HAND[:6] + WRONG[2:3]
    seen = []
    serial = verify_rules(rules, 1.0, jobs=1)
    parallel = verify_rules(rules, 1.0, jobs=2, progress=lambda i, n, r: seen.append((i, r.rule)))
    assert [(r.rule, r.status, r.axioms_used) for r in parallel] == \
        [(r.rule, r.status, r.axioms_used) for r in serial]
    assert [r.status for r in serial] == ["unknown"] + ["proved"] * 6 + ["refuted"]
    assert seen == [(i, r.name) for i, r in enumerate(rules)]
    with pytest.raises(RuleError, match="jobs"):
        verify_rules(rules, TIMEOUT, jobs=0)


def test_proved_rule_failing_the_float_check_is_refuted(monkeypatch):
    from taso_egg.rules.prove import prover

    # a prover that proves everything: the float check must still catch the wrong rule
    monkeypatch.setattr(prover, "prove_rule",
                        lambda rule, *args: ProofResult(rule.name, "proved", 0.0, (), ""))
    (res,) = verify_rules(WRONG[2:3], TIMEOUT)
    assert res.status == "refuted" and "float check fails" in res.reason


# --- float check on other shapes ----------------------------------------------------


def test_float_check_without_example():
    (rule,) = parse_rules("(rule n :lhs (relu ?x) :rhs ?x)", "n.rules")
    ok, why = float_check(rule)
    assert not ok and "no :example" in why


def test_other_examples_remap_dims_consistently():
    rule = next(a for a in AXIOMS if a.name == "ax-split-concat-0")
    base = example_values(rule)
    variants = [v for _, v in zip(range(20), other_examples(rule, seed=3))]
    assert len({tuple(sorted(v.items())) for v in variants}) == len(variants)
    for v in variants:
        assert v != {k: base[k] for k in v}
        assert v["x"][0] == v["y"][0]            # equal dims stay equal
        assert v["sizes"][0] == v["x"][1]        # split sizes follow the dims they cut
        assert all(1 <= d <= 4 for shape in v.values() for d in shape)
        assert "ax" not in v                     # axes are not dimensions
    assert variants == [v for _, v in zip(range(20), other_examples(rule, seed=3))]


def test_other_examples_keep_the_sizes_guards_pin():
    (one_dim, whole) = parse_rules("""
(rule one-dim :lhs (relu (relu ?x)) :rhs (relu ?x)
  :if ((= (dim ?x 1) 4)) :example ((?x [2 4 3])))
(rule whole :lhs (relu (relu ?x)) :rhs (relu ?x)
  :if ((= (shape ?x) (vec 2 4))) :example ((?x [2 4])))
""", "pins.rules")
    variants = list(other_examples(one_dim))
    assert len(variants) == 4 ** 2 - 1  # sizes 2 and 3 move freely, 4 stays
    assert all(v["x"][1] == 4 for v in variants)
    assert list(other_examples(whole)) == []  # every variant would break the guard


def test_each_rule_draws_its_own_variants():
    one, two = parse_rules("""
(rule one :lhs (relu (relu ?x)) :rhs (relu ?x) :example ((?x [2 3 5])))
(rule two :lhs (relu (relu (relu ?x))) :rhs (relu ?x) :example ((?x [2 3 5])))
""", "draws.rules")
    a, b = list(other_examples(one)), list(other_examples(two))
    assert sorted(map(str, a)) == sorted(map(str, b))  # the same variants...
    assert a[:5] != b[:5]                               # ...in another order


def test_shapes_compare_by_rank_and_every_dimension():
    one_by_shape = """(rule ones
      :lhs (ewmul ?x (const_one [2 3] float32))
      :rhs ?x
      :if ((= (shape ?x) SHAPE))
      :example ((?x EXAMPLE)))"""
    (same,) = parse_rules(one_by_shape.replace("SHAPE", "(vec 2 3)").replace("EXAMPLE", "[2 3]"))
    assert prove_rule(same, TIMEOUT, AXIOMS).status == "proved"
    # one more leading dimension: the ones broadcast, but the axiom's guard does not hold
    (longer,) = parse_rules(one_by_shape.replace("SHAPE", "(vec 1 2 3)").replace("EXAMPLE", "[1 2 3]"))
    assert prove_rule(longer, TIMEOUT, AXIOMS).status == "unknown"
    (other,) = parse_rules(one_by_shape.replace("SHAPE", "(vec 2 4)").replace("EXAMPLE", "[2 4]"))
    assert prove_rule(other, TIMEOUT, AXIOMS).status != "proved"


def test_a_proof_under_an_rlimit_does_not_depend_on_the_proofs_before_it(monkeypatch):
    # Z3's search follows the ids of the terms in its context; under an rlimit each
    # proof runs in a fresh context, so its resource count and unsat core are the rule's
    import z3

    from taso_egg.rules.prove.prover import prove_rule

    counts = []
    check = z3.Solver.check

    def counting(self, *args):
        answer = check(self, *args)
        counts.append(self.statistics().get_key_value("rlimit count"))
        return answer

    monkeypatch.setattr(z3.Solver, "check", counting)

    def outcomes(rules):
        out = {}
        for r in rules:
            res = prove_rule(r, axioms=AXIOMS, rlimit=5_000_000)
            out[r.name] = (res.status, res.axioms_used, counts[-1])
        return out

    rules = [r for r in HAND if not r.multi][:12]
    forward, backward = outcomes(rules), outcomes(rules[::-1])
    assert forward == backward and {s for s, _, _ in forward.values()} == {"proved"}
    stalls = prove_rule(rules[0], axioms=AXIOMS, rlimit=1)
    assert stalls.status == "unknown" and "resource limit (1)" in stalls.reason


def test_hypotheses_that_contradict_each_other_prove_nothing():
    # a batched matmul broadcasting its batch dims is in no shape case: typing its left
    # side contradicts the guards, which would "prove" any right side
    from taso_egg.rules.prove.prover import prove_rule

    (rule,) = parse_rules("""
(rule broadcast-batch
  :lhs (ewadd (matmul NONE ?c (concat 0 ?c ?c)) ?x)
  :rhs (ewadd (matmul NONE ?c ?c) ?x)
  :if ((= (shape ?c) (vec 1 4 1 1)) (= (shape ?x) (vec 2 4 5 5)))
  :example ((?x [2 4 5 5]) (?c [1 4 1 1])))
""")
    for res in (prove_rule(rule, TIMEOUT, AXIOMS), prove_rule(rule, axioms=AXIOMS, rlimit=5_000_000)):
        assert res.status == "unknown" and "contradict each other" in res.reason


def test_a_proof_under_an_rlimit_stops_where_z3s_count_stalls(monkeypatch):
    # At rlimit 10 million this proof ran 25 min (1.5 s at 1 million): Z3's resource
    # count stalls, so the wall-clock bound is what ends it.
    from taso_egg.rules.prove import prover

    monkeypatch.setattr(prover, "RLIMIT_SAFETY_S", 0.5)
    stalls, = parse_rules("""
    (rule divides-by-a-product
      :lhs (ewmul ?x0 (ewdiv (ewdiv (const_one ?sh0 float32) ?x1) ?x2))
      :rhs (ewdiv ?x0 (ewmul ?x1 ?x2))
      :if ((= (rank ?x0) 2) (= (shape ?x0) (shape ?x1)) (= (shape ?x0) (shape ?x2)) (= (shape ?x0) ?sh0))
      :example ((?x0 [2 4]) (?sh0 [2 4]) (?x1 [2 4]) (?x2 [2 4])))""")
    res = prover.prove_rule(stalls, float_checked=True, rlimit=10_000_000)
    assert res.status == "unknown" and "0.5 s that bound a proof" in res.reason and res.seconds < 30
