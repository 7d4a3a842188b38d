"""The rule language front end: parsing of every construct, and the errors (each names
file, line and rule)."""

from __future__ import annotations

import re

import pytest

from taso_egg.errors import RuleError
from taso_egg.rules.ast import App, Guard, Lit, ParamOp, Proj, Rule, Var
from taso_egg.rules.corpus import load_corpus, load_rule_file
from taso_egg.rules.syntax import parse_rules

EXAMPLES = """\
; the four examples of the language description
(rule conv-relu-fusion
  :lhs (relu (conv2d ?s ?p NONE ?x ?w))
  :rhs (conv2d ?s ?p RELU ?x ?w)          ; fused activation
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

(multi merge-matmul-shared-input
  :lhs ((matmul ?act ?x ?w1) (matmul ?act ?x ?w2))
  :rhs ((proj 0 (split 1 (vec (dim ?w1 1) (dim ?w2 1)) (matmul ?act ?x (concat 1 ?w1 ?w2))))
        (proj 1 (split 1 (vec (dim ?w1 1) (dim ?w2 1)) (matmul ?act ?x (concat 1 ?w1 ?w2)))))
  :if ((weight ?w1) (weight ?w2) (before ?w1 ?w2) (= (rank ?w1) 2) (= (dim ?w1 0) (dim ?w2 0)))
  :example ((?x [2 4]) (?w1 [4 3]) (?w2 [4 5]) (?act RELU))
  :doc "two matmuls sharing an input become one")
"""


def one(text: str) -> Rule:
    (rule,) = parse_rules(text, "t.rules")
    return rule


def rule_error(text: str, filename: str = "bad.rules") -> str:
    with pytest.raises(RuleError) as info:
        parse_rules(text, filename)
    return str(info.value)


# --- constructs --------------------------------------------------------------------


def test_examples_parse():
    rules = parse_rules(EXAMPLES, "ex.rules")
    assert [r.name for r in rules] == ["conv-relu-fusion", "matmul-assoc", "split-concat-0",
                                       "merge-matmul-shared-input"]
    assert [r.source for r in rules] == [("ex.rules", 2), ("ex.rules", 7), ("ex.rules", 12),
                                         ("ex.rules", 18)]
    assert [r.multi for r in rules] == [False, False, False, True]


def test_app_params_then_inputs():
    r = parse_rules(EXAMPLES)[0]
    assert r.lhs == (App("relu", (), (App("conv2d", (Var("s"), Var("p"), Lit("NONE")),
                                          (Var("x"), Var("w"))),)),)
    assert r.rhs == (App("conv2d", (Var("s"), Var("p"), Lit("RELU")), (Var("x"), Var("w"))),)
    assert r.lhs[0].inputs[0].param_dict() == {"strides": Var("s"), "padding": Var("p"),
                                               "activation": Lit("NONE")}
    assert r.tensor_vars() == ("x", "w")
    assert r.param_vars() == ("s", "p")
    assert r.example == {"x": (1, 4, 5, 5), "w": (6, 4, 3, 3), "s": (1, 1), "p": "SAME"}
    assert r.guards == () and r.doc == ""


def test_proj_guards_and_param_expressions():
    r = parse_rules(EXAMPLES)[2]
    split = App("split", (Var("ax"), Var("sizes")),
                (App("concat", (Var("ax"),), (Var("a"), Var("b"))),))
    assert r.lhs == (Proj(0, split),)
    assert r.rhs == (Var("a"),)
    assert r.guards == (
        Guard("=", (ParamOp("len", (Var("sizes"),)), Lit(2))),
        Guard("=", (ParamOp("at", (Var("sizes"), Lit(0))), ParamOp("dim", (Var("a"), Var("ax"))))),
    )
    assert r.tensor_vars() == ("a", "b")
    assert r.param_vars() == ("ax", "sizes")


def test_multi_rule():
    r = parse_rules(EXAMPLES)[3]
    assert len(r.lhs) == 2 and len(r.rhs) == 2 and r.multi
    assert r.doc == "two matmuls sharing an input become one"
    assert r.weight_vars() == ("w1", "w2")
    assert [g.kind for g in r.guards] == ["weight", "weight", "before", "=", "="]
    assert r.guards[2] == Guard("before", (Var("w1"), Var("w2")))
    proj = r.rhs[1]
    assert isinstance(proj, Proj) and proj.index == 1
    sizes = proj.pattern.params[1]
    assert sizes == ParamOp("vec", (ParamOp("dim", (Var("w1"), Lit(1))),
                                    ParamOp("dim", (Var("w2"), Lit(1)))))
    assert r.tensor_vars() == ("x", "w1", "w2") and r.param_vars() == ("act",)


def test_literals_and_all_param_fns():
    r = one("""(rule lits
      :lhs (batchnorm 1e-5 ?x ?s ?b ?m ?v)
      :rhs (batchnorm 0.00001 ?x ?s ?b ?m ?v)
      :if ((!= (+ (dim ?x 0) 1) 0) (< (- (rank ?x) 1) 9) (<= (* 2 (/ (dim ?x 1) 2)) 99)
           (> (len (shape ?x)) -1) (>= (at (vec 3 4 5) 2) 5) (= [1 2] [1 2]) (= "a b" "a b")))""")
    assert r.lhs[0].params == (Lit(1e-5),) and isinstance(r.lhs[0].params[0].value, float)
    assert [g.kind for g in r.guards] == ["!=", "<", "<=", ">", ">=", "=", "="]
    assert r.guards[3].args[1] == Lit(-1)
    assert r.guards[5].args == (Lit((1, 2)), Lit((1, 2)))
    assert r.guards[6].args == (Lit("a b"), Lit("a b"))
    assert r.guards[2].args[0] == ParamOp("*", (Lit(2), ParamOp("/", (ParamOp("dim", (Var("x"), Lit(1))), Lit(2)))))
    assert r.tensor_vars() == ("x", "s", "b", "m", "v") and r.param_vars() == ()


def test_explicit_padding_vector_and_repeated_vars():
    r = one("(rule pad :lhs (conv2d [1 1] [0 1 0 1] NONE ?a ?w) "
            ":rhs (conv2d [1 1] [0 1 0 1] NONE ?a ?w))")
    assert r.lhs[0].params[1] == Lit((0, 1, 0, 1))
    r2 = one("(rule twice :lhs (ewadd ?a ?a) :rhs (smul ?a ?a))")
    assert r2.tensor_vars() == ("a",)


def test_optional_trailing_params_are_filled_with_defaults():
    r = one("""(rule consts
      :lhs (ewmul ?x (const_one [2 3]))
      :rhs (ewmul ?x (const_one (shape ?x) float32))
      :example ((?x [2 3])))""")
    assert r.lhs[0].inputs[1] == App("const_one", (Lit((2, 3)), Lit("float32")), ())
    assert r.rhs[0].inputs[1] == App("const_one", (ParamOp("shape", (Var("x"),)), Lit("float32")), ())
    r = one("(rule pool :lhs (avgpool2d [2 2] [2 2] VALID NONE ?x) "
            ":rhs (avgpool2d [2 2] [2 2] VALID NONE 1 ?x))")
    assert r.lhs == r.rhs
    assert r.lhs[0].params == (Lit((2, 2)), Lit((2, 2)), Lit("VALID"), Lit("NONE"), Lit(1))


def test_conv_optional_bias_input():
    r = one("(rule bias :lhs (conv2d ?s ?p NONE ?x ?w ?b) :rhs (conv2d ?s ?p NONE ?x ?w ?b))")
    assert r.lhs[0].inputs == (Var("x"), Var("w"), Var("b"))


def test_comments_whitespace_and_doc_escapes():
    r = one('; leading comment\n(rule c ; name\n :lhs (relu ?x) ; pattern\n'
            ' :rhs (relu ?x)\n :doc "say \\"hi\\"; not a comment")\n; trailing\n')
    assert r.doc == 'say "hi"; not a comment'
    assert r.source == ("t.rules", 2)


def test_round_trip_to_text():
    for r in parse_rules(EXAMPLES, "ex.rules"):
        (back,) = parse_rules(r.to_text(), "ex.rules")
        assert (back.lhs, back.rhs, back.guards, back.example, back.doc, back.multi) == \
               (r.lhs, r.rhs, r.guards, r.example, r.doc, r.multi)


def test_ast_is_frozen_and_hashable():
    r = parse_rules(EXAMPLES)[3]
    with pytest.raises(AttributeError):
        r.lhs[0].op = "x"  # type: ignore[misc]
    assert len({r.lhs[0], r.lhs[1], r.rhs[0], r.rhs[1]}) == 4
    hash(r)
    assert Lit(1) != Lit(1.0) and Lit(1) == Lit(1) and len({Lit(1), Lit(1.0)}) == 2


def test_load_rule_file(tmp_path):
    path = tmp_path / "some.rules"
    path.write_text(EXAMPLES)
    rules = load_rule_file(path)
    assert len(rules) == 4 and rules[0].source == (str(path), 2)
    with pytest.raises(RuleError, match="cannot read"):
        load_rule_file(tmp_path / "missing.rules")


def test_load_corpus_is_deterministic():
    rules = load_corpus()
    assert [r.name for r in rules] == [r.name for r in load_corpus()]
    assert len({r.name for r in rules}) == len(rules)
    files = [r.source[0] for r in rules]
    # grouped by file, files in name order
    order = list(dict.fromkeys(files))
    assert order == sorted(order, key=lambda f: f.rsplit("/", 1)[-1])
    with pytest.raises(RuleError, match="no rule file"):
        load_corpus(["no_such_file"])


# --- errors ------------------------------------------------------------------------


def where(msg: str, line: int, rule: str | None = "r", filename: str = "bad.rules") -> None:
    assert msg.startswith(f"{filename}:{line}:"), msg
    if rule:
        assert f"rule {rule!r}" in msg, msg


@pytest.mark.parametrize("text, line, needle", [
    ("(rule r\n :lhs (frobnicate ?x)\n :rhs ?x)", 2, "unknown operator 'frobnicate'"),
    ("(rule r\n :lhs (relu ?x ?y)\n :rhs ?x)", 2, "relu takes 1 arguments (relu T), got 2"),
    ("(rule r\n :lhs (conv2d ?s ?p ?x ?w)\n :rhs ?x)", 2, "conv2d takes 5 or 6 arguments"),
    ("(rule r\n :lhs (matmul ?x ?y)\n :rhs ?x)", 2, "matmul takes 3 arguments"),
    ("(rule r\n :lhs (concat 0 ?a ?b ?c)\n :rhs ?a)", 2, "concat takes 3 arguments"),
    ("(rule r\n :lhs (const_one)\n :rhs ?x)", 2, "const_one takes 1 or 2 arguments"),
    ("(rule r\n :lhs (relu ?x)\n :rhs (relu ?y))", 3, "?y in :rhs is not bound by :lhs"),
    ("(rule r\n :lhs (matmul ?a ?x ?y)\n :rhs (matmul ?b ?x ?y))", 3, "?b in :rhs is not bound"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :if ((= (rank ?z) 2)))", 4, "?z in :if is not bound"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :if ((= ?n 2)))", 4, "?n in :if is not bound"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :if ((weight ?w)))", 4, "?w in :if is not bound"),
    ("(rule r\n :lhs (matmul ?x ?x ?y)\n :rhs ?y)", 2, "?x is used both as a param (line 2) and as a tensor"),
    ("(rule r\n :lhs (split ?ax ?s ?x)\n :rhs ?x)", 2, "split has several outputs"),
    ("(rule r\n :lhs (proj 0 (relu ?x))\n :rhs ?x)", 2, "proj selects an output of a multi-output"),
    ("(rule r\n :lhs (proj 2 (split 0 [1 1] ?x))\n :rhs ?x)", 2, "proj index 2 out of range"),
    ("(rule r\n :lhs (proj x (split 0 [1 1] ?x))\n :rhs ?x)", 2, "proj index must be a non-negative"),
    ("(rule r\n :lhs (relu (input ?x))\n :rhs ?x)", 2, "'input' cannot appear in a pattern"),
    ("(rule r\n :lhs (relu (weight ?x))\n :rhs ?x)", 2, "'weight' cannot appear in a pattern"),
    ("(rule r\n :lhs (relu 3)\n :rhs 3)", 2, "expected a tensor pattern"),
    ("(rule r\n :lhs (relu (dim ?x 0))\n :rhs ?x)", 2, "parameter expression (dim ...) used where a tensor"),
    ("(rule r\n :lhs (matmul (relu ?y) ?x ?y)\n :rhs ?x)", 2, "expected a parameter"),
    ("(rule r\n :lhs (matmul (+ ?n 1) ?x ?y)\n :rhs ?x)", 2, "not allowed in :lhs"),
    ("(rule r\n :lhs (relu ?x)\n :rhs (reshape (dim ?x) ?x))", 3, "(dim ...) takes 2 argument(s), got 1"),
    ("(rule r\n :lhs (relu ?x)\n :rhs (reshape (shape (relu ?x)) ?x))", 3, "takes a tensor ?variable"),
    ("(rule r\n :lhs (relu ?x)\n :rhs (reshape (frob ?x) ?x))", 3, "expected a parameter"),
    ("(rule r\n :lhs (relu ?x)\n :rhs (reshape [1 a] ?x))", 3, "vector literals hold integers only"),
    ("(rule r\n :lhs (matmul RELUX ?x ?y)\n :rhs ?x)", 2, "parameter 'activation' of matmul must be one of"),
    ("(rule r\n :lhs (conv2d 1 SAME NONE ?x ?w)\n :rhs ?x)", 2, "parameter 'strides' of conv2d must be an int vector"),
    ("(rule r\n :lhs (conv2d [1 1] FULL NONE ?x ?w)\n :rhs ?x)", 2, "parameter 'padding'"),
    ("(rule r\n :lhs (concat x ?a ?b)\n :rhs ?a)", 2, "parameter 'axis' of concat must be an integer"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :if ((frob ?x)))", 4, "unknown guard"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :if ((= 1)))", 4, "(= A B) takes 2 arguments, got 1"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :if ((before ?x)))", 4, "(before ...) takes 2 tensor"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :if ((weight 3)))", 4, "takes tensor ?variables"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :if (= 1 1))", 4, ":if takes a list of guards"),
    ("(rule r\n :lhs ?x\n :rhs (relu ?x))", 2, "the :lhs root must be an operator pattern"),
    ("(rule r\n :rhs ?x)", 1, "missing :lhs"),
    ("(rule r\n :lhs (relu ?x))", 1, "missing :rhs"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :frob 1)", 4, "unknown keyword :frob"),
    ("(rule r\n :lhs (relu ?x)\n :lhs (relu ?x)\n :rhs ?x)", 3, ":lhs given twice"),
    ("(rule r\n :lhs (relu ?x)\n :rhs)", 3, ":rhs has no value"),
    ("(rule r\n :lhs (relu ?x)\n (relu ?x))", 3, "expected a keyword"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :doc nodoc)", 4, ":doc takes a quoted string"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :example ((?x [2 3]) (?y [1])))", 4, ":example binds ?y, which :lhs does not use"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :example ((?x 3)))", 4, "tensor ?x needs a shape"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :example ((?x [2]) (?x [3])))", 4, "binds ?x twice"),
    ("(rule r\n :lhs (matmul ?a ?x ?y)\n :rhs ?x\n :example ((?x [2 2]) (?y [2 2])))", 4, ":example does not bind ?a"),
    ("(rule r\n :lhs (relu ?x)\n :rhs ?x\n :example (?x [2]))", 4, "an :example binding is (?var VALUE)"),
    ("(multi r\n :lhs ((relu ?x))\n :rhs ((relu ?x)))", 2, "multi rule :lhs must have exactly 2 patterns, got 1"),
    ("(multi r\n :lhs ((relu ?x) (relu ?y))\n :rhs ((relu ?x) ?y (relu ?y)))", 3, "multi rule :rhs must have exactly 2 patterns, got 3"),
    ("(multi r\n :lhs (relu ?x)\n :rhs ((relu ?x) ?x))", 2, "multi rule :lhs must be a list of exactly 2 patterns"),
    ("(multi r\n :lhs ((relu ?x) ?y)\n :rhs (?x ?y))", 2, "the :lhs root must be an operator pattern"),
])
def test_rule_errors(text, line, needle):
    msg = rule_error(text)
    where(msg, line)
    assert needle in msg, msg


@pytest.mark.parametrize("text, line, needle", [
    ("(rule r :lhs (relu ?x) :rhs ?x", 1, "'(' opened here is never closed"),
    ("(rule r :lhs (relu ?x) :rhs ?x))", 1, "unexpected ')'"),
    ("\n(rule r :lhs (relu ?x] :rhs ?x)", 2, "']' closes the '(' opened on line 2"),
    ('(rule r :lhs (relu ?x) :rhs ?x :doc "abc)', 1, "unterminated string"),
    ("(rule r :lhs (relu ?) :rhs ?x)", 1, "bad variable name '?'"),
    ("\n\nrelu", 3, "at top level"),
    ("(frob r :lhs (relu ?x) :rhs ?x)", 1, "expected (rule NAME ...)"),
    ("(rule :lhs (relu ?x) :rhs ?x)", 1, "needs a name"),
])
def test_syntax_errors(text, line, needle):
    msg = rule_error(text)
    where(msg, line, rule=None)
    assert needle in msg, msg


def test_duplicate_names_in_a_file():
    text = "(rule a :lhs (relu ?x) :rhs ?x)\n\n(rule a :lhs (tanh ?x) :rhs ?x)\n"
    msg = rule_error(text)
    where(msg, 3, rule="a")
    assert "duplicate rule name (first defined at bad.rules:1)" in msg


def test_duplicate_names_across_corpus_files(tmp_path, monkeypatch):
    from taso_egg.rules import corpus

    (tmp_path / "a.rules").write_text("(rule same :lhs (relu ?x) :rhs ?x)\n")
    (tmp_path / "b.rules").write_text("; b\n(rule other :lhs (tanh ?x) :rhs ?x)\n"
                                      "(rule same :lhs (sigmoid ?x) :rhs ?x)\n")
    (tmp_path / "notes.txt").write_text("(not a rule file")
    monkeypatch.setattr(corpus, "corpus_files", lambda: sorted(tmp_path.glob("*.rules")))
    assert [r.name for r in corpus.load_corpus(["a"], include_unproved=True)] == ["same"]
    assert [r.name for r in corpus.load_corpus(["b.rules"], include_unproved=True)] == ["other", "same"]
    with pytest.raises(RuleError) as info:
        corpus.load_corpus(include_unproved=True)
    msg = str(info.value)
    assert msg.startswith(f"{tmp_path / 'b.rules'}:3: rule 'same'"), msg
    assert f"first defined at {tmp_path / 'a.rules'}:1" in msg


def test_error_mentions_the_offending_line_inside_a_long_rule():
    text = EXAMPLES + "\n(rule late\n  :lhs (relu ?x)\n  :rhs (tanh\n    ?q))\n"
    msg = rule_error(text, "ex.rules")
    n = EXAMPLES.count("\n") + 5
    assert re.match(rf"ex\.rules:{n}: rule 'late': \?q in :rhs is not bound", msg), msg
