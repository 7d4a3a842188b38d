"""``check_onnx_model``: two ONNX models in onnxruntime (float32) on random inputs, the
runtime users deploy. It proves nothing where the input's float32 outputs are not
finite or are all zero, and it says so (``OnnxCheck.skipped``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import VerificationError, first_line
from ..ops.precision import ROUNDING_STEP, is_float
from .onnx_precision import rounding_steps
from .tolerance import RTOL, Inconclusive, check_tolerance, output_floor, relative_error, relative_errors


def onnx_outputs(model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an ONNX model in onnxruntime (all graph optimizations off: we want the
    model's own arithmetic). ``model`` is a path, bytes, a ModelProto, a
    ``onnx_io.fed.FedModel`` (its arrays fed as inputs, not serialized), or a
    ``(ModelProto, weights)`` pair from ``onnx_io.exporter.export_for_check``, whose
    weights are fed with the inputs (onnxruntime reads NumPy feeds in place)."""
    import onnxruntime as ort

    from ..onnx_io.fed import weights_as_inputs

    if isinstance(model, tuple):
        model, weights = model
        feeds = {**feeds, **weights}
    if not isinstance(model, (bytes, str)):
        # the large weights fed as inputs, which onnxruntime reads in place (it copies
        # initializers into each session: a second copy of every weight while it runs)
        model, weights = weights_as_inputs(model)
        feeds = {**feeds, **weights}
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4  # fatal only: a failed run raises, with its message, here
    # no prepacked copy of the weights, for models read from a file too: a run or two
    # does not pay for it, and fed weights, being inputs, are not prepacked either
    options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, dict(feeds))))


@dataclass
class OnnxCheck:
    error: float | None   # the worst relative error; None when skipped
    skipped: str = ""     # why the comparison would prove nothing, when it is skipped
    # False when the model's own outputs proved nothing, so the reference was neither
    # made nor run: whether the reference's prove nothing too is then still to be
    # known (``LocalCheck.outputs_beyond_float32``, or ``check_float32_proves_nothing``)
    reference_run: bool = True


def check_onnx_model(reference, model, graph, seed: int = 0, rtol: float = RTOL,
                     what: str = "optimized model in onnxruntime", feeds=None,
                     reference_outputs: dict | None = None) -> OnnxCheck:
    """ONNX ``model`` against ``reference`` (an ONNX model, or a callable that makes
    one) in onnxruntime (float32) on random inputs for ``graph`` (the graph both
    compute), or on ``feeds`` where given. Skipped, with the reason, where the comparison would prove nothing:
    onnxruntime cannot run the reference, a float output is not finite or is all
    zeros on these inputs, or round-off alone moves it by more than MAX_RTOL. The
    model runs first; where its outputs prove nothing the reference is not made or
    run (``reference_run``: TASO's BERT spends ~2 s there to overflow too).
    VerificationError when they differ beyond ``rtol`` and SAFETY times the
    reference's round-off noise (its outputs' change when the inputs move by one
    float32 rounding error), or when the model does not run where the reference does.
    ``reference_outputs``: a dict that keeps the reference's outputs on these inputs, for
    checks of several models against one reference on the same inputs (made once)."""
    from ..executor import random_inputs

    feeds = random_inputs(graph, seed) if feeds is None else feeds
    made: list = []

    def ref():
        if not made:
            made.append(reference() if callable(reference) else reference)
        return made[0]

    try:
        actual = onnx_outputs(model, feeds)
    except Exception as e:  # onnxruntime's own error types: any means it cannot run it
        try:
            onnx_outputs(ref(), feeds)
        except Exception as e_ref:
            return OnnxCheck(None, f"onnxruntime cannot run the input model ({first_line(e_ref)})")
        raise VerificationError(f"{what}: the model does not run: {first_line(e)}") from None
    why = _proves_nothing(actual)
    if why and not _overflows(actual):
        return OnnxCheck(None, "the written model's " + why, reference_run=False)
    try:
        expected = reference_outputs["outputs"] if reference_outputs and "outputs" in reference_outputs else \
            onnx_outputs(ref(), feeds)
    except Exception as e:
        return OnnxCheck(None, f"onnxruntime cannot run the input model ({first_line(e)})")
    if reference_outputs is not None:
        reference_outputs["outputs"] = expected
    overflow = _overflows(actual) or _overflows(expected)
    if overflow:
        # What is deployed runs in float32: the written model must overflow where the
        # input does, and only there (float64 would call both finite and equal), and
        # agree with it where both are finite; the float64 check then runs too.
        differs = _non_finite_difference(expected, actual)
        if differs:
            raise VerificationError(f"{what}: {differs}: the written model overflows where the input "
                                    f"does not, or the other way round")
        why = "the written model's " + why if why else "the input's " + _proves_nothing(expected)
        expected, actual = _finite_part(expected), _finite_part(actual)
    else:
        why = _proves_nothing(expected)
        if why:
            return OnnxCheck(None, "the input's " + why)
    errors = relative_errors(expected, actual, what)
    steps = rounding_steps(ref())
    floors = {name: output_floor(steps.get(name, ROUNDING_STEP["float32"]), rtol) for name in errors}
    name = max(errors, key=lambda n: errors[n] / floors[n], default=None)
    if name is not None and errors[name] > floors[name]:
        # the inputs only (the weights are inside the model), each moved by one
        # rounding step of the coarsest precision on the output's path
        rng = np.random.default_rng(seed + 2)
        step = steps.get(name, ROUNDING_STEP["float32"])
        noisy = {k: (v * (1 + step * rng.standard_normal(v.shape))).astype(v.dtype)
                 if is_float(v.dtype) else v for k, v in feeds.items()}
        try:
            check_tolerance(errors[name], floors[name],
                       lambda: relative_error(expected[name].astype(np.float64),
                                         onnx_outputs(ref(), noisy)[name].astype(np.float64)),
                       what, f"output {name!r}")
        except Inconclusive as e:  # float32 cannot tell; float64 may
            return OnnxCheck(None, f"in {expected[name].dtype.name} {e.reason}")
    worst = max(errors.values(), default=0.0)
    if overflow:
        return OnnxCheck(None, f"{why} (where the input's is, and equal to it within {worst:.2g} "
                               f"relative where finite)")
    return OnnxCheck(worst)


def check_float32_proves_nothing(reference, graph, skipped: str, seed: int = 0,
                                 what: str = "optimized model in onnxruntime") -> None:
    """Where the written model's float32 outputs proved nothing (``skipped``), the
    reference's must not prove something: else the model overflows (or vanishes)
    where the input does not, a VerificationError."""
    from ..executor import random_inputs

    feeds = random_inputs(graph, seed)
    try:
        expected = onnx_outputs(reference, feeds)
    except Exception:  # onnxruntime's own error types
        return
    if not _proves_nothing(expected):
        raise VerificationError(f"{what}: {skipped}, but the input's are finite and not all zero: "
                                f"the written model overflows or vanishes where the input does not")


def _overflows(outputs) -> bool:
    """Whether a float output holds an Inf or a NaN."""
    return any(is_float(v.dtype) and v.size and not np.all(np.isfinite(v)) for v in outputs.values())


def _non_finite_difference(expected, actual) -> str:
    """"" when every output holds its NaNs, +Infs and -Infs in the same places in
    ``expected`` and ``actual``; else which output differs, and how much."""
    for name, ref in expected.items():
        got = actual.get(name)
        if not is_float(ref.dtype) or got is None or got.shape != ref.shape:
            continue
        differ = (np.isnan(ref) != np.isnan(got)) | (np.isposinf(ref) != np.isposinf(got)) | \
            (np.isneginf(ref) != np.isneginf(got))
        if differ.any():
            return (f"{ref.dtype.name} output {name!r} is not finite in {int((~np.isfinite(got)).sum())} of its "
                    f"{got.size} values, the input's in {int((~np.isfinite(ref)).sum())} ({int(differ.sum())} "
                    f"places differ, random inputs)")
    return ""


def _finite_part(outputs):
    """Each float output with its non-finite values set to 0 (compared apart)."""
    return {k: np.where(np.isfinite(v), v, 0).astype(v.dtype) if is_float(v.dtype) else v
            for k, v in outputs.items()}


def _proves_nothing(outputs) -> str:
    for name, v in outputs.items():
        if is_float(v.dtype) and v.size and not np.all(np.isfinite(v)):
            return f"{v.dtype.name} output {name!r} is not finite on random inputs"
        if is_float(v.dtype) and v.size and not np.any(v):
            return f"output {name!r} is all zeros on random inputs"
    return ""
