"""What the rule language's guards and parameter functions mean, stated once.

Every parameter function (``(dim T I)``, ``(vec A ...)``, ...) and every guard kind
(``(= A B)``, ``(weight T)``, ...) is one entry here: its arity, the kinds of its
arguments, its meaning in words, and a plain-Python evaluator that is the reference
meaning. ``rules/vocabulary.py`` reads its vocabulary (names, arities, which arguments are
tensor variables, which literals are allowed) from these tables, and each back end
declares its own translation of every entry through :func:`backend`, which raises
RuleError at import time when a back end lacks an entry or names one the language does
not have (so a new function cannot be added to the language and be silently mistranslated
or ignored by one of them), in the way tinygrad's Z3 table is its Python table plus a few
entries:

========================  =============================================================
back end                  translation
========================  =============================================================
Python (this module)      the evaluators below
search matcher            the evaluators; ``weight``/``before`` over the graph's
                          :func:`weight_ranges` (``taso_egg/search/matcher.py``)
numeric checker           the evaluators; ``weight`` and ``before`` hold: it builds each
                          ``(weight ?v)`` variable as a weight leaf (``rules/instantiate.py``)
egglog compiler           query facts over the ``shape``, ``wlo`` and ``whi`` analyses
                          (``egraph/rule_compiler.py``)
Z3 verifier               Z3 terms; ``weight``/``before`` ignored
                          (``rules/prove/encode.py``)
========================  =============================================================

Definedness. A function is undefined on some arguments (an axis out of range, a
vector where a number is wanted, a division by zero); the Python evaluators raise
:class:`Undefined` there, and a guard whose arguments are undefined does not hold. The
egglog translation has the same meaning (egglog's primitives fail to match, and
``/`` adds its own conditions as facts). The Z3 verifier does not state definedness:
it reads dimensions past the rank as 0 and leaves negative ones unconstrained. It
uses guards only as hypotheses of a proof, and dropping a definedness condition
only weakens a hypothesis, so a proof stays sound; but on arguments where a function
is undefined a Z3 guard can hold where the Python one does not.

Scheduling guards. ``weight`` and ``before`` say where a rule is *applied*, not what
makes it sound (every rule that has them is sound without them): the Z3 verifier
ignores them and the numeric checker takes them as holding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from taso_egg.errors import RuleError
from taso_egg.ops import OPAQUE, WEIGHT


class Undefined(Exception):
    """A parameter function or guard has no value on these arguments."""


# --- argument kinds ----------------------------------------------------------------

TENSOR = "tensor"  # a tensor ?variable (in the surface syntax); evaluators get its shape
INT = "int"        # an integer
INDEX = "index"    # a non-negative integer: an axis or a position (literals must be >= 0)
VEC = "vec"        # a vector of integers
NUMBER = "number"  # an integer or a float
VALUE = "value"    # any parameter value: an integer, a float, a symbol or an int vector


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise Undefined(f"{what} must be an integer, got {v!r}")
    return v


def _vec(v, what: str) -> tuple:
    if not isinstance(v, tuple) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise Undefined(f"{what} must be an int vector, got {v!r}")
    return v


def _index(i, n: int, what: str) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
        raise Undefined(f"{what} {i!r} out of range (0..{n - 1})")
    return i


def _dim(shape, i):
    return shape[_index(i, len(shape), f"axis of shape {list(shape)}:")]


def _at(v, i):
    v = _vec(v, "(at V I): V")
    return v[_index(i, len(v), f"(at V I) on {list(v)}: index")]


def _div(a, b):
    a, b = _int(a, "(/ A B): A"), _int(b, "(/ A B): B")
    if a < 0 or b <= 0:
        raise Undefined(f"(/ {a} {b}) is defined for A >= 0 and B > 0 only")
    return a // b


def _arith(op):
    def evaluate(a, b):
        return op(_int(a, "an arithmetic argument"), _int(b, "an arithmetic argument"))
    return evaluate


def accepts(kind: str, value_kind_: str) -> bool:
    """Whether an argument of ``kind`` takes a value of kind ``value_kind_`` (one of
    :func:`value_kind`'s), as the reader checks where it knows the value's kind."""
    if kind == VALUE:
        return True
    return value_kind_ == (VEC if kind == VEC else NUMBER)


def result_kind(fn: str) -> str:
    """The :func:`value_kind` of what parameter function ``fn`` returns."""
    return VEC if PARAM_FNS[fn].result == VEC else NUMBER


def value_kind(v) -> str:
    """NUMBER (int or float), ``symbol`` or VEC: the kinds ``=`` compares within (the
    e-graph encodes an int parameter and a float one by the operator's declared sort,
    so they compare as numbers)."""
    if isinstance(v, tuple):
        return VEC
    if isinstance(v, str):
        return "symbol"
    if isinstance(v, (int, float)):
        return NUMBER
    raise Undefined(f"not a parameter value: {v!r}")


def _equal(a, b) -> bool:
    if value_kind(a) != value_kind(b):
        raise Undefined(f"{a!r} and {b!r} are values of different kinds")
    return a == b


def _order(op):
    def evaluate(a, b) -> bool:
        for v in (a, b):
            if value_kind(v) != NUMBER:
                raise Undefined(f"order comparisons take numbers, got {v!r}")
        return op(a, b)
    return evaluate


# --- parameter functions -----------------------------------------------------------


@dataclass(frozen=True)
class ParamFn:
    """A parameter function: ``args`` are the kinds of its arguments; with
    ``variadic`` the last kind repeats (at least ``len(args)`` arguments). ``evaluate``
    takes the argument values (a tensor argument as its shape) and returns the value
    or raises :class:`Undefined`."""

    name: str
    args: tuple[str, ...]
    result: str
    meaning: str
    evaluate: Callable[..., Any] = field(repr=False)
    variadic: bool = False

    @property
    def arity(self) -> tuple[int, int | None]:
        """(fewest, most or None) arguments."""
        return len(self.args), None if self.variadic else len(self.args)

    def arg_kind(self, i: int) -> str:
        return self.args[min(i, len(self.args) - 1)]


PARAM_FNS: dict[str, ParamFn] = {f.name: f for f in (
    ParamFn("dim", (TENSOR, INDEX), INT, "dimension I of tensor T, 0 <= I < rank T",
            _dim),
    ParamFn("rank", (TENSOR,), INT, "the number of dimensions of tensor T", len),
    ParamFn("shape", (TENSOR,), VEC, "the shape of tensor T, as an int vector", tuple),
    ParamFn("len", (VEC,), INT, "the length of int vector V",
            lambda v: len(_vec(v, "(len V): V"))),
    ParamFn("at", (VEC, INDEX), INT, "element I of int vector V, 0 <= I < len V", _at),
    ParamFn("+", (INT, INT), INT, "integer sum", _arith(lambda a, b: a + b)),
    ParamFn("-", (INT, INT), INT, "integer difference", _arith(lambda a, b: a - b)),
    ParamFn("*", (INT, INT), INT, "integer product", _arith(lambda a, b: a * b)),
    ParamFn("/", (INT, INT), INT, "A divided by B rounded down, for A >= 0 and B > 0 "
            "(where floor and truncating division agree)", _div),
    ParamFn("vec", (INT,), VEC, "the int vector of its arguments",
            lambda *xs: tuple(_int(x, "a (vec ...) element") for x in xs), variadic=True),
)}


# --- guards ------------------------------------------------------------------------


@dataclass(frozen=True)
class GuardKind:
    """A guard: ``args`` are the kinds of its arguments. ``evaluate`` takes the
    evaluated parameters of a comparison, or the :func:`weight_ranges` entry (None when
    not computed from weights alone) of each tensor of a tensor guard. ``scheduling``:
    the guard restricts where a rule is applied, not what makes it sound."""

    name: str
    args: tuple[str, ...]
    meaning: str
    evaluate: Callable[..., bool] = field(repr=False)
    scheduling: bool = False

    @property
    def on_tensors(self) -> bool:
        return all(k == TENSOR for k in self.args)


def _before(a, b) -> bool:
    return a is not None and b is not None and a[1] < b[0]


GUARDS: dict[str, GuardKind] = {g.name: g for g in (
    GuardKind("=", (VALUE, VALUE), "A equals B (two values of one kind: numbers, symbols "
              "or int vectors; a shape is an int vector)", _equal),
    GuardKind("!=", (VALUE, VALUE), "A differs from B (two values of one kind)",
              lambda a, b: not _equal(a, b)),
    GuardKind("<", (NUMBER, NUMBER), "A < B", _order(lambda a, b: a < b)),
    GuardKind("<=", (NUMBER, NUMBER), "A <= B", _order(lambda a, b: a <= b)),
    GuardKind(">", (NUMBER, NUMBER), "A > B", _order(lambda a, b: a > b)),
    GuardKind(">=", (NUMBER, NUMBER), "A >= B", _order(lambda a, b: a >= b)),
    GuardKind("weight", (TENSOR,),
              "T is computed from weights alone: a weight leaf, or an output of an operator "
              "other than opaque whose tensor inputs all are (split outputs included). Graph "
              "inputs and the generated constants (const_one, const_imm, const_iconv, "
              "const_pool) are not, nor is anything computed from them. In an e-graph: some "
              "member of T's e-class is (the wlo analysis is defined)",
              lambda r: r is not None, scheduling=True),
    GuardKind("before", (TENSOR, TENSOR),
              "T1 and T2 are computed from weights alone and every weight T1 reads comes "
              "before every weight T2 reads (in graph order): an anchoring order, so that a "
              "symmetric multi-pattern rule applies once per pair and never to its own output",
              _before, scheduling=True),
)}

COMPARISONS = tuple(k for k, g in GUARDS.items() if not g.on_tensors)
TENSOR_GUARDS = {k: len(g.args) for k, g in GUARDS.items() if g.on_tensors}
SCHEDULING_GUARDS = tuple(k for k, g in GUARDS.items() if g.scheduling)


def weight_ranges(order: Iterable) -> dict[int, tuple[int, int]]:
    """The reference meaning of ``weight`` and ``before`` on a graph: for every node
    computed from weights alone (see GUARDS["weight"]), the (smallest, largest) weight
    node id it reads. ``order``: the graph's nodes in topological order. The e-graph's
    ``wlo``/``whi`` analyses number weights in the same order."""
    ranges: dict[int, tuple[int, int]] = {}
    for n in order:
        if n.op == WEIGHT.name:
            ranges[n.id] = (n.id, n.id)
        elif n.op != OPAQUE.name and n.inputs:
            rs = [ranges.get(t.node) for t in n.inputs]
            if all(r is not None for r in rs):
                ranges[n.id] = (min(r[0] for r in rs), max(r[1] for r in rs))
    return ranges


# --- back ends -----------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    """One back end's translation of every parameter function and guard kind."""

    name: str
    param_fns: Mapping[str, Any]
    guards: Mapping[str, Any]


def backend(name: str, param_fns: Mapping[str, Any] | None = None,
            guards: Mapping[str, Any] | None = None) -> Backend:
    """Check that back end ``name`` translates every entry of both tables and nothing
    else (RuleError otherwise; call it at import time). ``param_fns`` None: the back
    end evaluates parameters with the Python evaluators of :data:`PARAM_FNS`."""
    if param_fns is None:
        param_fns = {k: f.evaluate for k, f in PARAM_FNS.items()}
    _complete(name, "parameter function", PARAM_FNS, param_fns)
    _complete(name, "guard", GUARDS, guards or {})
    return Backend(name, dict(param_fns), dict(guards or {}))


def _complete(backend: str, what: str, table: Mapping, given: Mapping) -> None:
    missing = [k for k in table if k not in given]
    extra = [k for k in given if k not in table]
    if missing:
        raise RuleError(f"rule back end {backend!r} has no translation of {what}(s) "
                        f"{', '.join(missing)} (declared in rules/semantics.py)")
    if extra:
        raise RuleError(f"rule back end {backend!r} translates unknown {what}(s) "
                        f"{', '.join(extra)} (not in rules/semantics.py)")


__all__ = ["Undefined", "ParamFn", "GuardKind", "PARAM_FNS", "GUARDS", "COMPARISONS",
           "TENSOR_GUARDS", "SCHEDULING_GUARDS", "TENSOR", "INT", "INDEX", "VEC", "NUMBER", "VALUE",
           "value_kind", "accepts", "result_kind", "weight_ranges", "Backend", "backend"]
