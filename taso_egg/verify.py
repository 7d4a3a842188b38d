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

    Some graphs (TASO's BERT: attention without softmax is cubic per layer) overflow
    or vanish in float32 on any random input, and a comparison of infinities proves
    nothing. Then the check runs in float64 with the float inputs rescaled, searched
    on a log scale, until the original's outputs are finite and non-negligible; if no
    such scale exists the check fails as inconclusive rather than pass vacuously."""
    from .executor import random_inputs

    feeds = random_inputs(original, seed)
    candidate_inputs = {n.params["name"] for n in candidate.inputs()}
    if candidate_inputs != set(feeds):
        raise VerificationError(f"{what}: inputs {sorted(candidate_inputs)} differ from the "
                                f"original's {sorted(feeds)}")
    _share_weights(original, candidate)
    with np.errstate(all="ignore"):  # overflow is detected below, not warned about
        return _check(original, candidate, feeds, rtol, what)


def _check(original, candidate, feeds, rtol, what) -> float:
    from .executor import run

    expected = run(original, feeds)
    if _well_scaled(expected.values(), 1e-20, 1e30):
        return compare_outputs(expected, run(candidate, feeds), rtol, what)
    lo, hi = -6.0, 6.0  # log10 of the input scale
    for _ in range(24):
        mid = (lo + hi) / 2
        scaled = {k: v * 10 ** mid if v.dtype.kind == "f" else v for k, v in feeds.items()}
        expected = run(original, scaled, float64=True)
        magnitude = _log_magnitude(expected.values())
        if -250 < magnitude < 250:
            return compare_outputs(expected, run(candidate, scaled, float64=True), rtol, what)
        if magnitude >= 250:
            hi = mid
        else:
            lo = mid
    raise VerificationError(f"{what}: inconclusive: the original's outputs overflow or vanish "
                            f"at every input scale tried, so equality cannot be checked")


def _well_scaled(arrays, tiny: float, huge: float) -> bool:
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind != "f" or not a.size:
            continue
        if not np.all(np.isfinite(a)):
            return False
        peak = float(np.max(np.abs(a)))
        if not tiny < peak < huge:
            return False
    return True


def _log_magnitude(arrays) -> float:
    """log10 of the largest float output; +inf on overflow/NaN, -inf when all zero."""
    worst = -np.inf
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind != "f" or not a.size:
            continue
        if not np.all(np.isfinite(a)):
            return np.inf
        peak = float(np.max(np.abs(a)))
        worst = max(worst, np.log10(peak) if peak > 0 else -np.inf)
    return worst


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
