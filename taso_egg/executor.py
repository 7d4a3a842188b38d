"""Run a graph with the operator table's kernels, on NumPy or CuPy (``xp``)."""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from .errors import ExecutionError, TasoEggError
from .graph import Graph, Node
from .ops import INPUT, OPS, WEIGHT
from .ops.precision import is_float


# Random feeds may take at most this share of the machine's memory: the model's own
# tensors and two runtimes' copies need the rest.
FEED_MEMORY_SHARE = 0.5


def check_feed_fits(name: str, shape, dtype) -> None:
    """ExecutionError when the random feed of input ``name`` cannot be made: as
    ``random_inputs`` makes it (float64 first, then cast), it needs more than
    FEED_MEMORY_SHARE of this machine's memory."""
    elements = 1
    for d in shape:
        elements *= int(d)
    need = elements * (8 + np.dtype(dtype).itemsize)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > FEED_MEMORY_SHARE * memory:
        raise ExecutionError(f"input {name!r} {list(shape)} {np.dtype(dtype)}: its random values, which "
                             f"check and time the model, need {need / 2 ** 30:.1f} GiB, more than "
                             f"{FEED_MEMORY_SHARE:.0%} of this machine's {memory / 2 ** 30:.1f} GiB")


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for every graph input (``random_feeds``)."""
    return random_feeds(((n.params["name"], n.params["shape"], n.params["dtype"]) for n in graph.inputs()), seed)


def random_feeds(inputs, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for ``(name, shape, dtype)`` inputs: floats ~N(0,1), bools fair,
    integers 0 or 1 (in range as a token id, a token type or a mask)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, dtype in inputs:
        dtype = np.dtype(dtype)
        check_feed_fits(name, shape, dtype)
        if is_float(dtype):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        else:
            feeds[name] = rng.integers(0, 2, size=shape).astype(dtype)
    return feeds


def run(graph: Graph, inputs: Mapping[str, np.ndarray] | None = None, xp=np,
        float64: bool = False) -> dict[str, np.ndarray]:
    """Compute the graph's outputs (by output name). ``inputs`` defaults to
    ``random_inputs(graph)``. ``float64`` computes every floating-point tensor in
    double precision (for numerical checks)."""
    if inputs is None:
        inputs = random_inputs(graph)
    values: dict[tuple[int, int], object] = {}
    for node in graph.topo_order():
        outs = leaf_value(graph, node, inputs, xp)
        if outs is None:
            args = [values[(t.node, t.index)] for t in node.inputs]
            outs = call_kernel(xp, node, args, float64)
        elif float64:
            outs = [_widen(o) for o in outs]
        for i, v in enumerate(outs):
            values[(node.id, i)] = v
    return {name: values[(t.node, t.index)] for name, t in graph.outputs}


def leaf_value(graph: Graph, node: Node, inputs, xp):
    if node.op == INPUT.name:
        name = node.params["name"]
        if name not in inputs:
            raise ExecutionError(f"input {name!r} ({node.outputs[0]}) was not fed")
        arr = xp.asarray(inputs[name])
        if tuple(arr.shape) != node.outputs[0].shape:
            raise ExecutionError(f"input {name!r}: fed shape {list(arr.shape)}, graph expects "
                                 f"{list(node.outputs[0].shape)}")
        return [arr.astype(node.outputs[0].dtype, copy=False)]
    if node.op == WEIGHT.name:
        return [xp.asarray(graph.weight_array(node))]
    return None


def _widen(a):
    return a.astype("float64") if a.dtype.kind == "f" else a


def call_kernel(xp, node: Node, args, float64: bool = False):
    try:
        outs = OPS[node.op].kernel(xp, node.params, *args)
    except TasoEggError:
        raise
    except Exception as e:  # a kernel bug or a device error: name the node
        shapes = ", ".join(str(list(a.shape)) for a in args)
        raise ExecutionError(f"{node.label()} failed on inputs {shapes}: {e}") from e
    # Kernels compute in the inputs' precision; keep the declared dtypes exactly
    # (in float64 mode, floating-point tensors stay double).
    return [o if o.dtype == t.dtype or (float64 and o.dtype.kind == "f" and t.dtype.startswith("float"))
            else o.astype("float64" if float64 and t.dtype.startswith("float") else t.dtype, copy=False)
            for o, t in zip(outs, node.outputs)]
