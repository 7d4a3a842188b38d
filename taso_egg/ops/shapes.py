"""Shape rules as data: each operator states its output shape once, as cases over
small expressions, and three back ends read the same cases: the e-graph's shape
analysis (compiled to egglog rules by ``egraph/language.py``), the Z3 verifier's typing
facts (``rules/prove/shape_facts.py``) and :func:`evaluate` here, which a table-driven
test holds against each operator's Python ``infer``.

A :class:`Case` gives the output shape ``out`` when its conditions hold. Conditions come
in two kinds, because the back ends need different things from them:

- ``when``: the case applies. Every back end needs these; the Z3 facts are
  ``when -> shape(out) = expression``, so ``when`` must imply the expression for any
  input Python's ``infer`` accepts (NumPy broadcasting of unequal ranks included);
- ``requires``: the term is valid only then (``infer`` rejects it otherwise). The
  e-graph needs them to refuse invalid terms; Z3 reasons about well-typed terms only,
  so it leaves them out.

Expressions are built with :class:`In` (an input's shape, a vector), :class:`P` (a
parameter), ints, the arithmetic operators ``+ - * // %``, indexing, and the helpers
below. Every value is an int or a vector of ints; parameters of kind ``padding`` are
read only through :func:`pad_same`, :func:`pad_explicit` and :func:`pad`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

# Shapes are modelled up to this rank (broadcast and transpose cases are unrolled).
MAX_RANK = 6


@dataclass(frozen=True)
class Expr:
    def __add__(self, other):
        return Fn("+", (self, lift(other)))

    def __radd__(self, other):
        return Fn("+", (lift(other), self))

    def __sub__(self, other):
        return Fn("-", (self, lift(other)))

    def __rsub__(self, other):
        return Fn("-", (lift(other), self))

    def __mul__(self, other):
        return Fn("*", (self, lift(other)))

    def __floordiv__(self, other):
        return Fn("/", (self, lift(other)))

    def __mod__(self, other):
        return Fn("%", (self, lift(other)))

    def __getitem__(self, index):
        return Fn("get", (self, lift(index)))

    def set(self, index, value) -> Expr:
        """This vector with element ``index`` replaced by ``value``."""
        return Fn("set", (self, lift(index), lift(value)))

    def pop(self) -> Expr:
        """This vector without its last element."""
        return Fn("pop", (self,))

    def remove(self, index) -> Expr:
        """This vector without element ``index``."""
        return Fn("remove", (self, lift(index)))


@dataclass(frozen=True)
class In(Expr):
    """The shape of tensor input ``index``."""
    index: int


@dataclass(frozen=True)
class P(Expr):
    """The operator parameter ``name``."""
    name: str


@dataclass(frozen=True)
class Num(Expr):
    value: int


@dataclass(frozen=True)
class OutIndex(Expr):
    """Which output of a multi-output operator the case describes."""


@dataclass(frozen=True)
class Fn(Expr):
    fn: str
    args: tuple


@dataclass(frozen=True)
class Cond:
    kind: str   # a comparison (= != < <= > >=), "bcast", "pad-same" or "pad-explicit"
    args: tuple


@dataclass(frozen=True)
class Case:
    out: Expr
    when: tuple[Cond, ...] = ()
    requires: tuple[Cond, ...] = ()


def lift(v) -> Expr:
    if isinstance(v, Expr):
        return v
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"shape expressions take ints, got {v!r}")
    return Num(v)


def rank(v) -> Expr:
    return Fn("len", (lift(v),))


def vec(*items) -> Expr:
    return Fn("vec", tuple(lift(i) for i in items))


def maximum(a, b) -> Expr:
    return Fn("max", (lift(a), lift(b)))


def pad(padding: P, index: int) -> Expr:
    """Explicit padding amount ``index`` (top, left, bottom, right); VALID reads 0."""
    return Fn("pad", (padding, Num(index)))


def _comparison(kind: str):
    def compare(a, b) -> Cond:
        return Cond(kind, (lift(a), lift(b)))

    compare.__name__ = compare.__qualname__ = {"=": "eq", "<": "lt", ">": "gt", ">=": "ge"}[kind]
    return compare


eq, lt, gt, ge = (_comparison(k) for k in ("=", "<", ">", ">="))


def broadcastable(a, b) -> Cond:
    """Two dimensions NumPy broadcasts: equal, or one of them 1."""
    return Cond("bcast", (lift(a), lift(b)))


def pad_same(padding: P) -> Cond:
    return Cond("pad-same", (padding,))


def pad_explicit(padding: P) -> Cond:
    """Explicit pads, VALID included (four zeros)."""
    return Cond("pad-explicit", (padding,))


def same_as(index: int = 0) -> tuple[Case, ...]:
    """The output has input ``index``'s shape."""
    return (Case(In(index)),)


def per_rank(case: Callable[[int], Case], ranks: Sequence[int] = range(MAX_RANK + 1)) -> tuple[Case, ...]:
    """One case per rank: what the e-graph needs for rank-generic rules it cannot
    state with a loop (broadcasting, transposition)."""
    return tuple(case(r) for r in ranks)


# --- the Python back end ----------------------------------------------------------------

class _NoCase(Exception):
    """A case's condition is false or cannot be evaluated (an index out of range)."""


def evaluate(cases: Sequence[Case], params: Mapping[str, Any], shapes: Sequence[tuple],
             output: int = 0) -> tuple | None:
    """The output shape ``cases`` give for ``params`` and input ``shapes`` (output
    ``output`` of a multi-output operator); None when no case holds. ValueError when
    two cases hold with different shapes (the e-graph would refuse the merge)."""
    found = None
    for case in cases:
        env = _Env(params, shapes, output)
        try:
            if not all(env.holds(c) for c in case.when + case.requires):
                continue
            shape = env.value(case.out)
        except _NoCase:
            continue
        if not isinstance(shape, tuple):
            raise ValueError(f"a shape case gives {shape!r}, not a vector")
        if found is not None and found != shape:
            raise ValueError(f"two shape cases hold with different shapes {found} and {shape}")
        found = shape
    return found


def _trunc_div(a: int, b: int) -> int:
    # egglog's i64 division and remainder truncate towards zero, as Rust's do
    if b == 0:
        raise _NoCase
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


class _Env:
    def __init__(self, params, shapes, output):
        self.params, self.shapes, self.output = params, shapes, output

    def value(self, e):
        if isinstance(e, Num):
            return e.value
        if isinstance(e, In):
            if e.index >= len(self.shapes):
                raise _NoCase
            return tuple(self.shapes[e.index])
        if isinstance(e, P):
            return self.params[e.name]
        if isinstance(e, OutIndex):
            return self.output
        args = [self.value(a) for a in e.args] if e.fn != "pad" else None
        fn = e.fn
        if fn == "+":
            return args[0] + args[1]
        if fn == "-":
            return args[0] - args[1]
        if fn == "*":
            return args[0] * args[1]
        if fn == "/":
            return _trunc_div(args[0], args[1])
        if fn == "%":
            return args[0] - args[1] * _trunc_div(args[0], args[1])
        if fn == "max":
            return max(args)
        if fn == "len":
            return len(args[0])
        if fn == "vec":
            return tuple(args)
        if fn == "get":
            v, i = args
            if not 0 <= i < len(v):
                raise _NoCase
            return v[i]
        if fn == "set":
            v, i, x = args
            if not 0 <= i < len(v):
                raise _NoCase
            return v[:i] + (x,) + v[i + 1:]
        if fn == "pop":
            if not args[0]:
                raise _NoCase
            return args[0][:-1]
        if fn == "remove":
            v, i = args
            if not 0 <= i < len(v):
                raise _NoCase
            return v[:i] + v[i + 1:]
        if fn == "pad":
            padding = self.value(e.args[0])
            pads = (0, 0, 0, 0) if padding == "VALID" else padding
            if not isinstance(pads, tuple) or len(pads) != 4:
                raise _NoCase
            return pads[e.args[1].value]
        raise ValueError(f"unknown shape function {fn!r}")

    def holds(self, c: Cond) -> bool:
        if c.kind == "pad-same":
            return self.value(c.args[0]) == "SAME"
        if c.kind == "pad-explicit":
            v = self.value(c.args[0])
            return v == "VALID" or (isinstance(v, tuple) and len(v) == 4)
        a, b = (self.value(x) for x in c.args)
        if c.kind == "bcast":
            return a == b or a == 1 or b == 1
        return _COMPARE[c.kind](a, b)


_COMPARE = {"=": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}
