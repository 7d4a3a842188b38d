"""The rule language's abstract syntax: what :mod:`.syntax` parses a ``rules/*.rules``
file into, and what every back end (egglog compiler, graph pattern matcher, Z3
verifier, numeric checker) consumes; each node prints back in the surface syntax.

Variable names are stored without the ``?`` (``Var("x")`` for ``?x``; example keys are
``"x"``). ``App.params`` always holds every parameter of the operator (omitted optional
ones are filled with their default), so back ends never deal with omissions.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Iterator, Union

from . import semantics
from .vocabulary import TENSOR_GUARDS, param_names

# A string literal prints bare when it reads back as a symbol (RELU, SAME).
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_\-.]*")


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
        return format_value(self.value)


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
    """Output ``index`` of a multi-output operator application (``split``): an int, or
    a parameter :class:`Var` for any output."""

    index: Union[int, Var]
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
            parts.append(f"(found-by {format_value(self.found_by)})")
        if self.axioms:
            parts.append("(axioms " + " ".join(format_value(a) for a in self.axioms) + ")")
        if self.seconds is not None:
            parts.append(f"(seconds {format_value(float(self.seconds))})")
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

    @property
    def moves_a_part_up(self) -> bool:
        """A part of a split of an operator's result is rewritten to the operator on
        that part of its input (the right side reads the same part, below the operator
        at its root): the step of demand-driven pruning, which only ever moves a select
        one operator toward the inputs, so running such rules to a fixpoint adds a few
        e-nodes per operator the select passes."""
        if self.multi:
            return False
        lhs, rhs = self.lhs[0], self.rhs[0]
        if not (isinstance(lhs, Proj) and lhs.pattern.op == "split" and isinstance(lhs.pattern.inputs[0], App)
                and isinstance(rhs, App) and rhs.op != "split"):
            return False
        todo = list(rhs.inputs)
        while todo:
            p = todo.pop()
            if isinstance(p, Proj):
                if p.index == lhs.index and p.pattern.op == "split":
                    return True
                todo.append(p.pattern)
            elif isinstance(p, App):
                todo.extend(p.inputs)
        return False

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
                f"(?{k} {format_value(v)})" for k, v in self.example.items()) + ")")
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
        yield from _walk(node.index, "param")
        yield from _walk(node.pattern, "tensor")
    elif isinstance(node, ParamOp):
        for i, a in enumerate(node.args):
            yield from _walk(a, "tensor" if semantics.PARAM_FNS[node.fn].arg_kind(i) == semantics.TENSOR
                             else "param")


def guard_vars(g: Guard) -> Iterator[tuple[str, str]]:
    kind = "tensor" if g.kind in TENSOR_GUARDS else "param"
    for a in g.args:
        yield from _walk(a, kind)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def format_value(v) -> str:
    if isinstance(v, tuple):
        return "[" + " ".join(format_value(x) for x in v) + "]"
    if isinstance(v, str):
        return v if _SYMBOL.fullmatch(v) else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, float):
        text = repr(v)
        return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"
    return str(v)


__all__ = ["Var", "Lit", "App", "Proj", "ParamOp", "Guard", "Rule", "Proof", "PROOF_STATUSES",
           "Pattern", "ParamExpr", "operators", "walk_vars", "guard_vars", "format_value"]
