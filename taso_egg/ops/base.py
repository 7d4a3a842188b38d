"""The shape of an operator declaration, and the registry every other module reads.

An operator is declared once, as an :class:`OpSpec`: its parameters (name, kind,
default), its shape rule twice over (``infer``, which validates and names what is
wrong, and ``shape``, the same rule as data for the e-graph and the verifier; see
``shapes.py``), its kernel written against an array module ``xp`` (NumPy on CPU, CuPy
on GPU), its FLOP count, its ONNX export, and its traits. ONNX *import* handlers are
registered beside the operator with :func:`onnx_importer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..errors import ShapeError

Shape = tuple[int, ...]
FLOAT_DTYPES = ("float16", "float32", "float64")


@dataclass(frozen=True)
class TensorType:
    shape: Shape
    dtype: str = "float32"

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


# Parameter kinds, with what a literal of the kind must be. Each back end (the egglog
# language, the Z3 verifier, the rule reader) maps every kind it can meet and fails at
# import on one it lacks.
PARAM_KINDS = {
    "int": "an integer",
    "float": "a number",
    "symbol": "a symbol",
    "activation": "a fused activation",   # one of elementwise.ACTIVATIONS
    "dtype": "a float dtype",             # one of FLOAT_DTYPES
    "ints": "an int vector such as [1 1]",
    "dims": "an int vector such as [1 1]",  # tensor dimensions: varied with the shapes
    "padding": "SAME, VALID or [top left bottom right]",
    "data": "",                           # carried data, never in a rule or the e-graph
}


@dataclass(frozen=True)
class Param:
    name: str
    kind: str            # a key of PARAM_KINDS
    default: Any
    optional: bool = False  # a rule pattern may leave it out (it is trailing)

    def __post_init__(self):
        if self.kind not in PARAM_KINDS:
            raise RuntimeError(f"parameter {self.name!r}: unknown kind {self.kind!r}")


@dataclass(frozen=True)
class OpSpec:
    """One operator of the table.

    ``infer(params, input_types) -> output_types`` validates and raises ShapeError.
    ``kernel(xp, params, *arrays) -> list of arrays``.
    ``flops(params, input_types, output_types) -> float`` (multiply-adds count 2).
    ``export(ctx, node, input_names, output_names)`` emits ONNX nodes through ctx.
    """

    name: str
    inputs: tuple[int, int | None]  # (min, max) tensor inputs; max None = variadic
    params: tuple[Param, ...]
    infer: Callable[[Mapping[str, Any], Sequence[TensorType]], list[TensorType]]
    kernel: Callable[..., list]
    export: Callable[..., None] | None = None
    flops: Callable[..., float] | None = None
    # Ops that only re-view memory cost nothing in TASO's model.
    is_view: bool = False
    # Leaves: inputs, weights and the generated constants.
    is_leaf: bool = False
    # A leaf whose value is known before run time (weights, constants): foldable.
    is_constant: bool = False
    # One of TASO's generated constants (const_*): a leaf the rule generator enumerates
    # and no imported graph holds, so rules over them are the study file's.
    generated: bool = False
    # Inputs whose values must be positive (a variance): stand-in data is made so.
    positive_inputs: tuple[int, ...] = ()
    # How the output scales with the inputs (the exponent-tracking check uses it):
    # "multilinear": f(2^a x, 2^b y) = 2^(a+b) f(x, y) (with activation NONE/RELU and
    # no conv bias); "additive": inputs must share one scale, which the output keeps;
    # "first": scales with the first input only (enlarge: ref lends its shape);
    # "": none of these, the check feeds true values.
    scaling: str = ""
    # The shape rule as data (shapes.Case), for the e-graph and the verifier; empty for
    # operators whose shapes the e-graph takes from the graph (opaque).
    shape: tuple = ()
    # Traits. commutative: f(a, b) == f(b, a). broadcasts: NumPy broadcasting of its
    # operands (the e-graph gives them one rank). multi_output: read through proj.
    # activation: the fused-activation name (RELU, ...) of this unary operator.
    # in_rules: may appear in rule patterns (leaves are ?variables there; opaque
    # operators are barriers).
    commutative: bool = False
    broadcasts: bool = False
    multi_output: bool = False
    activation: str = ""
    in_rules: bool = True
    # The e-graph's form where it differs from the graph's: its tensor inputs (concat is
    # binary there; a conv's optional bias is left out) and its parameters (a weight
    # carries its id first; an opaque node is one key into the bridge's table).
    egraph_inputs: int | None = None
    egraph_params: tuple[Param, ...] | None = None
    # The output's dtype: "" the one dtype all tensor inputs share (most operators);
    # "bool" a fixed dtype (a test, a comparison); "input:I" input I's (where: the
    # branches', not the condition's); "param:NAME" a dtype parameter (cast).
    out_dtype: str = ""
    doc: str = ""

    @property
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no parameter {name!r}")

    def check_input_count(self, n: int, where: str = "") -> None:
        lo, hi = self.inputs
        if n < lo or (hi is not None and n > hi):
            raise ShapeError(f"{where}takes {lo}..{hi if hi is not None else 'n'} inputs, got {n}")

    def normalize_params(self, params: Mapping[str, Any], where: str = "") -> dict:
        defaults = self.defaults
        unknown = set(params) - set(defaults)
        if unknown:
            raise ShapeError(f"{where}{self.name}: unknown parameter(s) {sorted(unknown)}; "
                             f"allowed: {sorted(defaults)}")
        merged = dict(defaults)
        merged.update(params)
        return {k: _freeze(v) for k, v in merged.items()}


def _freeze(v):
    """Parameters must be hashable and canonical: lists become tuples."""
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if hasattr(v, "item") and getattr(v, "shape", None) == ():  # numpy scalar
        return v.item()
    return v


OPS: dict[str, OpSpec] = {}
ONNX_IMPORTERS: dict[str, Callable] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in OPS:
        raise RuntimeError(f"operator {spec.name!r} declared twice")
    OPS[spec.name] = spec
    return spec


def onnx_importer(*op_types: str):
    """Register an ONNX import handler: ``handler(ctx, onnx_node) -> list of values``
    or None when this node's attributes fall outside what the operator covers (the
    node is then kept as an opaque operator)."""

    def deco(fn):
        for t in op_types:
            ONNX_IMPORTERS[t] = fn
        return fn

    return deco


def fail(op: str, msg: str, types: Sequence[TensorType] = ()) -> None:
    shapes = ", ".join(str(t) for t in types)
    raise ShapeError(f"{op}: {msg}" + (f" (inputs: {shapes})" if shapes else ""))


def elementwise_flops(params, ins, outs) -> float:
    return float(sum(o.size for o in outs))


def broadcast_shapes(op: str, types: Sequence[TensorType]) -> Shape:
    """NumPy broadcasting, with an error that names the operator and shapes."""
    rank = max(len(t.shape) for t in types)
    out = []
    for axis in range(rank):
        dims = {t.shape[axis - rank + len(t.shape)] for t in types if axis - rank + len(t.shape) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            fail(op, f"shapes do not broadcast at axis {axis}", types)
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def check_dims(op: str, dims: Sequence[int], what: str = "dims") -> Shape:
    dims = tuple(int(d) for d in dims)
    if any(d < 0 for d in dims):
        fail(op, f"negative dimension in {what} {list(dims)}")
    return dims
