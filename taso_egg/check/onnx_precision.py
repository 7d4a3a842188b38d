"""What precision an ONNX model computes and stores: each output's coarsest rounding
step (``rounding_steps``, which sets its check's floor), and that a written model kept
its input's (``check_precision_kept``)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import VerificationError
from ..ops.precision import NARROW_DTYPES, ROUNDING_STEP, is_quantizing


def rounding_steps(model) -> dict[str, float]:
    """Each output of an ONNX model (or ``export_for_check`` pair): the coarsest rounding
    step on its path (``ops.precision.ROUNDING_STEP``): of its own dtype, of the narrow
    inputs, weights and casts it is computed from, and 8 bits where a quantizing node
    (``ops.precision.is_quantizing``) is on it. What one rounding moves an output by is
    measured at that step: a float32 step would not move a float16 or quantized path."""
    import onnx
    from onnx import helper

    if isinstance(model, (bytes, str)):  # as onnx_outputs takes it
        model = onnx.load_from_string(model) if isinstance(model, bytes) else \
            onnx.load(model, load_external_data=False)
    graph = (model[0] if isinstance(model, tuple) else model).graph
    producer = {o: n for n in graph.node for o in n.output if o}
    stored = {t.name: t.data_type for t in graph.initializer}
    stored.update((vi.name, vi.type.tensor_type.elem_type) for vi in graph.input)

    def step(code) -> float:
        return ROUNDING_STEP.get(np.dtype(helper.tensor_dtype_to_np_dtype(code)).name, 0.0) if code else 0.0

    steps = {}
    for out in graph.output:
        coarsest, seen, stack = step(out.type.tensor_type.elem_type), set(), [out.name]
        while stack:
            name = stack.pop()
            if not name or name in seen:
                continue
            seen.add(name)
            coarsest = max(coarsest, step(stored.get(name)))
            node = producer.get(name)
            if node is None:
                continue
            if is_quantizing(node.op_type, node.domain):
                coarsest = max(coarsest, ROUNDING_STEP["uint8"])
            to = next((a.i for a in node.attribute if a.name == "to"), 0) if node.op_type == "Cast" else 0
            coarsest = max(coarsest, step(to))
            stack.extend(node.input)
        steps[out.name] = coarsest
    return steps


def check_precision_kept(reference, model, what: str = "written model") -> None:
    """VerificationError unless ONNX ``model`` (or an ``export_for_check`` pair) keeps
    ``reference``'s precision: no narrow weight (``ops.precision.NARROW_DTYPES``) stored
    wider, as a folded DequantizeLinear or a folded Cast of a float16 weight would (the
    narrow elements drop and the wide float ones grow by at least as many; folding
    narrow weights into fewer narrow ones is fine), and as many quantizing nodes of each
    type (no rounding step dropped; MatMulNBits by their output columns). Only the
    weights the reference's nodes read count."""
    have, want = _precision(model), _precision(reference, read_only=True)
    narrow = sum(n for (kind, name), n in want.items() if kind == "dtype" and name in NARROW_DTYPES)
    lost = narrow - sum(n for (kind, name), n in have.items() if kind == "dtype" and name in NARROW_DTYPES)
    widened = have.get(("dtype", "wide"), 0) - want.get(("dtype", "wide"), 0)
    if lost > 0 and widened >= lost:
        raise VerificationError(f"{what}: changes the model's precision: it stores {lost} fewer "
                                f"elements in {', '.join(sorted(n for k, n in want if k == 'dtype' and n != 'wide'))} "
                                f"and {widened} more in float32 or float64 (weights widened)")
    for (kind, name), count in sorted(want.items()):
        if kind == "op" and have.get((kind, name), 0) < count:
            unit = "output columns" if name == "MatMulNBits" else "nodes"
            raise VerificationError(f"{what}: changes the model's precision: it has "
                                    f"{have.get((kind, name), 0)} {name} {unit} where the input has {count}")


def _precision(model, read_only: bool = False) -> dict[tuple[str, str], int]:
    """``("dtype", name)``: elements stored in each narrow dtype, and under "wide" in
    float32 and float64 together; ``("op", type)``: quantizing nodes of each type.
    ``read_only``: only the initializers some node reads."""
    from onnx import helper

    model, fed = model if isinstance(model, tuple) else (model, {})
    graph = model.graph
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    counts: dict[tuple[str, str], int] = {}

    def add(dtype: str, n: int) -> None:
        key = "wide" if dtype in ("float32", "float64") else dtype
        if key == "wide" or key in NARROW_DTYPES:
            counts[("dtype", key)] = counts.get(("dtype", key), 0) + n

    for t in graph.initializer:
        if t.name in read or not read_only:
            add(np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).name, math.prod(t.dims))
    for a in fed.values():
        add(a.dtype.name, a.size)
    for n in graph.node:
        if is_quantizing(n.op_type, n.domain):
            counts[("op", n.op_type)] = counts.get(("op", n.op_type), 0) + _rounded(n)
    return counts


def _rounded(node) -> int:
    """What one quantizing node counts for: a MatMulNBits its output columns (products
    over one input packed into one keep every column's quantized weight), any other 1."""
    if node.op_type == "MatMulNBits":
        return next((a.i for a in node.attribute if a.name == "N"), 1)
    return 1
