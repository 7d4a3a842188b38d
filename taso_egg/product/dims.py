"""Sizing a model's symbolic dims, in one place: the sizes it is optimized, written and
checked at, chosen once per model (``DimPlan.choose``).

A model whose inputs have symbolic dims (a dynamic batch, a sequence length) is
imported at representative sizes: one size per dim_param name, shared by every input
that names it; given by ``--input-shape``, else ``DEFAULT_LEADING`` for a dim that
leads an input (a batch) and ``DEFAULT_OTHER`` for the rest (a sequence length), and
1 for the dims a key/value cache grows by (one new token: the decode step).
Everything is priced, saturated and timed there. Where the defaults are too small for
the model (a conv stack over 64 audio samples has no frames: onnxruntime refuses them,
or an output comes out empty), the defaulted sizes that lead no input double until it
runs (``DimPlan.grown``; the import decides when). The second sizes (each
symbol moved to a prime that divides none of the first sizes: ``second_sizes``) are
where a candidate is also exported (``symbolize``) and checked; the empty sizes (a
cache of length 0) where it is checked once more.

The dims are not independent: a decode step names the cache's length
(``past_sequence``) and the length after the step (``total_sequence``: the mask's, the
present cache's) apart, but its graph ties them, ``total = past + 1``, and sizes chosen
apart fail at the first node that meets both. The ties (``Relation``) are read from the
model itself (``dim_relations``), from two places:

- a dim name that is itself an expression of other dims' names (optimum names a mask's
  dim ``past_sequence_length + sequence_length``);
- onnxruntime's symbolic shape inference, run over the graph with the outputs'
  declared shapes cleared: where it must merge two dims to go on (a broadcast, a
  MatMul's inner dims) it records which expression of the input dims equals which
  input dim.

Only linear relations with integer coefficients are kept, ``dim = c + sum(k * other)``,
each dim depending on dims that depend on nothing; every tied dim is computed from
the dims it reads (``tied_sizes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..errors import NotModelled, OnnxImportError

DEFAULT_LEADING = 1    # a symbolic dim at axis 0 of an input: a batch
DEFAULT_OTHER = 64     # any other symbolic dim: a sequence length, an image side
_MAX_GROWN = 1 << 14   # a default grows up to this (a second of 16 kHz audio)
# onnxruntime's inference runs node by node in Python: only where a relation can
# matter (two dims that no batch leads) and the graph is not huge is it worth its time
_INFER_MAX_NODES = 20_000


@dataclass(frozen=True)
class Interface:
    """The model's graph inputs (initializers aside) and outputs as value infos, and
    for each input its dims: an int where fixed, the symbol's name where symbolic (a
    dim with no dim_param gets a name of its own, ``?input:axis``)."""

    inputs: tuple            # ValueInfoProto, in the model's order
    outputs: tuple
    dims: dict[str, tuple]   # input name -> (int | str, ...)

    @property
    def symbols(self) -> list[str]:
        seen: dict[str, None] = {}
        for dims in self.dims.values():
            seen.update((d, None) for d in dims if isinstance(d, str))
        return list(seen)

    @property
    def symbolic(self) -> bool:
        return bool(self.symbols)

    def source(self, symbol: str) -> tuple[str, int]:
        """The first input axis that has ``symbol``: where the written model reads it."""
        return next((name, axis) for name, dims in self.dims.items()
                    for axis, d in enumerate(dims) if d == symbol)

    def shapes(self, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Every input's shape with each symbol at ``sizes``."""
        return {name: tuple(sizes[d] if isinstance(d, str) else d for d in dims)
                for name, dims in self.dims.items()}


def interface(proto) -> Interface:
    initializers = {t.name for t in proto.graph.initializer}
    inputs = tuple(vi for vi in proto.graph.input if vi.name not in initializers)
    dims = {}
    for vi in inputs:
        shape = vi.type.tensor_type.shape if vi.type.HasField("tensor_type") else None
        dims[vi.name] = tuple(
            # a fixed size, even 0 (the importer refuses an empty tensor in one line)
            d.dim_value if d.HasField("dim_value") else (d.dim_param or f"?{vi.name}:{axis}")
            for axis, d in enumerate(shape.dim if shape is not None else ()))
    return Interface(inputs, tuple(proto.graph.output), dims)


def leading_symbols(iface: Interface) -> set[str]:
    """The symbols at axis 0 of an input: batches, which keep their default of 1."""
    return {dims[0] for dims in iface.dims.values() if dims and isinstance(dims[0], str)}


@dataclass(frozen=True)
class DimPlan:
    """A model's symbolic interface and how its dims are sized: the ties among them,
    the sizes given, the first sizes, the dims an empty cache zeroes and the dims a
    new token sets. Made once per model (``choose``); what depends on the first sizes
    (the second, grown and empty sizes) is asked of it."""

    iface: Interface
    relations: dict                 # dim -> Relation
    given: dict                     # input name -> shape, without the inputs given empty
    first: dict[str, int]
    zeros: dict[str, int]           # dims at 0: given so, else the cache's (empty cache)
    new_tokens: frozenset           # the dims a cache grows by, priced at one token

    @classmethod
    def choose(cls, reference, given: Mapping[str, Sequence[int]] | None = None, fixed: bool = False) -> DimPlan:
        """``given``: input name -> shape (--input-shape), the sizes to price and time at;
        ``fixed``: the model is written with them (--fix-shapes), so an empty size is refused."""
        given = dict(given or {})
        iface = interface(reference)
        relations = dim_relations(reference, iface.symbols, leading_symbols(iface)) if iface.symbolic else {}
        zeros = {d: 0 for name, shape in given.items() for d, size in zip(iface.dims.get(name, ()), shape)
                 if isinstance(d, str) and size == 0}
        if zeros and fixed:
            raise OnnxImportError(f"--fix-shapes with {describe_sizes(zeros)}: a model fixed at an empty "
                                  f"tensor computes nothing; give sizes of 1 or more")
        # an input given at an empty size is imported at the chosen sizes, checked at the empty ones
        given = {name: shape for name, shape in given.items()
                 if not any(isinstance(d, str) and d in zeros for d in iface.dims.get(name, ()))}
        cache = concatenated_dims(reference, iface) if iface.symbolic else set()
        new_tokens = frozenset(new_token_dims(relations, cache))
        first = representative_sizes(iface, given, relations, one=new_tokens)
        check_feeds_fit(iface, first)
        return cls(iface, relations, given, first, zeros or {d: 0 for d in cache}, new_tokens)

    def second(self, first: Mapping[str, int]) -> dict[str, int]:
        return second_sizes(first, self.relations)

    def grown(self, first: Mapping[str, int]) -> dict[str, int] | None:
        """``first`` with every symbol that no given shape sets, that leads no input and
        that the graph ties to no other doubled (the tied ones follow); None when there
        is none, or past ``_MAX_GROWN``."""
        fixed = self.given_dims() | leading_symbols(self.iface) | set(self.relations)
        free = [s for s in self.iface.symbols if s not in fixed]
        if not free or any(first[s] * 2 > _MAX_GROWN for s in free):
            return None
        return tied_sizes({s: v * 2 if s in free else v for s, v in first.items()}, self.relations)

    def empty(self, first: Mapping[str, int]) -> dict[str, int] | None:
        return empty_sizes(first, self.zeros, self.relations)

    def import_shapes(self, first: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        return import_shapes(self.iface, first, self.given)

    def new_tokens_at(self, first: Mapping[str, int]) -> frozenset:
        """The new-token dims still at one token at ``first`` (growing may double them)."""
        return frozenset(d for d in self.new_tokens if first[d] == 1)

    def given_dims(self) -> set[str]:
        """The symbols the shapes given (--input-shape) set."""
        return {d for name in self.given for d in self.iface.dims.get(name, ()) if isinstance(d, str)}

    def at_sizes(self, error: Exception, sizes: Mapping[str, int]) -> Exception:
        """``error`` (a node that cannot take the sizes a symbolic model was imported at)
        naming those sizes, which of them were chosen rather than given, the ties found
        among them, and the flag that sets them."""
        if not self.iface.symbolic:
            return error
        set_by_given = self.given_dims()
        chosen = [s for s in self.iface.symbols if s not in set_by_given]
        ties = ("; ties read from the graph: " + ", ".join(f"{d} = {r}" for d, r in self.relations.items())
                if self.relations else "")
        why = (f" (at {describe_sizes(sizes)}{ties}; " +
               (f"{', '.join(chosen)} chosen by default: set them with --input-shape NAME=D0,D1,...)" if chosen
                else "as given by --input-shape)"))
        return type(error)(str(error) + why)

    def refused(self, error: Exception) -> Exception:
        """An opaque node onnxruntime refuses at sizes chosen by default (a contrib
        operator with rules of its own: GroupQueryAttention takes a batch above 1 only for
        one new token, a cache mask only as lengths): the model is carried whole, written
        unchanged with the reason, not refused; at sizes the caller gave, the error stands."""
        if set(self.iface.symbols) <= self.given_dims():
            return error
        return NotModelled(f"{error}; no sizes the model takes were found")


def representative_sizes(iface: Interface, given: Mapping[str, Sequence[int]],
                         relations: Mapping | None = None, one: Sequence[str] = ()) -> dict[str, int]:
    """One size per symbol: as ``given`` (input name -> shape, --input-shape) sets it,
    else the defaults (1 for the dims in ``one``), with each dim the graph ties to others
    (``relations``, from ``dim_relations``) computed from them. One line (OnnxImportError) when two given
    shapes set one symbol to different sizes, or the sizes given contradict a relation;
    a given shape of the wrong rank is left for the importer."""
    relations = dict(relations or {})
    sizes: dict[str, int] = {}
    setter: dict[str, str] = {}
    for name, shape in given.items():
        dims = iface.dims.get(name)
        if dims is None or len(dims) != len(shape):
            continue
        for d, size in zip(dims, shape):
            if not isinstance(d, str):
                continue
            if d in sizes and sizes[d] != int(size):
                raise OnnxImportError(f"inputs {setter[d]!r} and {name!r} share the symbolic "
                                      f"dimension {d!r}, but the shapes given (--input-shape) set it "
                                      f"to {sizes[d]} and {int(size)}")
            sizes[d], setter[d] = int(size), name
    for d, rel in relations.items():  # a tied dim given, one dim it reads not: solved for that one
        unset = [(s, k) for s, k in rel.terms if s not in sizes]
        if d in sizes and len(unset) == 1 and abs(unset[0][1]) == 1:
            s, k = unset[0]
            sizes[s] = (sizes[d] - rel.value({**sizes, s: 0})) * k
    leading = leading_symbols(iface)
    for s in iface.symbols:
        if s not in relations:
            sizes.setdefault(s, 1 if s in one else DEFAULT_LEADING if s in leading else DEFAULT_OTHER)
    return tied_sizes(sizes, relations, setter)


def tied_sizes(sizes: Mapping[str, int], relations: Mapping, setter: Mapping[str, str] = {}) -> dict[str, int]:
    """``sizes`` with every tied dim computed from the dims it reads; one line
    (OnnxImportError) where that contradicts a size given, or is negative."""
    out = dict(sizes)
    for d, rel in relations.items():
        value = rel.value(out)
        if d in setter and out[d] != value:
            raise OnnxImportError(f"the graph ties the symbolic dimension {d!r} to {rel} "
                                  f"({describe_sizes({s: out[s] for s, _ in rel.terms}) or 'constant'}: {value}), "
                                  f"but the shapes given (--input-shape) set it to {out[d]}")
        if value < 0:
            raise OnnxImportError(f"the graph ties the symbolic dimension {d!r} to {rel}, which is {value} at "
                                  f"{describe_sizes(out)}; set the dims it reads with --input-shape")
        out[d] = value
    return out


def input_types(iface: Interface, sizes: Mapping[str, int]):
    """``(name, shape, dtype)`` of every tensor input with each symbol at ``sizes``."""
    from onnx import helper

    shapes = iface.shapes(sizes)
    return [(vi.name, shapes[vi.name], helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
            for vi in iface.inputs if vi.type.HasField("tensor_type")]


def check_feeds_fit(iface: Interface, sizes: Mapping[str, int]) -> None:
    """One line (``executor.check_feed_fits``) when an input's random values at ``sizes``
    cannot be made: checked before anything is sized from them (second sizes, imports)."""
    from ..executor import check_feed_fits

    for name, shape, dtype in input_types(iface, sizes):
        check_feed_fits(name, shape, dtype)


def import_shapes(iface: Interface, sizes: Mapping[str, int],
                  given: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """The shapes to import at: ``given`` as given (the importer checks them against the
    model), every other input with its symbols at ``sizes``."""
    symbolic = {name for name, dims in iface.dims.items() if any(isinstance(d, str) for d in dims)}
    shapes = {name: shape for name, shape in iface.shapes(sizes).items() if name in symbolic and name not in given}
    shapes.update({name: tuple(shape) for name, shape in given.items()})
    return shapes


def second_sizes(sizes: Mapping[str, int], relations: Mapping | None = None) -> dict[str, int]:
    """For each symbol the smallest prime above its size that divides no nonzero size
    and is no other symbol's, each tied dim computed from those (``relations``): the
    sizes the candidates are also written and checked at."""
    relations = dict(relations or {})
    taken: set[int] = set()
    out = {}
    for s, size in sizes.items():
        if s in relations:
            continue
        p = size + 1
        while not _is_prime(p) or p in taken or any(v and v % p == 0 for v in sizes.values()):
            p += 1
        taken.add(p)
        out[s] = p
    return tied_sizes(out, relations)


def empty_sizes(first: Mapping[str, int], zeros: Mapping[str, int], relations: Mapping) -> dict[str, int] | None:
    """``first`` with the ``zeros`` (dims at 0) and the dims tied to them recomputed;
    None where there are none, or a tied dim comes out empty too or negative."""
    if not zeros:
        return None
    sizes = {s: v for s, v in first.items() if s not in relations}
    sizes.update(zeros)
    sizes = {**sizes, **{d: rel.value(sizes) for d, rel in relations.items()}}
    return sizes if all(sizes[d] > 0 for d in relations if d not in zeros) else None


def concatenated_dims(reference, iface: Interface) -> set[str]:
    """The symbols along which an input is concatenated (a key/value cache's past
    length, the present cache being the past one and the new positions): an empty
    cache is how such a model is first called."""
    dims: set[str] = set()
    inputs = {vi.name for vi in iface.inputs}
    for node in reference.graph.node:
        if node.op_type != "Concat":
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        for name in node.input:
            if name in inputs:
                shape = iface.dims[name]
                d = shape[axis] if -len(shape) <= axis < len(shape) else None
                if isinstance(d, str):
                    dims.add(d)
    return dims


def new_token_dims(relations: Mapping, cache: set[str]) -> set[str]:
    """The dims a cache's length grows by (``past_sequence_length + sequence_length``,
    optimum's mask: ``sequence_length``): a model that takes its cache is called once
    per token it generates and once for the prompt, so it is priced and timed as that
    step, one new token (a prefill of the default 64 on a cache of 64 measured
    optimum's Llama at 47 ms where its step takes 9)."""
    new = set()
    for rel in relations.values():
        reads = dict(rel.terms)
        if any(reads.get(d) == 1 for d in cache):
            new.update(s for s, k in rel.terms if k == 1 and s not in cache)
    return new


def describe_sizes(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{s}={v}" for s, v in sizes.items())


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % k for k in range(2, math.isqrt(n) + 1))


# --- ties among the dims, read from the graph -------------------------------------


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
