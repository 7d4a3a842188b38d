"""Numerical equivalence checks: every rewritten or exported graph passes one before
it is returned or written."""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Mapping

import numpy as np

from .errors import VerificationError
from .ops import OPS

log = logging.getLogger("taso_egg.verify")

# float32 results of re-associated sums differ in the last bits; compare relative to
# the output's scale so large and small outputs are judged alike.
RTOL = 1e-4


def compare_outputs(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    rtol: float = RTOL, what: str = "optimized graph") -> float:
    """Raise VerificationError naming the first disagreeing output; return the worst
    relative error seen."""
    if set(expected) != set(actual):
        raise VerificationError(f"{what}: outputs {sorted(actual)} differ from the original's "
                                f"{sorted(expected)}")
    worst = 0.0
    for name, ref in expected.items():
        got = np.asarray(actual[name])
        ref = np.asarray(ref)
        if got.shape != ref.shape:
            raise VerificationError(f"{what}: output {name!r} has shape {list(got.shape)}, "
                                    f"expected {list(ref.shape)}")
        if ref.dtype.kind not in "fc":
            if not np.array_equal(ref, got):
                raise VerificationError(f"{what}: output {name!r} ({ref.dtype}) differs")
            continue
        if ref.size and not np.all(np.isfinite(ref)):
            raise VerificationError(f"{what}: output {name!r} of the original is not finite; "
                                    f"comparing it would prove nothing")
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        err = float(np.max(np.abs(got.astype(np.float64) - ref))) if ref.size else 0.0
        rel = err / max(scale, 1e-300)
        if not np.all(np.isfinite(got)) or not rel <= rtol:
            raise VerificationError(f"{what}: output {name!r} differs from the original by "
                                    f"{err:.3g} (relative {rel:.3g} > {rtol:g})")
        worst = max(worst, rel)
    return worst


def check_graphs_equivalent(original, candidate, seed: int = 0, rtol: float = RTOL,
                            what: str = "optimized graph") -> float:
    """Run both graphs with our executor on the same random inputs and compare.

    Both run in float64 with a tracked exponent per tensor (``run_scaled``): some
    graphs (TASO's BERT: attention without softmax is cubic per layer) overflow or
    vanish in any fixed-range float type on almost every input, and a comparison of
    infinities proves nothing. If even then the original's outputs are not finite and
    non-zero, the check fails as inconclusive rather than pass vacuously, with one
    exception: outputs that are zero because weights are (torchvision initializes
    ViT's classifier head to zeros) are checked again with random stand-ins for the
    all-zero weights, in both graphs alike. Rewrites hold for any weight values, so
    agreeing there is agreeing on the model's own weights too, and it tests the graph
    above the zeros, which the zero outputs hide."""
    from .executor import random_inputs

    feeds = random_inputs(original, seed)
    candidate_inputs = {n.params["name"] for n in candidate.inputs()}
    if candidate_inputs != set(feeds):
        raise VerificationError(f"{what}: inputs {sorted(candidate_inputs)} differ from the "
                                f"original's {sorted(feeds)}")
    _share_weights(original, candidate)
    with np.errstate(all="ignore"):  # overflow is detected below, not warned about
        try:
            return _check(original, candidate, feeds, rtol, what)
        except _Inconclusive as e:
            zero = [n for n in original.weights() if _all_zero(original.weight_array(n))]
            if not e.zero or not zero:
                raise VerificationError(str(e)) from None
            names = ", ".join(n.params["name"] for n in zero[:3]) + (" ..." if len(zero) > 3 else "")
            log.warning("note: an output is all zeros on the model's weights, which would make "
                        "the check vacuous; %d all-zero weight(s) (%s) get random stand-ins in "
                        "both graphs and the check runs again", len(zero), names)
            with _stand_ins(original, candidate, zero, seed):
                return _check(original, candidate, feeds, rtol, what + " (zero weights replaced)")


class _Inconclusive(VerificationError):
    def __init__(self, message: str, zero: bool):
        super().__init__(message)
        self.zero = zero  # the output is all zeros (rather than not finite)


def _all_zero(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and a.size > 0 and not np.any(a)


@contextmanager
def _stand_ins(original, candidate, weights, seed: int):
    """Random data for the given all-zero weights of ``original`` and for the
    candidate's weights of the same names, put back on exit."""
    rng = np.random.default_rng(seed + 1)
    data = {n.params["name"]: rng.standard_normal(n.params["shape"]).astype(n.params["dtype"])
            for n in weights}
    saved = []
    for g in (original, candidate):
        for n in g.weights():
            if n.params["name"] in data:
                saved.append((g, n.id, g.weight_data.get(n.id)))
                g.weight_data[n.id] = data[n.params["name"]]
    try:
        yield
    finally:
        for g, node_id, old in reversed(saved):  # the same graph may come twice
            if old is None:
                g.weight_data.pop(node_id, None)
            else:
                g.weight_data[node_id] = old


def _check(original, candidate, feeds, rtol, what) -> float:
    ref, got = run_scaled(original, feeds), run_scaled(candidate, feeds)
    expected, actual = {}, {name: m for name, (m, _) in got.items()}
    for name, (m, e) in ref.items():
        if m.dtype.kind == "f" and m.size and not (np.all(np.isfinite(m)) and np.any(m)):
            raise _Inconclusive(f"{what}: inconclusive: the original's output {name!r} is "
                                f"not finite and non-zero even with tracked exponents, so "
                                f"equality cannot be checked", zero=bool(np.all(m == 0)))
        expected[name] = m
        if name in got and m.dtype.kind == "f":  # both on the original's scale
            actual[name] = got[name][0] * _pow2(got[name][1] - e) if got[name][1] - e < 1024 \
                else np.full_like(m, np.inf)
    return compare_outputs(expected, actual, rtol, what)


def run_scaled(graph, feeds) -> dict[str, tuple[np.ndarray, int]]:
    """Run in float64 with a power-of-two exponent tracked per tensor: each value is
    ``m * 2**e`` with ``max|m|`` near 1 and ``e`` a Python int.

    Deep polynomial graphs (TASO's BERT: attention without softmax is cubic per layer,
    degree 3**8 after 8 layers) overflow or vanish in any fixed-range float type at
    every input scale but one narrow band; tracking the exponent separately computes
    the same products and sums without leaving float64's range."""
    from .executor import leaf_value

    values: dict[tuple[int, int], tuple[np.ndarray, int]] = {}
    for node in graph.topo_order():
        leaf = leaf_value(graph, node, feeds, np)
        if leaf is not None:
            outs = [_normalize(a.astype(np.float64) if a.dtype.kind == "f" else a, 0) for a in leaf]
        else:
            outs = _scaled_apply(node, [values[(t.node, t.index)] for t in node.inputs])
        for i, v in enumerate(outs):
            values[(node.id, i)] = v
    return {name: values[(t.node, t.index)] for name, t in graph.outputs}


def _scaled_apply(node, args) -> list[tuple[np.ndarray, int]]:
    from .executor import call_kernel

    scaling, act = OPS[node.op].scaling, node.params.get("activation", "NONE")
    mantissas = [m for m, _ in args]
    if all(m.dtype.kind == "f" for m in mantissas):
        if scaling == "multilinear" and act in ("NONE", "RELU") and \
                not (node.op == "conv2d" and len(args) == 3):  # a bias makes conv affine
            exponent = sum(e for _, e in args)
            return [_normalize(o, exponent) for o in call_kernel(np, node, mantissas, True)]
        if scaling == "first":
            return [_normalize(o, args[0][1]) for o in call_kernel(np, node, mantissas, True)]
        if scaling == "additive":
            top = max(e for _, e in args)
            aligned = [m * _pow2(e - top) for m, e in args]
            return [_normalize(o, top) for o in call_kernel(np, node, aligned, True)]
    with np.errstate(over="ignore"):  # tanh/sigmoid of an infinite input is still exact
        true = [np.ldexp(m, e) if m.dtype.kind == "f" else m for m, e in args]
    return [_normalize(o, 0) for o in call_kernel(np, node, true, True)]


def _normalize(m: np.ndarray, e: int) -> tuple[np.ndarray, int]:
    """Rescale so that max|m| lies in [0.5, 1); zero or non-finite arrays keep e."""
    if m.dtype.kind != "f" or not m.size:
        return m, e
    peak = float(np.max(np.abs(m)))
    if peak == 0.0 or not np.isfinite(peak):
        return m, e
    shift = int(np.frexp(peak)[1])
    return (m * _pow2(-shift) if abs(shift) < 1000 else np.ldexp(m, -shift)), e + shift


def _pow2(k: int) -> float:
    # A multiply by an exact power of two is ~10x faster than np.ldexp on big arrays.
    return math.ldexp(1.0, k) if k > -1075 else 0.0


def _share_weights(original, candidate) -> None:
    """Weights are identified by name: give the candidate the original's data."""
    by_name = {n.params["name"]: n for n in original.weights()}
    for n in candidate.weights():
        src = by_name.get(n.params["name"])
        if src is not None and n.id not in candidate.weight_data:
            candidate.weight_data[n.id] = original.weight_array(src)


def onnx_outputs(model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an ONNX model in onnxruntime (all graph optimizations off: we want the
    model's own arithmetic)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, dict(feeds))))


def check_onnx_model(reference, model, graph, note=None) -> float | None:
    """The relative error of ONNX ``model`` against ONNX ``reference`` in onnxruntime
    (float32) on random inputs for ``graph`` (the graph both compute); None when the
    reference's outputs are not finite on them (``graph``'s check in float64 with
    tracked exponents is then the only one; float32 cannot say more), with a
    ``note(message)``. VerificationError when they differ."""
    from .executor import random_inputs

    feeds = random_inputs(graph)
    expected = onnx_outputs(reference, feeds)
    if all(np.all(np.isfinite(v)) for v in expected.values() if v.dtype.kind == "f"):
        return compare_outputs(expected, onnx_outputs(model, feeds), what="optimized model in onnxruntime")
    if note is not None:
        note("note: the model's float32 outputs overflow on random inputs, so the "
             "onnxruntime cross-check is skipped; the graph check passed")
    return None
