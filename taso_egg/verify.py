"""Numerical equivalence checks: every rewritten or exported graph passes one before
it is returned or written."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from .errors import VerificationError

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
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        err = float(np.max(np.abs(got.astype(np.float64) - ref))) if ref.size else 0.0
        rel = err / max(scale, 1e-12)
        if not np.all(np.isfinite(got) == np.isfinite(ref)) or rel > rtol:
            raise VerificationError(f"{what}: output {name!r} differs from the original by "
                                    f"{err:.3g} (relative {rel:.3g} > {rtol:g})")
        worst = max(worst, rel)
    return worst


def check_graphs_equivalent(original, candidate, seed: int = 0, rtol: float = RTOL,
                            what: str = "optimized graph") -> float:
    """Run both graphs with our executor on the same random inputs and compare."""
    from .executor import random_inputs, run

    feeds = random_inputs(original, seed)
    candidate_inputs = {n.params["name"] for n in candidate.inputs()}
    if candidate_inputs != set(feeds):
        raise VerificationError(f"{what}: inputs {sorted(candidate_inputs)} differ from the "
                                f"original's {sorted(feeds)}")
    _share_weights(original, candidate)
    return compare_outputs(run(original, feeds), run(candidate, feeds), rtol, what)


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
