"""The rule language's vocabulary: the guards and parameter functions a rule may use
(their meaning is declared once in ``rules/semantics.py``), and what the operator table
says about patterns (which operators may appear, their parameters and inputs, which
trailing parameters may be left out, what a literal of each parameter kind must be).
"""

from __future__ import annotations

from taso_egg.ops import FLOAT_DTYPES, OPS
from taso_egg.ops.elementwise import ACTIVATIONS

from . import semantics

# The guards and parameter functions, with their meaning, are declared once in
# rules/semantics.py; these are the names and arities the reader checks.
# name -> (min args, max args or None)
PARAM_FNS = {name: fn.arity for name, fn in semantics.PARAM_FNS.items()}
COMPARISONS = semantics.COMPARISONS
TENSOR_GUARDS = semantics.TENSOR_GUARDS  # name -> number of tensor variables
GUARD_KINDS = tuple(semantics.GUARDS)

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
LITERAL_FITS = {
    "int": lambda v: isinstance(v, int),
    "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "symbol": lambda v: isinstance(v, str),
    "activation": lambda v: v in ACTIVATIONS,
    "dtype": lambda v: v in FLOAT_DTYPES,
    "ints": lambda v: isinstance(v, tuple),
    "dims": lambda v: isinstance(v, tuple),
    "padding": lambda v: v in ("SAME", "VALID") or isinstance(v, tuple) and len(v) == 4,
}
LITERAL_WANTED = {"activation": f"one of {', '.join(ACTIVATIONS)}",
                  "dtype": f"one of {', '.join(FLOAT_DTYPES)}"}
_MISSING = {p.kind for op in OPS if OPS[op].in_rules for p in OPS[op].params} - set(LITERAL_FITS)
if _MISSING:
    raise RuntimeError(f"rule literals of parameter kind(s) {sorted(_MISSING)} have no check")


__all__ = ["PARAM_FNS", "COMPARISONS", "TENSOR_GUARDS", "GUARD_KINDS", "EXCLUDED_OPS", "MULTI_OUTPUT_OPS",
           "OPTIONAL_PARAMS", "LITERAL_FITS", "LITERAL_WANTED", "pattern_ops", "param_names", "input_arity",
           "signature"]
