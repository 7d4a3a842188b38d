"""The rule language's surface syntax: a tokenizer and a parser from the text of a
``rules/*.rules`` file to the AST of :mod:`.ast`.

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
                                anywhere else is an error. ``I`` is an integer or a
                                parameter variable (``(proj ?i (split ...))``: whichever
                                part is read, the rule stated once for every part).

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
    every entry but ``status`` optional). :func:`.corpus.load_corpus` loads only proved rules
    unless asked for the others.

Variable names are stored without the ``?`` (``Var("x")`` for ``?x``; example keys are
``"x"``). ``App.params`` always holds every parameter of the operator (omitted optional
ones are filled with their default), so back ends never deal with omissions.

Every error is a :class:`~taso_egg.errors.RuleError` whose message starts with
``FILE:LINE: rule NAME:``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from taso_egg.errors import RuleError
from taso_egg.ops import OPS, SPLIT
from taso_egg.ops.base import PARAM_KINDS

from . import semantics
from .ast import App, Guard, Lit, ParamOp, Proj, Proof, PROOF_STATUSES, Rule, Var, format_value, walk_vars
from .vocabulary import (EXCLUDED_OPS, GUARD_KINDS, LITERAL_FITS, LITERAL_WANTED, MULTI_OUTPUT_OPS,
                         OPTIONAL_PARAMS, PARAM_FNS, TENSOR_GUARDS, input_arity, param_names, pattern_ops,
                         signature)

KEYWORDS = (":lhs", ":rhs", ":if", ":example", ":doc", ":proof")
_PROOF_KEYS = ("status", "found-by", "axioms", "seconds", "reason")


# --- reader: text -> S-expressions with line numbers -------------------------------

TOKEN = re.compile(r"""
    (?P<ws>\s+) | (?P<comment>;[^\n]*) | (?P<open>[(\[]) | (?P<close>[)\]])
  | (?P<str>"(?:[^"\\]|\\.)*") | (?P<badstr>") | (?P<atom>[^\s()\[\];"]+)
""", re.VERBOSE)
_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?")
_VARNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


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
        m = TOKEN.match(text, pos)
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


def _static_kind(e) -> str | None:
    """The value kind (rules/semantics.py's value_kind) of a parameter expression
    where it is known without the operators its variables bind to; None for a variable."""
    if isinstance(e, ParamOp):
        return semantics.result_kind(e.fn)
    if isinstance(e, Lit):
        return semantics.value_kind(e.value)
    return None


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
        if isinstance(idx, _Atom) and idx.kind == "var":
            index = self._var(idx, "param")
        elif isinstance(idx, _Atom) and idx.kind == "int" and idx.value >= 0:
            index = idx.value
        else:
            raise self.error(idx, f"proj index must be a non-negative integer or a ?variable, got {idx}")
        pat = self._tensor(inner, allow_multi=True)
        if not (isinstance(pat, App) and pat.op in MULTI_OUTPUT_OPS):
            raise self.error(inner, f"proj selects an output of a multi-output operator "
                                    f"({', '.join(MULTI_OUTPUT_OPS)}), got {inner}")
        if pat.op == SPLIT.name:
            sizes = pat.param_dict()["sizes"]
            if isinstance(sizes, Lit) and isinstance(index, int) and index >= len(sizes.value):
                raise self.error(idx, f"proj index {index} out of range: split has "
                                      f"{len(sizes.value)} outputs")
        return Proj(index, pat)

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
        fits = LITERAL_FITS[kind](v)
        bad = None if fits else LITERAL_WANTED.get(kind, PARAM_KINDS[kind])
        if bad:
            raise self.error(node, f"parameter {name!r} of {op} must be {bad}, got "
                                   f"{format_value(v)}")

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
        check_unique_name(rule, seen)
        rules.append(rule)
    return rules


def check_unique_name(rule: Rule, seen: dict[str, Rule]) -> None:
    prev = seen.get(rule.name)
    if prev is not None:
        raise RuleError(f"{rule.where}: duplicate rule name (first defined at "
                        f"{prev.source[0]}:{prev.source[1]})")
    seen[rule.name] = rule


__all__ = ["KEYWORDS", "TOKEN", "parse_rules", "check_unique_name"]
