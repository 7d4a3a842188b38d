"""The rule language: a reader for ``rules/*.rules`` files and the AST every back end
(egglog compiler, graph pattern matcher, Z3 verifier, numeric checker) consumes.

Syntax (S-expressions; ``;`` starts a comment that runs to the end of the line)::

    (rule NAME :lhs PAT :rhs PAT [:if (GUARD ...)] [:example (BINDING ...)] [:doc "text"]
          [:proof (RECORD ...)])
    (multi NAME :lhs (PAT PAT) :rhs (PAT PAT) ...)      ; rhs[i] replaces lhs[i]

Patterns (tensor positions)
    ``?v``                      a tensor variable
    ``(OP PARAM... INPUT...)``  an operator of the table (``taso_egg.ops.OPS``): its
                                parameters first, in the order of ``OPS[op].defaults``,
                                then its tensor inputs. Every parameter is required, with
                                two documented exceptions that may be left out at the end
                                (the AST then holds the default): ``dtype`` of the constants
                                (``const_one``/``const_imm``/``const_iconv``/``const_pool``,
                                default ``float32``) and ``count_include_pad`` of
                                ``avgpool2d`` (default 1). ``concat`` is binary in patterns:
                                ``(concat AXIS A B)``. The leaves ``input``/``weight`` and
                                ``opaque`` cannot appear.
    ``(proj I PAT)``            output I of a multi-output operator (``split``); a split
                                anywhere else is an error.

Parameters (parameter positions, guards)
    ``?v`` (a parameter variable), an integer, a float, a bare symbol (a string such as
    ``RELU``, ``SAME``), a quoted string, an int vector ``[1 1]``, and the expressions
    ``(dim T I)``, ``(rank T)``, ``(shape T)`` (``T`` a tensor variable), ``(len V)``,
    ``(at V I)``, ``(+ A B)``, ``(- A B)``, ``(* A B)``, ``(/ A B)`` (integer division
    of A >= 0 by B > 0), ``(vec A ...)``. Expressions are allowed in ``:rhs`` and ``:if`` only; the
    ``:lhs`` parameters are variables or literals (a variable repeated in the lhs must
    match equal values). Axes and positions (``I`` above) count from 0.

Guards (``:if``)
    ``(= A B)`` ``(!= A B)`` ``(< A B)`` ``(<= A B)`` ``(> A B)`` ``(>= A B)`` over
    parameters; ``(weight T)``: tensor variable T is computed from weights only;
    ``(before T1 T2)``: an anchoring order between two weight-only tensors (used by
    saturation to apply a symmetric multi rule once; always true for numeric checks).

    What each guard and parameter function means, exactly (where it is undefined,
    what counts as computed from weights), is declared once in ``rules/semantics.py``;
    the vocabulary below is read from there.

Examples (``:example``)
    ``((?x [1 4 5 5]) (?s [1 1]) (?p SAME) ...)``: a shape for each tensor variable, a
    value for each parameter variable. When present it must bind every lhs variable.

Proof records (``:proof``)
    ``((status proved) (found-by generator-3) (axioms ax-a ax-b) (seconds 0.012)
    (reason "text"))``: what ``taso-egg rules verify`` found (status one of PROOF_STATUSES;
    every entry but ``status`` optional). :func:`load_corpus` loads only proved rules
    unless asked for the others.

Variable names are stored without the ``?`` (``Var("x")`` for ``?x``; example keys are
``"x"``). ``App.params`` always holds every parameter of the operator (omitted optional
ones are filled with their default), so back ends never deal with omissions.

Every error is a :class:`~taso_egg.errors.RuleError` whose message starts with
``FILE:LINE: rule NAME:``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Union

from taso_egg import cache
from taso_egg.errors import RuleError, VerificationError
from taso_egg.ops import FLOAT_DTYPES, OPS
from taso_egg.ops.base import PARAM_KINDS
from taso_egg.ops.elementwise import ACTIVATIONS

from . import semantics

# --- AST ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Var:
    """A variable; ``name`` without the leading ``?``. Whether it is a tensor or a
    parameter variable follows from where it is used (``Rule.tensor_vars()``)."""

    name: str

    def __str__(self) -> str:
        return "?" + self.name


@dataclass(frozen=True, eq=False)
class Lit:
    """A parameter literal: int, float, str (a symbol like RELU) or tuple of ints.
    Equality is type-exact: ``Lit(1) != Lit(1.0)``."""

    value: Union[int, float, str, tuple]

    def __eq__(self, other) -> bool:
        return isinstance(other, Lit) and type(self.value) is type(other.value) \
            and self.value == other.value

    def __hash__(self) -> int:
        return hash((type(self.value).__name__, self.value))

    def __str__(self) -> str:
        return _format_value(self.value)


@dataclass(frozen=True)
class ParamOp:
    """A parameter expression: ``fn`` is one of PARAM_FNS. For ``dim``/``rank``/
    ``shape`` the first argument is a tensor :class:`Var`."""

    fn: str
    args: tuple

    def __str__(self) -> str:
        return "(" + " ".join([self.fn] + [str(a) for a in self.args]) + ")"


@dataclass(frozen=True)
class App:
    """Operator ``op`` applied to all its parameters (in ``OPS[op].defaults`` order;
    for ``concat`` just ``axis``) and its tensor inputs (binary for ``concat``)."""

    op: str
    params: tuple
    inputs: tuple

    def param_dict(self) -> dict:
        """``{parameter name: ParamExpr}``."""
        return dict(zip(param_names(self.op), self.params))

    # The hash is kept: patterns key the builders' memos, and hashing a tree walks it.
    # It stays out of pickles, since string hashes differ from process to process.
    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.params, self.inputs))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __str__(self) -> str:
        return "(" + " ".join([self.op] + [str(a) for a in self.params + self.inputs]) + ")"


@dataclass(frozen=True)
class Proj:
    """Output ``index`` of a multi-output operator application (``split``)."""

    index: int
    pattern: App

    def __str__(self) -> str:
        return f"(proj {self.index} {self.pattern})"


@dataclass(frozen=True)
class Proof:
    """Provenance of a rule: its verification status, how it was found (``hand``,
    ``generator-3``), the axioms its proof used, the prover's seconds, and why it was
    not proved."""

    status: str
    found_by: str = ""
    axioms: tuple = ()
    seconds: float | None = None
    reason: str = ""

    def __str__(self) -> str:
        parts = [f"(status {self.status})"]
        if self.found_by:
            parts.append(f"(found-by {_format_value(self.found_by)})")
        if self.axioms:
            parts.append("(axioms " + " ".join(_format_value(a) for a in self.axioms) + ")")
        if self.seconds is not None:
            parts.append(f"(seconds {_format_value(float(self.seconds))})")
        if self.reason:
            parts.append("(reason " + _quote(self.reason) + ")")
        return "(" + " ".join(parts) + ")"


PROOF_STATUSES = ("proved", "refuted", "unknown", "unsupported", "unchecked")


Pattern = Union[Var, App, Proj]
ParamExpr = Union[Var, Lit, ParamOp]


@dataclass(frozen=True)
class Guard:
    """``kind`` is one of GUARD_KINDS; ``args`` are ParamExprs for comparisons and
    tensor :class:`Var` for ``weight``/``before``."""

    kind: str
    args: tuple

    def __str__(self) -> str:
        return "(" + " ".join([self.kind] + [str(a) for a in self.args]) + ")"


@dataclass(frozen=True)
class Rule:
    """One rewrite. ``lhs``/``rhs`` have one pattern (``rule``) or two (``multi``);
    ``rhs[i]`` replaces ``lhs[i]``. ``example`` maps variable names (no ``?``) to a
    shape tuple (tensor vars) or a parameter value; empty when the rule has none.
    ``source`` is ``(file, line)`` of the rule's opening parenthesis."""

    name: str
    lhs: tuple
    rhs: tuple
    guards: tuple = ()
    example: dict = field(default_factory=dict, hash=False)
    doc: str = ""
    source: tuple = ("<string>", 0)
    multi: bool = False
    proof: Proof | None = None

    @property
    def proved(self) -> bool:
        return self.proof is not None and self.proof.status == "proved"

    def tensor_vars(self) -> tuple[str, ...]:
        """Names of the tensor variables, in order of first appearance (lhs first)."""
        return tuple(n for n, k in self._var_kinds.items() if k == "tensor")

    def param_vars(self) -> tuple[str, ...]:
        """Names of the parameter variables, in order of first appearance (lhs first)."""
        return tuple(n for n, k in self._var_kinds.items() if k == "param")

    def weight_vars(self) -> tuple[str, ...]:
        """Tensor variables a ``(weight ?v)`` guard names."""
        return tuple(g.args[0].name for g in self.guards if g.kind == "weight")

    @functools.cached_property
    def _var_kinds(self) -> dict[str, str]:
        # cached: the generator instantiates each rule many times (the rule is immutable)
        kinds: dict[str, str] = {}
        for p in self.lhs + self.rhs:
            for name, kind in walk_vars(p):
                kinds.setdefault(name, kind)
        for g in self.guards:
            for name, kind in guard_vars(g):
                kinds.setdefault(name, kind)
        return kinds

    @functools.cached_property
    def where(self) -> str:  # cached: every parameter evaluation carries it for its errors
        return f"{self.source[0]}:{self.source[1]}: rule {self.name!r}"

    def to_text(self) -> str:
        """The rule in the surface syntax (parses back to an equal Rule)."""
        head = "multi" if self.multi else "rule"
        if self.multi:
            lhs = "(" + " ".join(map(str, self.lhs)) + ")"
            rhs = "(" + " ".join(map(str, self.rhs)) + ")"
        else:
            lhs, rhs = str(self.lhs[0]), str(self.rhs[0])
        parts = [f"({head} {self.name}", f"  :lhs {lhs}", f"  :rhs {rhs}"]
        if self.guards:
            parts.append("  :if (" + " ".join(map(str, self.guards)) + ")")
        if self.example:
            parts.append("  :example (" + " ".join(
                f"(?{k} {_format_value(v)})" for k, v in self.example.items()) + ")")
        if self.doc:
            parts.append("  :doc " + _quote(self.doc))
        if self.proof is not None:
            parts.append(f"  :proof {self.proof}")
        return "\n".join(parts) + ")"


def operators(patterns) -> set[str]:
    """The operators the tensor patterns apply."""
    ops: set[str] = set()
    todo = list(patterns)
    while todo:
        p = todo.pop()
        if isinstance(p, Proj):
            todo.append(p.pattern)
        elif isinstance(p, App):
            ops.add(p.op)
            todo.extend(p.inputs)
    return ops


def walk_vars(node) -> Iterator[tuple[str, str]]:
    """``(name, "tensor" | "param")`` for every variable occurrence in a pattern or
    parameter expression (``node`` taken to be in a tensor position when a Var)."""
    yield from _walk(node, "tensor")


def _walk(node, kind):
    if isinstance(node, Var):
        yield node.name, kind
    elif isinstance(node, App):
        for p in node.params:
            yield from _walk(p, "param")
        for t in node.inputs:
            yield from _walk(t, "tensor")
    elif isinstance(node, Proj):
        yield from _walk(node.pattern, "tensor")
    elif isinstance(node, ParamOp):
        for i, a in enumerate(node.args):
            yield from _walk(a, "tensor" if semantics.PARAM_FNS[node.fn].arg_kind(i) == semantics.TENSOR
                             else "param")


def _static_kind(e) -> str | None:
    """The value kind (rules/semantics.py's value_kind) of a parameter expression
    where it is known without the operators its variables bind to; None for a variable."""
    if isinstance(e, ParamOp):
        return semantics.result_kind(e.fn)
    if isinstance(e, Lit):
        return semantics.value_kind(e.value)
    return None


def guard_vars(g: Guard) -> Iterator[tuple[str, str]]:
    kind = "tensor" if g.kind in TENSOR_GUARDS else "param"
    for a in g.args:
        yield from _walk(a, kind)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _format_value(v) -> str:
    if isinstance(v, tuple):
        return "[" + " ".join(_format_value(x) for x in v) + "]"
    if isinstance(v, str):
        return v if _SYMBOL.fullmatch(v) else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        text = repr(v)
        return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"
    return str(v)


# --- the language's vocabulary -----------------------------------------------------

# The guards and parameter functions, with their meaning, are declared once in
# rules/semantics.py; these are the names and arities the reader checks.
# name -> (min args, max args or None)
PARAM_FNS = {name: fn.arity for name, fn in semantics.PARAM_FNS.items()}
COMPARISONS = semantics.COMPARISONS
TENSOR_GUARDS = semantics.TENSOR_GUARDS  # name -> number of tensor variables
GUARD_KINDS = tuple(semantics.GUARDS)
KEYWORDS = (":lhs", ":rhs", ":if", ":example", ":doc", ":proof")
_PROOF_KEYS = ("status", "found-by", "axioms", "seconds", "reason")

# What the operator table says about patterns: which operators may appear (leaves are
# ?variables, opaque nodes are barriers), which have several outputs, and which
# trailing parameters a pattern may leave out (the AST holds the default).
EXCLUDED_OPS = tuple(op for op in OPS if not OPS[op].in_rules)
MULTI_OUTPUT_OPS = tuple(op for op in OPS if OPS[op].multi_output and OPS[op].in_rules)
OPTIONAL_PARAMS = {op: tuple(p.name for p in OPS[op].params if p.optional) for op in OPS}


def pattern_ops() -> list[str]:
    """Operators allowed in patterns."""
    return sorted(op for op in OPS if op not in EXCLUDED_OPS)


def param_names(op: str) -> tuple[str, ...]:
    return tuple(p.name for p in OPS[op].params)


def input_arity(op: str) -> tuple[int, int]:
    """Tensor inputs a pattern gives ``op``: the e-graph's arity where the table fixes
    one (binary concat), else the operator's range."""
    spec = OPS[op]
    if spec.egraph_inputs is not None:
        return spec.egraph_inputs, spec.egraph_inputs
    lo, hi = spec.inputs
    return lo, hi if hi is not None else lo


def signature(op: str) -> str:
    """``(conv2d STRIDES PADDING ACTIVATION T T [T])``: for error messages."""
    optional = OPTIONAL_PARAMS.get(op, ())
    words = [f"[{p.upper()}]" if p in optional else p.upper() for p in param_names(op)]
    lo, hi = input_arity(op)
    words += ["T"] * lo + ["[T]"] * (hi - lo)
    return "(" + " ".join([op] + words) + ")"


# What a literal of each parameter kind (ops.base.PARAM_KINDS) must be in a rule.
_LITERAL_FITS = {
    "int": lambda v: isinstance(v, int),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "symbol": lambda v: isinstance(v, str),
    "activation": lambda v: v in ACTIVATIONS,
    "dtype": lambda v: v in FLOAT_DTYPES,
    "ints": lambda v: isinstance(v, tuple),
    "dims": lambda v: isinstance(v, tuple),
    "padding": lambda v: v in ("SAME", "VALID") or isinstance(v, tuple) and len(v) == 4,
}
_LITERAL_WANTED = {"activation": f"one of {', '.join(ACTIVATIONS)}",
                   "dtype": f"one of {', '.join(FLOAT_DTYPES)}"}
_MISSING = {p.kind for op in OPS if OPS[op].in_rules for p in OPS[op].params} - set(_LITERAL_FITS)
if _MISSING:
    raise RuntimeError(f"rule literals of parameter kind(s) {sorted(_MISSING)} have no check")


# --- reader: text -> S-expressions with line numbers -------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>\s+) | (?P<comment>;[^\n]*) | (?P<open>[(\[]) | (?P<close>[)\]])
  | (?P<str>"(?:[^"\\]|\\.)*") | (?P<badstr>") | (?P<atom>[^\s()\[\];"]+)
""", re.VERBOSE)
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_VARNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_\-.]*")


@dataclass
class _Atom:
    kind: str  # var kw int float sym str
    value: Any
    line: int
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass
class _List:
    items: list
    line: int
    bracket: str  # "(" or "["

    def __str__(self) -> str:
        close = ")" if self.bracket == "(" else "]"
        text = self.bracket + " ".join(map(str, self.items)) + close
        return text if len(text) <= 60 else text[:57] + "..."

    def head(self) -> str | None:
        if self.bracket == "(" and self.items and isinstance(self.items[0], _Atom) \
                and self.items[0].kind == "sym":
            return self.items[0].value
        return None


def _read(text: str, filename: str) -> list:
    stack: list[_List] = []
    top: list = []
    line = 1
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        kind, tok = m.lastgroup, m.group()
        pos = m.end()
        here = line
        line += tok.count("\n")
        if kind in ("ws", "comment"):
            continue
        if kind == "badstr":
            raise RuleError(f"{filename}:{here}: unterminated string")
        if kind == "open":
            stack.append(_List([], here, tok))
            continue
        if kind == "close":
            if not stack:
                raise RuleError(f"{filename}:{here}: unexpected {tok!r} with nothing open")
            lst = stack.pop()
            want = ")" if lst.bracket == "(" else "]"
            if tok != want:
                raise RuleError(f"{filename}:{here}: {tok!r} closes the {lst.bracket!r} opened "
                                f"on line {lst.line} (expected {want!r})")
            (stack[-1].items if stack else top).append(lst)
            continue
        (stack[-1].items if stack else top).append(_atom(tok, kind, here, filename))
    if stack:
        lst = stack[-1]
        raise RuleError(f"{filename}:{lst.line}: {lst.bracket!r} opened here is never closed")
    return top


def _atom(tok: str, kind: str, line: int, filename: str) -> _Atom:
    if kind == "str":
        value = re.sub(r"\\(.)", r"\1", tok[1:-1], flags=re.S)
        return _Atom("str", value, line, tok)
    if tok.startswith("?"):
        if not _VARNAME.fullmatch(tok[1:]):
            raise RuleError(f"{filename}:{line}: bad variable name {tok!r}")
        return _Atom("var", tok[1:], line, tok)
    if tok.startswith(":") and len(tok) > 1:
        return _Atom("kw", tok, line, tok)
    if _INT.fullmatch(tok):
        return _Atom("int", int(tok), line, tok)
    if _FLOAT.fullmatch(tok):
        return _Atom("float", float(tok), line, tok)
    return _Atom("sym", tok, line, tok)


# --- parser: S-expressions -> AST --------------------------------------------------


class _RuleParser:
    """Parses one top-level form; tracks variable kinds and where they were bound."""

    def __init__(self, form: _List, filename: str):
        self.form = form
        self.filename = filename
        self.name: str | None = None
        self.kinds: dict[str, tuple[str, int]] = {}  # var -> (kind, first line)
        self.bound: set[str] = set()
        self.section = ":lhs"

    def error(self, node, msg: str) -> RuleError:
        line = node.line if node is not None else self.form.line
        who = f" rule {self.name!r}:" if self.name else ""
        return RuleError(f"{self.filename}:{line}:{who} {msg}")

    # -- top level --

    def parse(self) -> Rule:
        form = self.form
        head = form.head()
        if form.bracket != "(" or head not in ("rule", "multi"):
            raise self.error(form, f"expected (rule NAME ...) or (multi NAME ...), got {form}")
        multi = head == "multi"
        if len(form.items) < 2 or not isinstance(form.items[1], _Atom) \
                or form.items[1].kind not in ("sym", "int"):
            raise self.error(form, f"({head} ...) needs a name (a bare symbol) after {head!r}")
        self.name = str(form.items[1].value)
        sections: dict[str, Any] = {}
        rest = form.items[2:]
        i = 0
        while i < len(rest):
            kw = rest[i]
            if not (isinstance(kw, _Atom) and kw.kind == "kw"):
                raise self.error(kw, f"expected a keyword ({' '.join(KEYWORDS)}), got {kw}")
            if kw.value not in KEYWORDS:
                raise self.error(kw, f"unknown keyword {kw.value} (allowed: {' '.join(KEYWORDS)})")
            if kw.value in sections:
                raise self.error(kw, f"{kw.value} given twice")
            if i + 1 >= len(rest) or (isinstance(rest[i + 1], _Atom) and rest[i + 1].kind == "kw"):
                raise self.error(kw, f"{kw.value} has no value")
            sections[kw.value] = rest[i + 1]
            i += 2
        for required in (":lhs", ":rhs"):
            if required not in sections:
                raise self.error(form, f"missing {required}")

        self.section = ":lhs"
        lhs = self._sides(sections[":lhs"], multi)
        for p in lhs:
            for name, _ in walk_vars(p):
                self.bound.add(name)
        self.section = ":rhs"
        rhs = self._sides(sections[":rhs"], multi)
        self.section = ":if"
        guards = self._guards(sections[":if"]) if ":if" in sections else ()
        example = self._example(sections[":example"]) if ":example" in sections else {}
        doc = ""
        if ":doc" in sections:
            d = sections[":doc"]
            if not (isinstance(d, _Atom) and d.kind == "str"):
                raise self.error(d, ':doc takes a quoted string, e.g. :doc "why it holds"')
            doc = d.value
        proof = self._proof(sections[":proof"]) if ":proof" in sections else None
        return Rule(self.name, lhs, rhs, guards, example, doc, (self.filename, form.line), multi,
                    proof)

    def _proof(self, node) -> Proof:
        if not (isinstance(node, _List) and node.bracket == "(" and node.head() is None):
            raise self.error(node, f":proof takes a list of entries, e.g. ((status proved)), got {node}")
        fields: dict[str, Any] = {}
        for entry in node.items:
            key = entry.head() if isinstance(entry, _List) else None
            if key not in _PROOF_KEYS:
                raise self.error(entry, f"unknown :proof entry {entry} (allowed: "
                                        f"{' '.join(_PROOF_KEYS)})")
            if key in fields:
                raise self.error(entry, f":proof entry {key} given twice")
            args = entry.items[1:]
            if key == "axioms":
                if not all(isinstance(a, _Atom) and a.kind in ("sym", "str") for a in args):
                    raise self.error(entry, f"(axioms ...) takes axiom names, got {entry}")
                fields[key] = tuple(a.value for a in args)
                continue
            if len(args) != 1 or not isinstance(args[0], _Atom):
                raise self.error(entry, f"({key} ...) takes one value, got {entry}")
            a = args[0]
            if key == "status" and (a.kind != "sym" or a.value not in PROOF_STATUSES):
                raise self.error(a, f"proof status must be one of {' '.join(PROOF_STATUSES)}, "
                                    f"got {a}")
            if key == "seconds" and (a.kind not in ("int", "float") or a.value < 0):
                raise self.error(a, f"(seconds ...) takes a non-negative number, got {a}")
            if key in ("found-by", "reason") and a.kind not in ("sym", "str", "int"):
                raise self.error(a, f"({key} ...) takes a symbol or a quoted string, got {a}")
            fields[key] = float(a.value) if key == "seconds" else a.value
        if "status" not in fields:
            raise self.error(node, ":proof needs a (status ...) entry")
        return Proof(fields["status"], str(fields.get("found-by", "")), fields.get("axioms", ()),
                     fields.get("seconds"), str(fields.get("reason", "")))

    def _sides(self, node, multi: bool) -> tuple:
        sec = self.section
        if multi:
            if not (isinstance(node, _List) and node.bracket == "(" and node.head() is None):
                raise self.error(node, f"multi rule {sec} must be a list of exactly 2 patterns, "
                                       f"e.g. ((matmul ...) (matmul ...)), got {node}")
            if len(node.items) != 2:
                raise self.error(node, f"multi rule {sec} must have exactly 2 patterns, "
                                       f"got {len(node.items)}")
            pats = tuple(self._tensor(n) for n in node.items)
        else:
            pats = (self._tensor(node),)
        if sec == ":lhs":
            for n, p in zip(node.items if multi else [node], pats):
                if isinstance(p, Var):
                    raise self.error(n, f"the :lhs root must be an operator pattern, not the "
                                        f"bare variable {p}")
        return pats

    # -- variables --

    def _var(self, atom: _Atom, kind: str) -> Var:
        name = atom.value
        prev = self.kinds.get(name)
        if prev is not None and prev[0] != kind:
            raise self.error(atom, f"?{name} is used both as a {prev[0]} (line {prev[1]}) and "
                                   f"as a {kind} variable")
        if prev is None:
            self.kinds[name] = (kind, atom.line)
        if self.section != ":lhs" and name not in self.bound:
            raise self.error(atom, f"?{name} in {self.section} is not bound by :lhs")
        return Var(name)

    # -- patterns --

    def _tensor(self, node, allow_multi: bool = False):
        if isinstance(node, _Atom):
            if node.kind == "var":
                return self._var(node, "tensor")
            raise self.error(node, f"expected a tensor pattern (?var or (OP ...)), got {node}")
        head = node.head()
        if head is None:
            raise self.error(node, f"expected a tensor pattern (?var or (OP ...)), got {node}")
        args = node.items[1:]
        if head == "proj":
            return self._proj(node, args)
        if head in PARAM_FNS:
            raise self.error(node, f"parameter expression ({head} ...) used where a tensor is "
                                   f"expected")
        if head in EXCLUDED_OPS:
            hint = ("leaves are written as ?variables" if head != "opaque"
                    else "opaque operators are barriers to rewriting")
            raise self.error(node, f"operator {head!r} cannot appear in a pattern ({hint})")
        if head not in OPS:
            raise self.error(node, f"unknown operator {head!r}; known: {', '.join(pattern_ops())}")
        app = self._app(node, head, args)
        if head in MULTI_OUTPUT_OPS and not allow_multi:
            raise self.error(node, f"{head} has several outputs; select one with "
                                   f"(proj I ({head} ...))")
        return app

    def _proj(self, node, args) -> Proj:
        if len(args) != 2:
            raise self.error(node, f"(proj I PATTERN) takes 2 arguments, got {len(args)}")
        idx, inner = args
        if not (isinstance(idx, _Atom) and idx.kind == "int" and idx.value >= 0):
            raise self.error(idx, f"proj index must be a non-negative integer, got {idx}")
        pat = self._tensor(inner, allow_multi=True)
        if not (isinstance(pat, App) and pat.op in MULTI_OUTPUT_OPS):
            raise self.error(inner, f"proj selects an output of a multi-output operator "
                                    f"({', '.join(MULTI_OUTPUT_OPS)}), got {inner}")
        if pat.op == "split":
            sizes = pat.param_dict()["sizes"]
            if isinstance(sizes, Lit) and idx.value >= len(sizes.value):
                raise self.error(idx, f"proj index {idx.value} out of range: split has "
                                      f"{len(sizes.value)} outputs")
        return Proj(idx.value, pat)

    def _app(self, node, op: str, args) -> App:
        names = param_names(op)
        optional = OPTIONAL_PARAMS.get(op, ())
        lo, hi = input_arity(op)
        n = len(args)
        fits = [k for k in range(len(names) - len(optional), len(names) + 1) if lo <= n - k <= hi]
        if not fits:
            counts = sorted({k + m for k in range(len(names) - len(optional), len(names) + 1)
                             for m in range(lo, hi + 1)})
            want = " or ".join(map(str, counts))
            raise self.error(node, f"{op} takes {want} arguments {signature(op)}, got {n}")
        k = max(fits)
        params = []
        for name, a in zip(names, args[:k]):
            params.append(self._op_param(a, op, name))
        for name in names[k:]:
            params.append(Lit(OPS[op].defaults[name]))
        inputs = tuple(self._tensor(a) for a in args[k:])
        return App(op, tuple(params), inputs)

    def _op_param(self, node, op: str, name: str):
        if self.section == ":lhs" and isinstance(node, _List) and node.head() in PARAM_FNS:
            raise self.error(node, f"parameter expressions are not allowed in :lhs (parameter "
                                   f"{name!r} of {op}); bind a ?variable and add an :if guard")
        expr = self._param(node)
        if isinstance(expr, Lit):
            self._check_literal(node, op, name, expr.value)
        return expr

    def _check_literal(self, node, op: str, name: str, v) -> None:
        kind = OPS[op].param(name).kind
        fits = _LITERAL_FITS[kind](v)
        bad = None if fits else _LITERAL_WANTED.get(kind, PARAM_KINDS[kind])
        if bad:
            raise self.error(node, f"parameter {name!r} of {op} must be {bad}, got "
                                   f"{_format_value(v)}")

    # -- parameters --

    def _param(self, node):
        if isinstance(node, _Atom):
            if node.kind == "var":
                return self._var(node, "param")
            if node.kind in ("int", "float", "sym", "str"):
                return Lit(node.value)
            raise self.error(node, f"expected a parameter, got {node}")
        if node.bracket == "[":
            return Lit(self._int_vector(node))
        head = node.head()
        if head not in PARAM_FNS:
            what = f"operator {head!r}" if head in OPS or head == "proj" else f"{node}"
            raise self.error(node, f"expected a parameter (?var, literal, [ints] or one of "
                                   f"{' '.join(PARAM_FNS)}), got {what}")
        args = node.items[1:]
        lo, hi = PARAM_FNS[head]
        if len(args) < lo or (hi is not None and len(args) > hi):
            want = str(lo) if lo == hi else f"at least {lo}"
            raise self.error(node, f"({head} ...) takes {want} argument(s), got {len(args)}")
        out = []
        fn = semantics.PARAM_FNS[head]
        for i, a in enumerate(args):
            kind = fn.arg_kind(i)
            if kind == semantics.TENSOR:
                if not (isinstance(a, _Atom) and a.kind == "var"):
                    raise self.error(a, f"({head} T ...) takes a tensor ?variable, got {a}")
                out.append(self._var(a, "tensor"))
                continue
            e = self._param(a)
            if isinstance(e, ParamOp) and not semantics.accepts(kind, semantics.result_kind(e.fn)):
                raise self.error(a, f"argument {i + 1} of ({head} ...) must be "
                                    f"{'an int vector' if kind == semantics.VEC else 'an integer'}, "
                                    f"got {a}")
            if isinstance(e, Lit):
                v = e.value
                if kind == semantics.VEC and not isinstance(v, tuple):
                    raise self.error(a, f"({head} V ...) takes an int vector, got {a}")
                if kind != semantics.VEC and not (isinstance(v, int) and not isinstance(v, bool)):
                    raise self.error(a, f"argument {i + 1} of ({head} ...) must be an integer, "
                                        f"got {a}")
                if kind == semantics.INDEX and v < 0:
                    raise self.error(a, f"argument {i + 1} of ({head} ...) is an axis or a "
                                        f"position, so it counts from 0, got {a}")
            out.append(e)
        return ParamOp(head, tuple(out))

    def _int_vector(self, node: _List) -> tuple:
        vals = []
        for a in node.items:
            if not (isinstance(a, _Atom) and a.kind == "int"):
                raise self.error(a if isinstance(a, _Atom) else node,
                                 f"vector literals hold integers only, got {a} (use (vec ...) "
                                 f"for computed vectors)")
            vals.append(a.value)
        return tuple(vals)

    # -- guards --

    def _guards(self, node) -> tuple:
        if not (isinstance(node, _List) and node.bracket == "(" and node.head() is None):
            raise self.error(node, f":if takes a list of guards, e.g. :if ((= ?a ?b)), got {node}")
        guards = []
        for g in node.items:
            head = g.head() if isinstance(g, _List) else None
            if head not in GUARD_KINDS:
                raise self.error(g, f"unknown guard {g} (allowed: {' '.join(GUARD_KINDS)})")
            args = g.items[1:]
            if head in TENSOR_GUARDS:
                if len(args) != TENSOR_GUARDS[head]:
                    raise self.error(g, f"({head} ...) takes {TENSOR_GUARDS[head]} tensor "
                                        f"variable(s), got {len(args)}")
                vs = []
                for a in args:
                    if not (isinstance(a, _Atom) and a.kind == "var"):
                        raise self.error(a, f"({head} ...) takes tensor ?variables, got {a}")
                    vs.append(self._var(a, "tensor"))
                guards.append(Guard(head, tuple(vs)))
            else:
                if len(args) != 2:
                    raise self.error(g, f"({head} A B) takes 2 arguments, got {len(args)}")
                exprs = tuple(self._param(a) for a in args)
                kinds = [_static_kind(e) for e in exprs]
                for a, k, want in zip(args, kinds, semantics.GUARDS[head].args):
                    if k is not None and not semantics.accepts(want, k):
                        raise self.error(a, f"({head} A B) compares numbers, got {a} (a {k})")
                if None not in kinds and kinds[0] != kinds[1]:
                    raise self.error(g, f"({head} A B) compares values of one kind, got a "
                                        f"{kinds[0]} and a {kinds[1]}")
                guards.append(Guard(head, exprs))
        return tuple(guards)

    # -- example --

    def _example(self, node) -> dict:
        if not (isinstance(node, _List) and node.bracket == "(" and node.head() is None):
            raise self.error(node, f":example takes a list of bindings, e.g. ((?x [2 3]) "
                                   f"(?s [1 1])), got {node}")
        example: dict[str, Any] = {}
        for b in node.items:
            if not (isinstance(b, _List) and b.bracket == "(" and len(b.items) == 2
                    and isinstance(b.items[0], _Atom) and b.items[0].kind == "var"):
                raise self.error(b, f"an :example binding is (?var VALUE), got {b}")
            var, val = b.items
            name = var.value
            if name not in self.bound:
                raise self.error(var, f":example binds ?{name}, which :lhs does not use")
            if name in example:
                raise self.error(var, f":example binds ?{name} twice")
            kind = self.kinds[name][0]
            if kind == "tensor":
                if not (isinstance(val, _List) and val.bracket == "["):
                    raise self.error(val, f"tensor ?{name} needs a shape such as [2 3], got {val}")
                shape = self._int_vector(val)
                if any(d < 0 for d in shape):
                    raise self.error(val, f"shape of ?{name} has a negative dimension")
                example[name] = shape
            else:
                if isinstance(val, _List) and val.bracket == "(":
                    raise self.error(val, f"example value of ?{name} must be a literal, got {val}")
                example[name] = self._param(val).value
        missing = [n for n in self.kinds if n in self.bound and n not in example]
        if missing:
            raise self.error(node, ":example does not bind " + ", ".join("?" + m for m in missing))
        return example


# --- entry points ------------------------------------------------------------------


def parse_rules(text: str, filename: str = "<string>") -> list[Rule]:
    """Parse a rule file's text. Rule names must be unique within it."""
    rules: list[Rule] = []
    seen: dict[str, Rule] = {}
    for form in _read(text, filename):
        if not isinstance(form, _List):
            raise RuleError(f"{filename}:{form.line}: expected (rule NAME ...) or "
                            f"(multi NAME ...) at top level, got {form}")
        rule = _RuleParser(form, filename).parse()
        _check_unique(rule, seen)
        rules.append(rule)
    return rules


def _check_unique(rule: Rule, seen: dict[str, Rule]) -> None:
    prev = seen.get(rule.name)
    if prev is not None:
        raise RuleError(f"{rule.where}: duplicate rule name (first defined at "
                        f"{prev.source[0]}:{prev.source[1]})")
    seen[rule.name] = rule


def load_rule_file(path) -> list[Rule]:
    path = Path(path)
    return parse_rules(_read_text(path), str(path))


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


def _read_text(path, data: bytes | None = None) -> str:
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
            return ("proj", node.index, walk(node.pattern))
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
    (:mod:`taso_egg.cache`) under a key of its bytes, its path and the reader's own
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
            _check_unique(rule, seen)
        if orientations == "given":
            rules += [r for r in _parsed_file(path, data) if include_unproved or r.proved]
            continue
        pairs = [(r, k) for r, k in _oriented_file(path, data, orientations) if include_unproved or r.proved]
        rules += [r for r, _ in _dedupe(pairs, same)]
    return rules


_PARSED: dict[str, tuple[Rule, ...]] = {}  # cache key -> rules, this process's


def _parsed_file(path: str, data: bytes) -> tuple[Rule, ...]:
    """The rules of a rule file's bytes, parsed once: parsing a thousand rules takes a
    second and every command loads the corpus. Rules are immutable, so the tuple is
    shared."""
    k = cache.key("rules", sys.version, _reader_digest(), path, data)
    rules = _PARSED.get(k)
    if rules is None:
        rules = cache.load("rules", k)
        if not (isinstance(rules, tuple) and all(type(r) is Rule for r in rules)):
            rules = tuple(parse_rules(_read_text(path, data), path))
            cache.store("rules", k, rules)
        if len(_PARSED) >= 16:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[k] = rules
    return rules


def _oriented_file(path: str, data: bytes, orientations: str) -> tuple:
    """:func:`_orient` of a rule file's rules, cached as its parse is (telling a
    thousand rules apart from their reverses takes half a second)."""
    k = cache.key("rules-" + orientations, sys.version, _reader_digest(), path, data)
    pairs = _PARSED.get(k)
    if pairs is None:
        pairs = cache.load("rules", k)
        if not (isinstance(pairs, tuple) and all(type(r) is Rule for r, _ in pairs)):
            pairs = _orient(_parsed_file(path, data), orientations)
            cache.store("rules", k, pairs)
        if len(_PARSED) >= 16:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[k] = pairs
    return pairs


@functools.cache
def _reader_digest() -> str:
    """What parsing depends on besides the text: this module, the vocabulary
    (``semantics.py``) and the operator table (``taso_egg/ops``), by their source."""
    import taso_egg.ops

    return cache.source_digest([Path(__file__), Path(semantics.__file__),
                                *Path(taso_egg.ops.__file__).parent.glob("*.py")])


def _form_spans(text: str, filename: str) -> list[tuple[int, int]]:
    """(start, end) offsets of every top-level form of a rule file's text."""
    spans, depth, start, pos = [], 0, 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        kind = m.lastgroup
        if kind == "badstr":
            raise RuleError(f"{filename}: unterminated string")
        if kind == "open":
            if depth == 0:
                start = m.start()
            depth += 1
        elif kind == "close":
            depth -= 1
            if depth == 0:
                spans.append((start, m.end()))
        pos = m.end()
    return spans


def with_proof_records(text: str, proofs: dict, filename: str = "<string>") -> str:
    """``text`` with the ``:proof`` record of each rule named in ``proofs`` (name ->
    Proof) replaced or added; comments and layout elsewhere are kept. The result is
    parsed back, and must hold the same rules with the new records (RuleError if not)."""
    before = parse_rules(text, filename)
    out, last = [], 0
    for (start, end), rule in zip(_form_spans(text, filename), before):
        out.append(text[last:start])
        form = text[start:end]
        if rule.name in proofs:
            form = _drop_proof(form, filename) + f"\n  :proof {proofs[rule.name]})"
        out.append(form)
        last = end
    out.append(text[last:])
    new_text = "".join(out)
    after = parse_rules(new_text, filename)
    expected = [_replace_proof(r, proofs.get(r.name, r.proof)) for r in before]
    if [_replace_proof(r, r.proof) for r in after] != expected:
        raise RuleError(f"{filename}: rewriting the proof records changed the rules (a bug)")
    return new_text


def _drop_proof(form: str, filename: str) -> str:
    """The form without its ``:proof`` section and without its closing parenthesis."""
    depth, pos, cut = 0, 0, None
    body_end = len(form) - 1
    while pos < len(form):
        m = _TOKEN.match(form, pos)
        kind = m.lastgroup
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth -= 1
            if depth == 0:
                body_end = m.start()
        elif kind == "atom" and depth == 1 and m.group() == ":proof":
            cut = m.start()
        elif kind == "atom" and depth == 1 and m.group().startswith(":") and cut is not None:
            raise RuleError(f"{filename}: :proof must be the last section of a rule to be "
                            f"rewritten")
        pos = m.end()
    return form[:cut if cut is not None else body_end].rstrip()


def _replace_proof(rule: Rule, proof) -> Rule:
    return Rule(rule.name, rule.lhs, rule.rhs, rule.guards, rule.example, rule.doc, ("", 0),
                rule.multi, proof)


__all__ = [
    "Var", "Lit", "App", "Proj", "ParamOp", "Guard", "Rule", "Proof", "PROOF_STATUSES",
    "Pattern", "ParamExpr",
    "PARAM_FNS", "COMPARISONS", "GUARD_KINDS", "MULTI_OUTPUT_OPS", "OPTIONAL_PARAMS",
    "parse_rules", "load_rule_file", "load_user_rules", "blame_user_rules", "with_proof_records", "load_corpus", "corpus_files", "walk_vars", "guard_vars",
    "AXIOM_FILES", "STUDY_FILES", "GENERATED_CONSTANTS", "uses_generated_constant",
    "param_names", "pattern_ops", "signature", "ORIENTATIONS", "reverse", "with_orientations",
]
