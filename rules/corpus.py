"""The rule corpus: the ``rules/*.rules`` files the package ships, read and parsed once
per process and cached across processes, and the rules' orientations (a proved rule
read right to left).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from taso_egg.disk import cache
from taso_egg.errors import RuleError, VerificationError
from taso_egg.ops import OPS

from . import semantics
from .ast import App, Guard, ParamOp, Proj, Proof, Rule, Var, operators, walk_vars
from .syntax import check_unique_name, parse_rules


def load_rule_file(path) -> list[Rule]:
    path = Path(path)
    return parse_rules(read_rule_text(path), str(path))


def load_user_rules(paths, allow_unproved: bool = False) -> list[Rule]:
    """The rules of the files a user adds to the corpus (``--rules``). A rule
    without a ``proved`` record (``taso-egg rules verify FILE`` writes them) is
    refused, by name, unless ``allow_unproved``: an unsound rule would fail the run's
    check at best, and is not applied unasked."""
    rules = [rule for path in paths for rule in load_rule_file(path)]
    unproved = [rule for rule in rules if not rule.proved]
    if unproved and not allow_unproved:
        names = "; ".join(r.where for r in unproved[:3])
        more = f" and {len(unproved) - 3} more" if len(unproved) > 3 else ""
        raise RuleError(f"{len(unproved)} rule(s) of --rules are not proved: {names}{more}; prove them "
                        f"with `taso-egg rules verify FILE`, or pass --allow-unproved to apply them anyway")
    return rules


@contextmanager
def blame_user_rules(rules, applied):
    """Around a run that applies the user's ``rules``: a VerificationError names those
    of them in ``applied`` (the names of the rules that matched, filled as it runs)."""
    try:
        yield
    except VerificationError as e:
        names = sorted(r.name for r in rules if r.name in applied)
        if not names:
            raise
        raise VerificationError(f"{e} (rules of --rules applied: {', '.join(names)})") from None


def read_rule_text(path, data: bytes | None = None) -> str:
    try:
        data = Path(path).read_bytes() if data is None else data
        return data.decode("utf-8")
    except OSError as e:
        raise RuleError(f"{path}: cannot read rule file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise RuleError(f"{path}: not a rule file (not UTF-8 text: byte {e.start} is "
                        f"0x{e.object[e.start]:02x})") from None


def corpus_files() -> list:
    """Every ``*.rules`` file of the ``taso_egg.rules`` package but the axioms (the
    study files included), sorted by file name."""
    from importlib.resources import files

    root = files("taso_egg.rules")
    return sorted((f for f in root.iterdir() if f.name.endswith(".rules") and f.is_file()
                   and f.name not in AXIOM_FILES), key=lambda f: f.name)


# The verifier's axioms: what corpus rules are proved from, not rewrites themselves.
AXIOM_FILES = ("axioms.rules",)
# Corpus files kept for study, loaded only when named (or with ``study=True``): the
# generated rules whose left side holds a generated constant (GENERATED_CONSTANTS;
# no imported or zoo graph holds one and no default rule builds one, so they can
# match only graphs built with ``Graph.constant``), and the reference corpus of
# TASO's kinds of rules, what `taso-egg rules derive` measures the corpus against.
STUDY_FILES = ("generated-constants.rules", "taso-reference.rules")
# TASO's generated constants: leaves a rule may name (graph inputs and weights are
# ?variables in rules). The ONNX importer never makes them (the scalar leaf, which
# the bridge makes for 0-d weights, is not one).
GENERATED_CONSTANTS = frozenset(op for op in OPS if OPS[op].generated)


def uses_generated_constant(patterns) -> bool:
    """Whether the tensor patterns (a rule's ``lhs`` or ``rhs``) apply a generated constant."""
    return not operators(patterns).isdisjoint(GENERATED_CONSTANTS)


# --- orientations ----------------------------------------------------------------
# A proved rule is an equality; the files hold the orientation that makes a graph
# cheaper (or one of each where the generator found both). Saturation can use the
# other too, as the verifier does the axioms: the reverse of ``lhs -> rhs`` is a rule
# where ``rhs`` can be a left side (an operator, with literal or variable parameters)
# that binds every variable of the rule, and under the same guards.

@dataclass(frozen=True)
class RuleFamily:
    """A named set of rules declared by their names, which callers pass as a value
    (the egglog rulesets a saturation runs are egraph.language.Ruleset)."""

    name: str
    members: frozenset[str]
    doc: str = ""

    def of(self, rules) -> list[Rule]:
        """The members among ``rules``, in their order."""
        return [r for r in rules if r.name in self.members]


# What a runtime fuses by itself (cuDNN, onnxruntime): a graph's cost is taken after
# these (api.runtime_form), so a predicted gain is measured from there.
FUSIONS = RuleFamily("fusions", frozenset({
    "conv-relu-fusion", "conv-sigmoid-fusion", "conv-tanh-fusion", "conv-relu6-fusion",
    "conv-sum-fusion", "conv-sum-commuted-fusion", "conv-sum-relu-fusion",
    "matmul-relu-fusion", "matmul-sigmoid-fusion", "matmul-tanh-fusion", "matmul-relu6-fusion",
    # onnxruntime's GeluFusion and FastGeluFusion: an exporter's GELU runs as one kernel
    "gelu-from-erf", "gelu-from-erf-half-first", "gelu-tanh-from-formula", "gelu-tanh-from-formula-half-last"}),
    doc="activations and residual adds fused into convolutions and matmuls; GELU's formula fused into one")

ORIENTATIONS = ("given", "shrinking", "both")  # what load_corpus(orientations=) accepts


def reverse(rule: Rule) -> Rule | None:
    """The rule read right to left (named ``NAME~reverse``), or None where its right
    side cannot be a left side: a bare variable, a parameter expression, a variable it
    does not bind, or a two-output rule (whose right sides are parts of one split)."""
    if rule.multi or not isinstance(rule.rhs[0], (App, Proj)):
        return None
    new_lhs = rule.rhs[0]
    if _has_param_expression(new_lhs):
        return None
    if not set(rule._var_kinds) <= {name for name, _ in walk_vars(new_lhs)}:
        return None
    if _canonical(new_lhs, rule.lhs[0], rule.guards) == _canonical(rule.lhs[0], rule.rhs[0], rule.guards):
        return None  # its own reverse (commutativity)
    proof = rule.proof
    if proof is not None:
        proof = Proof(proof.status, proof.found_by, proof.axioms, proof.seconds,
                      proof.reason or f"the reverse of {rule.name}")
    return Rule(rule.name + "~reverse", (new_lhs,), rule.lhs, rule.guards, rule.example,
                rule.doc, rule.source, False, proof)


def _has_param_expression(p) -> bool:
    if isinstance(p, Proj):
        return _has_param_expression(p.pattern)
    if isinstance(p, App):
        return any(isinstance(e, ParamOp) for e in p.params) or \
            any(_has_param_expression(t) for t in p.inputs)
    return False


def _size(p) -> int:
    """Operator applications in a pattern."""
    if isinstance(p, Proj):
        return _size(p.pattern)
    return 1 + sum(_size(t) for t in p.inputs) if isinstance(p, App) else 0


def _canonical(lhs, rhs, guards) -> bytes:
    """The rule with its variables numbered in order of appearance (lhs first), for
    telling rules apart up to the names of their variables."""
    names: dict[str, int] = {}

    def walk(node):
        if isinstance(node, Var):
            return names.setdefault(node.name, len(names))
        if isinstance(node, App):
            return (node.op, tuple(map(walk, node.params)), tuple(map(walk, node.inputs)))
        if isinstance(node, Proj):
            return ("proj", walk(node.index), walk(node.pattern))
        if isinstance(node, ParamOp):
            return (node.fn, tuple(map(walk, node.args)))
        if isinstance(node, Guard):
            return (node.kind, tuple(map(walk, node.args)))
        return node  # a Lit

    shape = (walk(lhs), walk(rhs), sorted(map(repr, map(walk, guards))))
    return hashlib.blake2b(repr(shape).encode(), digest_size=16).digest()  # small to cache


def with_orientations(rules, orientations: str = "both") -> list[Rule]:
    """``rules`` and, after each, its :func:`reverse` where that is a new rule:
    ``both`` every one, ``shrinking`` only those whose new right side is no larger
    (in operators) than its new left side, ``given`` none. A reverse that repeats a
    rule already there (up to the names of its variables) is left out."""
    return [r for r, _ in _dedupe(_orient(rules, orientations), set())]


def _orient(rules, orientations: str) -> tuple:
    """``((rule, key), ...)``: each rule, then its reverse where ``orientations``
    keeps it; ``key`` is :func:`_canonical`'s (in a 1-tuple for a reverse; None for a
    two-output rule)."""
    if orientations not in ORIENTATIONS:
        raise RuleError(f"orientations must be one of {', '.join(ORIENTATIONS)}, got {orientations!r}")
    out = []
    for r in rules:
        out.append((r, None if r.multi else _canonical(r.lhs[0], r.rhs[0], r.guards)))
        rev = reverse(r) if orientations != "given" else None
        if rev is None or (orientations == "shrinking" and _size(rev.rhs[0]) > _size(rev.lhs[0])):
            continue
        out.append((rev, (_canonical(rev.lhs[0], rev.rhs[0], rev.guards),)))
    return tuple(out)


def _dedupe(pairs, seen: set):
    """The rules of :func:`_orient`'s pairs but the reverses that repeat a rule among
    them or in ``seen`` (which then holds them all)."""
    pairs = list(pairs)
    seen.update(k for _, k in pairs if isinstance(k, bytes))
    for rule, key in pairs:
        if isinstance(key, tuple):
            if key[0] in seen:
                continue
            seen.add(key[0])
        yield rule, key


def default_orientations() -> str:
    """``TASO_EGG_ORIENTATIONS`` (one of ORIENTATIONS) or ``given``: how load_corpus
    orients the corpus when not told, so that a whole command can be measured both ways."""
    return os.environ.get("TASO_EGG_ORIENTATIONS", "") or "given"


def load_corpus(names=None, include_unproved: bool = False, study: bool = False,
                orientations: str | None = None) -> list[Rule]:
    """The proved rules of the corpus files (sorted by file name, rules in file order);
    ``include_unproved`` adds the rules without a ``proved`` record (for experiments).
    ``names`` restricts to some files, by stem or file name (``"taso_hand"`` or
    ``"taso_hand.rules"``; a study file only this way or with ``study``); without it,
    every corpus file but the STUDY_FILES (the hand rules and the generated ones), and
    with ``study`` those too. Rule names must be unique across the files read.

    Each file is parsed once per process and, across processes, read from the cache
    (:mod:`taso_egg.disk.cache`) under a key of its bytes, its path and the reader's own
    source (this module, ``semantics.py`` and the operator table), so an edit to any
    of them parses it again.

    ``orientations`` (see :func:`with_orientations`; default ``given``, or the
    ``TASO_EGG_ORIENTATIONS`` environment variable) adds the rules' reverses."""
    available = corpus_files()
    if names is not None:
        if isinstance(names, str):
            names = [names]
        by_name = {f.name: f for f in available}
        chosen = []
        for n in names:
            key = n if n.endswith(".rules") else n + ".rules"
            if key not in by_name:
                raise RuleError(f"no rule file {key!r} in the corpus; available: "
                                f"{sorted(by_name)}")
            if by_name[key] not in chosen:
                chosen.append(by_name[key])
        available = sorted(chosen, key=lambda f: f.name)
    elif not study:
        available = [f for f in available if f.name not in STUDY_FILES]
    orientations = orientations or default_orientations()
    rules: list[Rule] = []
    seen: dict[str, Rule] = {}
    same: set = set()
    for f in available:
        path, data = str(f), f.read_bytes()
        for rule in _parsed_file(path, data):
            check_unique_name(rule, seen)
        if orientations == "given":
            rules += [r for r in _parsed_file(path, data) if include_unproved or r.proved]
            continue
        pairs = [(r, k) for r, k in _oriented_file(path, data, orientations) if include_unproved or r.proved]
        rules += [r for r, _ in _dedupe(pairs, same)]
    return rules


_PARSED: dict = {}  # cache key -> parsed or oriented rules, this process's (the 16 latest)


def _cached(k: str, valid, compute):
    """The value stored under ``k``: in this process, else in the cache
    (:mod:`taso_egg.disk.cache`) where ``valid`` accepts it, else ``compute()``'s, stored
    there. This process keeps the 16 values it last looked up anew."""
    value = _PARSED.get(k)
    if value is None:
        value = cache.load("rules", k)
        if not valid(value):
            value = compute()
            cache.store("rules", k, value)
        if len(_PARSED) >= 16:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[k] = value
    return value


def _parsed_file(path: str, data: bytes) -> tuple[Rule, ...]:
    """The rules of a rule file's bytes, parsed once: parsing a thousand rules takes a
    second and every command loads the corpus. Rules are immutable, so the tuple is
    shared."""
    return _cached(cache.key("rules", sys.version, _reader_digest(), path, data),
                   lambda rules: isinstance(rules, tuple) and all(type(r) is Rule for r in rules),
                   lambda: tuple(parse_rules(read_rule_text(path, data), path)))


def _oriented_file(path: str, data: bytes, orientations: str) -> tuple:
    """:func:`_orient` of a rule file's rules, cached as its parse is (telling a
    thousand rules apart from their reverses takes half a second)."""
    return _cached(cache.key("rules-" + orientations, sys.version, _reader_digest(), path, data),
                   lambda pairs: isinstance(pairs, tuple) and all(type(r) is Rule for r, _ in pairs),
                   lambda: _orient(_parsed_file(path, data), orientations))


@functools.cache
def _reader_digest() -> str:
    """What parsing and orienting depend on besides the text: the rule language's
    modules (the AST, its vocabulary and ``semantics.py``, the parser, this module)
    and the operator table (``taso_egg/ops``), by their source."""
    import taso_egg.ops

    here = Path(__file__).parent
    return cache.source_digest([*(here / f for f in ("ast.py", "vocabulary.py", "syntax.py", "corpus.py")),
                                Path(semantics.__file__), *Path(taso_egg.ops.__file__).parent.glob("*.py")])


__all__ = ["load_corpus", "corpus_files", "load_rule_file", "read_rule_text", "AXIOM_FILES", "STUDY_FILES",
           "GENERATED_CONSTANTS", "uses_generated_constant", "ORIENTATIONS", "reverse", "with_orientations",
           "default_orientations"]
