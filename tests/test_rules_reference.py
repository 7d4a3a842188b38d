"""The reference corpus (TASO's kinds of rules, rules/taso-reference.rules): it parses,
every rule is proved or says why not; the axioms it needed; both orientations of
proved rules; and `taso-egg rules derive` on a small file."""

from __future__ import annotations

import pytest

from taso_egg.cli import main
from taso_egg.errors import RuleError
from taso_egg.generator.derive import derive_table
from taso_egg.rules.corpus import STUDY_FILES, load_corpus, load_rule_file, reverse, with_orientations
from taso_egg.rules.syntax import parse_rules
from taso_egg.rules.prove.prover import AXIOM_FILE, load_axioms, prove_rule

REFERENCE = AXIOM_FILE.with_name("taso-reference.rules")
RULES = load_rule_file(REFERENCE)


def test_reference_corpus_has_taso_breadth_and_is_a_study_file():
    single = [r for r in RULES if not r.multi]
    assert len(single) >= 120 and len(RULES) - len(single) >= 13
    assert REFERENCE.name in STUDY_FILES
    assert not {r.name for r in RULES} & {r.name for r in load_corpus()}
    assert {r.name for r in load_corpus(["taso-reference"])} == {r.name for r in RULES if r.proved}


def test_every_reference_rule_is_proved_or_says_why_not():
    text = REFERENCE.read_text(encoding="utf-8")
    for rule in RULES:
        assert rule.proof is not None, rule.name
        if rule.proved:
            continue
        assert rule.proof.reason, rule.name
        comment = text[:text.index(f"(rule {rule.name}\n")].rstrip().rsplit("\n", 1)[-1]
        assert comment.startswith(";"), f"{rule.name}: no comment above it saying why it is not proved"


AXIOMS = load_axioms()
NEEDS = {"taso-matmul-concat-left": "ax-matmul-concat-left",
         "taso-concat1-grouped-convs-two-inputs": "ax-concat-conv-grouped",
         "taso-merge-conv-two-inputs-grouped": "ax-concat-conv-grouped",
         "taso-gconv-merge-groups": "ax-conv-merge-gconv"}


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_rules_of_the_new_axioms_are_proved_from_them_and_only_so(name):
    rule = next(r for r in RULES if r.name == name)
    res = prove_rule(rule, 10.0, AXIOMS)
    assert res.status == "proved" and NEEDS[name] in res.axioms_used, res
    without = [a for a in AXIOMS if a.name != NEEDS[name]]
    assert prove_rule(rule, 10.0, without).status != "proved"


def test_left_side_typing_is_a_hypothesis_but_not_the_right_sides():
    # concat_0(a, c) typing says a and c have one width: the only guard this rule needs
    swap = """(rule swap
      :lhs (concat 1 (concat 0 ?a ?c) (concat 0 ?b ?d))
      :rhs (concat 0 (concat 1 ?a ?b) (concat 1 ?c ?d))
      :if ((= (dim ?a 0) (dim ?b 0)))
      :example ((?a [2 3]) (?b [2 4]) (?c [1 3]) (?d [1 4])))"""
    assert prove_rule(parse_rules(swap)[0], 10.0, AXIOMS).status == "proved"
    # read the other way, the widths are what its right side's typing would need
    back = swap.replace("(concat 1 (concat 0 ?a ?c) (concat 0 ?b ?d))", "LHS") \
        .replace("(concat 0 (concat 1 ?a ?b) (concat 1 ?c ?d))", "(concat 1 (concat 0 ?a ?c) (concat 0 ?b ?d))") \
        .replace("LHS", "(concat 0 (concat 1 ?a ?b) (concat 1 ?c ?d))")
    assert prove_rule(parse_rules(back)[0], 10.0, AXIOMS).status != "proved"


# --- orientations -----------------------------------------------------------------------

ORIENT = """
(rule fuse :lhs (relu (conv2d ?s ?p NONE ?x ?w)) :rhs (conv2d ?s ?p RELU ?x ?w)
  :example ((?x [1 2 4 4]) (?w [3 2 3 3]) (?s [1 1]) (?p SAME)) :proof ((status proved)))
(rule comm :lhs (ewadd ?a ?b) :rhs (ewadd ?b ?a) :example ((?a [2]) (?b [2])) :proof ((status proved)))
(rule drop :lhs (transpose [1 0] (transpose [1 0] ?x)) :rhs ?x :example ((?x [2 3])) :proof ((status proved)))
(rule loses :lhs (conv2d [1 1] SAME NONE ?x (enlarge ?w ?r)) :rhs (conv2d [1 1] SAME NONE ?x ?w)
  :example ((?x [1 2 4 4]) (?w [3 2 1 1]) (?r [3 2 3 3])) :proof ((status proved)))
(rule computes :lhs (matmul NONE ?x ?y) :rhs (matmul NONE ?x (reshape (shape ?y) ?y))
  :example ((?x [2 3]) (?y [3 4])) :proof ((status proved)))
(rule fuse-again :lhs (relu (conv2d ?t ?q NONE ?a ?b)) :rhs (conv2d ?t ?q RELU ?a ?b)
  :example ((?a [1 2 4 4]) (?b [3 2 3 3]) (?t [1 1]) (?q SAME)) :proof ((status proved)))
(rule unfuse :lhs (conv2d ?s ?p RELU ?x ?w) :rhs (relu (conv2d ?s ?p NONE ?x ?w))
  :example ((?x [1 2 4 4]) (?w [3 2 3 3]) (?s [1 1]) (?p SAME)) :proof ((status proved)))
"""


def test_reverse_reads_a_rule_right_to_left_where_its_right_side_binds_everything():
    fuse, comm, drop, loses, computes, *_ = parse_rules(ORIENT)
    rev = reverse(fuse)
    assert rev.name == "fuse~reverse" and rev.lhs == fuse.rhs and rev.rhs == fuse.lhs and rev.proved
    assert reverse(comm) is None       # its own reverse
    assert reverse(drop) is None       # a bare variable cannot be a left side
    assert reverse(loses) is None      # ?r is not bound by the right side
    assert reverse(computes) is None   # a parameter expression cannot be matched


def test_orientations_add_new_reverses_only():
    rules = parse_rules(ORIENT)
    assert with_orientations(rules, "given") == rules
    both = [r.name for r in with_orientations(rules, "both")]
    # fuse-again repeats fuse up to names; unfuse is fuse's reverse already
    assert both == ["fuse", "comm", "drop", "loses", "computes", "fuse-again", "unfuse"]
    unfused = parse_rules(ORIENT.split("(rule fuse-again")[0])
    assert [r.name for r in with_orientations(unfused, "both")][:2] == ["fuse", "fuse~reverse"]
    # the reverse of a fusion grows the term: not a shrinking orientation
    assert [r.name for r in with_orientations(unfused, "shrinking")][:2] == ["fuse", "comm"]
    with pytest.raises(RuleError, match="orientations"):
        with_orientations(rules, "sideways")


def test_load_corpus_orientations():
    given = load_corpus(["taso_hand"])
    both = load_corpus(["taso_hand"], orientations="both")
    assert both[:1] == given[:1] and len(both) > len(given)
    assert len({r.name for r in both}) == len(both)
    added = {r.name for r in both} - {r.name for r in given}
    assert added and all(n.removesuffix("~reverse") in {r.name for r in given} for n in added)
    # matmul-associative's reverse is a hand rule already
    assert "matmul-associative~reverse" not in added and "conv-relu-fusion~reverse" in added


# --- derivation ---------------------------------------------------------------------------

SMALL = """
(rule ewadd-3 :lhs (ewadd ?x (ewadd ?y ?z)) :rhs (ewadd (ewadd ?z ?y) ?x)
  :if ((= (shape ?x) (shape ?y)) (= (shape ?y) (shape ?z)))
  :example ((?x [2 3]) (?y [2 3]) (?z [2 3])) :proof ((status proved)))
(rule relu-transpose :lhs (relu (transpose [1 0] ?x)) :rhs (transpose [1 0] (relu ?x))
  :example ((?x [2 3])) :proof ((status proved)))
(rule not-proved :lhs (relu ?x) :rhs (relu (relu ?x)) :example ((?x [2 3]))
  :proof ((status unknown) (reason "left out")))
"""


def test_derive_table_marks_what_each_corpus_derives():
    table = derive_table([r for r in parse_rules(SMALL) if r.proved], ("hand", "axioms"))
    assert table.cells == {"hand": ["yes", "no"], "axioms": ["yes", "yes"]}
    assert table.totals() == {"hand": 1, "axioms": 2}


def test_derive_command_prints_the_table(tmp_path, capsys):
    path = tmp_path / "small.rules"
    path.write_text(SMALL)
    assert main(["rules", "derive", str(path), "--corpus", "hand", "--iterations", "3"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert lines["ewadd-3"] == ["yes"] and lines["relu-transpose"] == ["no"]
    assert "derived (of 2)" in out and "1 not proved left out" in out
    assert main(["rules", "derive", str(path), "--corpus", "nothing"]) == 1
    assert "unknown corpus 'nothing'" in capsys.readouterr().err
    # a rule file as a corpus: the hand rules and its proved rules (here the targets'
    # own file, so each proved target derives itself), headed by the file's name
    assert main(["rules", "derive", str(path), "--corpus", "axioms", str(path), "--iterations", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[1:] == ["axioms", "small.rul"]
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert lines["ewadd-3"][1] == "yes"


def test_weight_guarded_corpus_rules_derive_targets_built_as_weights():
    merge = next(r for r in RULES if r.name == "taso-merge-matmul-shared-input")
    # the hand merge applies to weights only (a scheduling guard): so does its derivation;
    # a matmul's operand is no kernel (attention multiplies activations)
    assert derive_table([merge], ("hand",), weights="kernels").cells["hand"] == ["no"]
    assert derive_table([merge], ("hand",), weights="all").cells["hand"] == ["yes"]
    conv_merge = next(r for r in RULES if r.name == "taso-merge-conv-shared-input")
    assert derive_table([conv_merge], ("hand",), weights="none").cells["hand"] == ["no"]
    assert derive_table([conv_merge], ("hand",)).cells["hand"] == ["yes"]  # kernels: as in a model


def test_kernels_are_what_a_conv_reads_as_its_kernel():
    from taso_egg.generator.derive import kernel_operands, kernel_vars

    assert kernel_operands()["conv2d"] == {1}
    enlarged = next(r for r in RULES if r.name == "taso-concat-conv-enlarged")
    assert kernel_vars(enlarged) == ["w1", "w2"]  # in the rhs under concat and enlarge too
    assert kernel_vars(next(r for r in RULES if r.name == "taso-merge-matmul-shared-input")) == []
    with pytest.raises(RuleError, match="weights must be one of"):
        derive_table([enlarged], ("hand",), weights="some")


def test_a_rule_is_derived_in_its_own_direction():
    # The hand rule transpose-matmul grows transpose(x.y) into y^T.x^T. Saturating a
    # graph that holds y^T.x^T never builds transpose(x.y): the shrinking direction is
    # not derived, though both sides saturated together would meet.
    forward, backward = parse_rules("""
(rule grows
  :lhs (transpose [1 0] (matmul NONE ?x ?y))
  :rhs (matmul NONE (transpose [1 0] ?y) (transpose [1 0] ?x))
  :if ((= (rank ?x) 2))
  :example ((?x [2 3]) (?y [3 4])))
(rule shrinks
  :lhs (matmul NONE (transpose [1 0] ?y) (transpose [1 0] ?x))
  :rhs (transpose [1 0] (matmul NONE ?x ?y))
  :if ((= (rank ?x) 2))
  :example ((?x [2 3]) (?y [3 4])))
""")
    assert derive_table([forward, backward], ("hand",)).cells["hand"] == ["yes", "no"]
