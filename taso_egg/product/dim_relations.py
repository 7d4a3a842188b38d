"""Relations among a model's symbolic dims, read from the model itself, so that the
sizes it is optimized and checked at are sizes the graph agrees with.

A decode step with a key/value cache names the cache's length (``past_sequence``) and
the length after the step (``total_sequence``: the mask's, the present cache's) apart,
but its graph ties them: the present cache is the past one concatenated with the new
positions, so ``total = past + 1``. Sizes chosen apart (both 64) fail at the first node
that meets both. Relations come from two places:

- a dim name that is itself an expression of other dims' names (optimum names a mask's
  dim ``past_sequence_length + sequence_length``);
- onnxruntime's symbolic shape inference, run over the graph with the outputs'
  declared shapes cleared: where it must merge two dims to go on (a broadcast, a
  MatMul's inner dims) it records which expression of the input dims equals which
  input dim.

Only linear relations with integer coefficients are kept, ``dim = c + sum(k * other)``,
each dim depending on dims that depend on nothing (``Relation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

# onnxruntime's inference runs node by node in Python: only where a relation can
# matter (two dims that no batch leads) and the graph is not huge is it worth its time
_INFER_MAX_NODES = 20_000


@dataclass(frozen=True)
class Relation:
    """``constant + sum(coefficient * size of dim)`` over ``terms``."""

    constant: int
    terms: tuple[tuple[str, int], ...]

    def value(self, sizes: Mapping[str, int]) -> int:
        return self.constant + sum(k * sizes[s] for s, k in self.terms)

    def __str__(self) -> str:
        parts = [(s if k == 1 else f"{k}*{s}") for s, k in self.terms]
        if self.constant or not parts:
            parts.append(str(self.constant))
        return " + ".join(parts).replace("+ -", "- ")


def dim_relations(proto, symbols: list[str], leading: set[str]) -> dict[str, Relation]:
    """dim -> the relation that sizes it, over ``symbols`` (the input dims' names in
    the model's order; ``leading``: those at axis 0 of an input, batches). ``proto``:
    a ModelProto or a ``fed.FedModel``."""
    relations: dict[str, Relation] = {}
    for s in symbols:
        rel = _named_relation(s, symbols)
        if rel is not None:
            _add(relations, s, rel)
    if len([s for s in symbols if s not in leading and s not in relations]) >= 2 and \
            len(proto.graph.node) <= _INFER_MAX_NODES:
        for dim, rel in _inferred_relations(proto, symbols):
            _add(relations, dim, rel)
    return relations


def _add(relations: dict[str, Relation], dim: str, rel: Relation) -> None:
    """Keep ``dim = rel`` where ``dim`` has no relation yet and ``rel`` reads only
    dims that have none (no chains, no cycles)."""
    if dim in relations or any(s in relations or s == dim for s, _ in rel.terms):
        return
    if any(dim in (s for s, _ in r.terms) for r in relations.values()):
        return
    relations[dim] = rel


def _linear(expr, symbols: list[str]) -> Relation | None:
    """A sympy expression as a Relation over ``symbols``, or None where it is not
    linear with integer coefficients over them."""
    import sympy

    constant, terms = 0, []
    for key, coefficient in sympy.expand(expr).as_coefficients_dict().items():
        if not coefficient.is_integer:
            return None
        if key == 1:
            constant = int(coefficient)
        elif isinstance(key, sympy.Symbol) and key.name in symbols:
            terms.append((key.name, int(coefficient)))
        else:
            return None
    return Relation(constant, tuple(sorted(terms, key=lambda t: symbols.index(t[0]))))


def _named_relation(name: str, symbols: list[str]) -> Relation | None:
    """``name`` read as an expression of the other dims' names, where it is one."""
    import sympy
    from sympy.parsing.sympy_parser import parse_expr

    others = {s: sympy.Symbol(s) for s in symbols if s != name and s.isidentifier()}
    if name.isidentifier() or not others or not any(s in name for s in others):
        return None
    try:
        expr = parse_expr(name, local_dict=others, evaluate=True)
    except Exception:  # sympy's parser raises whatever its tokenizer meets: not an expression
        return None
    rel = _linear(expr, symbols)
    return rel if rel is not None and rel.terms else None


def _inferred_relations(proto, symbols: list[str]):
    """``(dim, Relation)`` pairs that onnxruntime's symbolic shape inference finds in
    the graph, run with the outputs' declared shapes cleared so that the graph alone
    speaks: an output dim declared as an input dim's name that the graph computes as
    an expression of others (a present cache's ``total_sequence``, computed
    ``past_sequence + 1``), and the merges it records where two dims must be equal to
    go on (a broadcast, a MatMul's inner dims). Nothing where the inference fails:
    the import then says which node meets sizes it cannot take."""
    import sympy
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    from ..onnx_io.validate import without_weight_data

    light = without_weight_data(getattr(proto, "model", proto))  # a FedModel's protobuf: stubs for weights
    declared = {}
    for out in light.graph.output:
        if out.type.HasField("tensor_type"):
            declared[out.name] = [d.dim_param for d in out.type.tensor_type.shape.dim]
            out.type.tensor_type.ClearField("shape")
    inference = SymbolicShapeInference(int_max=2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0)
    try:
        inference._preprocess(light)
        for _ in range(4):  # it reruns itself after merging; bounded
            if not inference.run_:
                break
            inference._infer_impl()
    except Exception:  # its errors carry no common type; what it found so far stands
        pass
    known = inference.symbolic_dims_

    def as_expr(value):
        if isinstance(value, int) or (isinstance(value, str) and value.lstrip("-").isdigit()):
            return sympy.Integer(int(value))
        return known.get(value)

    pairs = [(as_expr(a), as_expr(b)) for a, b in list(inference.suggested_merge_.items())]
    for name, dims in declared.items():
        vi = inference.known_vi_.get(name)
        inferred = vi.type.tensor_type.shape.dim if vi is not None and vi.type.HasField("tensor_type") else ()
        if len(inferred) != len(dims):
            continue
        for want, got in zip(dims, inferred):
            if want in symbols:
                value = got.dim_value if got.HasField("dim_value") else got.dim_param
                pairs.append((sympy.Symbol(want), as_expr(value) if value != "" else None))
    for a, b in pairs:
        if a is None or b is None:
            continue
        for lone, other in ((b, a), (a, b)):
            if isinstance(lone, sympy.Symbol) and lone.name in symbols:
                rel = _linear(other, symbols)
                if rel is not None and lone.name not in (s for s, _ in rel.terms):
                    yield lone.name, rel
                    break
