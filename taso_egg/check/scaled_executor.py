"""The exponent-tracking executor: graphs run in float64 with a power-of-two exponent
per tensor (``run_scaled``), so deep polynomial graphs neither overflow nor vanish."""

from __future__ import annotations

import math

import numpy as np

from ..ops import OPS
from ..ops.precision import ROUNDING_STEP
from .tolerance import max_abs, relative_error


def scaled_error(ref: tuple[np.ndarray, int], got: tuple[np.ndarray, int]) -> float:
    """The relative error of ``got`` against ``ref``, both ``m * 2**e``; non-finite
    entries of ``ref`` must be matched exactly."""
    (m, e), (g, f) = ref, got
    if m.shape != g.shape:
        return math.inf
    if m.dtype.kind != "f" or g.dtype.kind != "f":
        return 0.0 if np.array_equal(m, g) else math.inf
    if np.any(g):
        if f - e >= 1024:
            return math.inf
        g = g * pow2(f - e)  # on the original's scale
    finite = np.isfinite(m)
    if not np.all(finite):
        if not np.array_equal(m[~finite], g[~finite], equal_nan=True):
            return math.inf
        m, g = m[finite], g[finite]
    return relative_error(m, g)


def run_scaled(graph, feeds, wanted=None, perturb=None) -> dict:
    """Run in float64 with a power-of-two exponent tracked per tensor: each value is
    ``m * 2**e`` with ``max|m|`` near 1 and ``e`` a Python int. Returns the outputs by
    name, or with ``wanted`` (a set of ``(node id, output index)``) those tensors by
    key, computing only what they need and freeing each tensor after its last use.
    ``perturb`` (a NumPy Generator) multiplies every float leaf by 1 + one rounding
    error times a standard normal: how much that moves a result is its round-off
    noise.

    Deep polynomial graphs (TASO's BERT: attention without softmax is cubic per layer,
    degree 3**8 after 8 layers) overflow or vanish in any fixed-range float type at
    every input scale but one narrow band; tracking the exponent separately computes
    the same products and sums without leaving float64's range."""
    keys = wanted if wanted is not None else {(t.node, t.index) for _, t in graph.outputs}
    out: dict = {}
    for key, value in scaled_values(graph, feeds, keys, perturb):
        out[key] = value
    if wanted is not None:
        return out
    return {name: out[(t.node, t.index)] for name, t in graph.outputs}


def scaled_values(graph, feeds, wanted, perturb=None, dtype=np.float64):
    """Yield ``(key, value)`` for each wanted tensor as ``graph`` computes it (in
    topological order), running only the nodes the wanted tensors depend on and
    holding each intermediate only until its last consumer has run. Float tensors
    are computed in ``dtype``."""
    from ..executor import leaf_value

    needed = {k[0] for k in wanted}
    order = graph.topo_order()
    for node in reversed(order):
        if node.id in needed:
            needed.update(t.node for t in node.inputs)
    uses: dict[tuple[int, int], int] = {}
    for node in order:
        if node.id in needed:
            for t in node.inputs:
                uses[(t.node, t.index)] = uses.get((t.node, t.index), 0) + 1
    values: dict[tuple[int, int], tuple[np.ndarray, int]] = {}
    for node in order:
        if node.id not in needed:
            continue
        outs = scaled_leaf(graph, node, feeds, leaf_value, perturb, dtype)
        if outs is None:
            outs = scaled_apply(node, [values[(t.node, t.index)] for t in node.inputs])
            for t in node.inputs:
                key = (t.node, t.index)
                uses[key] -= 1
                if not uses[key]:
                    del values[key]
        for i, v in enumerate(outs):
            key = (node.id, i)
            if key in wanted:
                yield key, v
            if uses.get(key):
                values[key] = v


def scaled_leaf(graph, node, feeds, leaf_value, perturb=None, dtype=np.float64):
    leaf = leaf_value(graph, node, feeds, np)
    if leaf is None:
        return None
    outs = []
    for a in leaf:
        if a.dtype.kind == "f":
            m = a.astype(dtype, copy=False)
            if perturb is not None:
                m = m * (1 + ROUNDING_STEP["float64"] * perturb.standard_normal(a.shape))
            elif m is a:  # the graph's own data, not copied: left as it is unless far from 1
                peak = max_abs(m)
                if peak == 0 or not math.isfinite(peak) or abs(math.frexp(peak)[1]) <= 16:
                    outs.append((m, 0))
                    continue
            outs.append(normalize(m, 0, owned=m is not a))
        else:
            outs.append((a, 0))
    return outs


# operators whose output holds exactly its input's entries, rearranged
_PERMUTATIONS = ("reshape", "transpose")


def scaled_apply(node, args) -> list[tuple[np.ndarray, int]]:
    from ..executor import call_kernel

    spec = OPS[node.op]
    scaling, act = spec.scaling, node.params.get("activation", "NONE")
    mantissas = [m for m, _ in args]
    # kernel outputs that are fresh arrays may be rescaled in place; views (reshape,
    # transpose, split) and leaves' data may not
    owned = not (spec.is_view or spec.is_leaf)
    if all(m.dtype.kind == "f" for m in mantissas):
        if node.op in _PERMUTATIONS:  # the same entries: the same peak, no pass to find it
            return [(o, args[0][1]) for o in call_kernel(np, node, mantissas, True)]
        if scaling == "multilinear" and act in ("NONE", "RELU") and \
                not (node.op == "conv2d" and len(args) == 3):  # a bias makes conv affine
            exponent = sum(e for _, e in args)
            return [normalize(o, exponent, owned and _fresh(o, mantissas))
                    for o in call_kernel(np, node, mantissas, True)]
        if scaling == "first":
            return [normalize(o, args[0][1], owned and _fresh(o, mantissas))
                    for o in call_kernel(np, node, mantissas, True)]
        if scaling == "additive":
            top = max(e for _, e in args)
            aligned = [m * pow2(e - top) if e != top else m for m, e in args]
            return [normalize(o, top, owned and _fresh(o, aligned))
                    for o in call_kernel(np, node, aligned, True)]
    with np.errstate(over="ignore"):  # tanh/sigmoid of an infinite input is still exact
        true = [np.ldexp(m, e) if m.dtype.kind == "f" else m for m, e in args]
    return [normalize(o, 0, owned and _fresh(o, true)) for o in call_kernel(np, node, true, True)]


def _fresh(out: np.ndarray, args) -> bool:
    return out.base is None and not any(out is a for a in args)


def normalize(m: np.ndarray, e: int, owned: bool = False) -> tuple[np.ndarray, int]:
    """Rescale so that max|m| lies in [0.5, 1); zero or non-finite arrays keep e.
    ``owned``: ``m`` is ours to rescale in place."""
    if m.dtype.kind != "f" or not m.size:
        return m, e
    peak = max_abs(m)
    if peak == 0.0 or not np.isfinite(peak):
        return m, e
    shift = int(np.frexp(peak)[1])
    if shift == 0:  # a view of a normalized tensor (reshape, transpose, split) stays as it is
        return m, e
    if abs(shift) >= 1000:
        return np.ldexp(m, -shift), e + shift
    if owned and m.flags.writeable:
        m *= pow2(-shift)
        return m, e + shift
    return m * pow2(-shift), e + shift


def pow2(k: int) -> float:
    # A multiply by an exact power of two is ~10x faster than np.ldexp on big arrays.
    return math.ldexp(1.0, k) if k > -1075 else 0.0
