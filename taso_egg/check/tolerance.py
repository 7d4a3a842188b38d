"""The checks' tolerance policy: how far two results may differ, and when a
difference is round-off rather than a wrong graph.

A difference above a check's fixed floor passes only while it stays within SAFETY
times what perturbing the inputs by one rounding error moves the same outputs
(measured only then, so a passing check costs nothing more): the tolerance follows
the conditioning of what is compared, and a comparison that round-off alone moves by
more than MAX_RTOL fails as inconclusive rather than pass.
"""

from __future__ import annotations

import logging
import math
from typing import Mapping

import numpy as np

from ..errors import VerificationError
from ..ops.precision import ROUNDING_STEP, is_float

log = logging.getLogger("taso_egg.check")


# float32 results of re-associated sums differ in the last bits; compare relative to
# the output's scale so large and small outputs are judged alike.
RTOL = 1e-4
# A region of a few operators in float64 differs from the input's computation of the
# same value by ~1e-14 (round-off) or by far more than 1e-9 (a wrong rewrite).
LOCAL_RTOL = 1e-9
# How far above the measured effect of one rounding error per input a difference may
# lie (round-off is made at every operator, the perturbation only at the leaves).
SAFETY = 16.0
# Beyond this relative noise a comparison cannot tell a wrong graph from round-off.
MAX_RTOL = 0.25
# An output's floor is at least this many rounding steps of the coarsest precision on
# its path (``rounding_steps``): float16's round-off alone is ten times RTOL, and a
# quantized path moves by whole steps where round-off flips a rounding.
FLOOR_STEPS = 4


def compare_outputs(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    rtol: float = RTOL, what: str = "optimized graph") -> float:
    """Raise VerificationError naming the first output that differs by more than
    ``rtol`` (or its dtype's floor, ``output_floor``: float16's round-off is coarser);
    return the worst relative error seen."""
    errors = relative_errors(expected, actual, what)
    for name, rel in errors.items():
        floor = output_floor(ROUNDING_STEP.get(np.asarray(expected[name]).dtype.name, 0.0), rtol)
        if not rel <= floor:
            raise VerificationError(f"{what}: output {name!r} differs from the original by "
                                    f"{rel:.3g} relative (> {floor:g})")
    return max(errors.values(), default=0.0)


def relative_errors(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    what: str = "optimized graph") -> dict[str, float]:
    """Each output's max |actual - expected| / max |expected| (0 or inf for
    non-float outputs: equal or not). VerificationError when names, shapes or dtypes
    differ, or an expected output is not finite (comparing it would prove nothing)."""
    if set(expected) != set(actual):
        raise VerificationError(f"{what}: outputs {sorted(actual)} differ from the original's "
                                f"{sorted(expected)}")
    errors = {}
    for name, ref in expected.items():
        got, ref = np.asarray(actual[name]), np.asarray(ref)
        if got.shape != ref.shape:
            raise VerificationError(f"{what}: output {name!r} has shape {list(got.shape)}, "
                                    f"expected {list(ref.shape)}")
        if ref.dtype.kind != "c" and not is_float(ref.dtype):
            errors[name] = 0.0 if np.array_equal(ref, got) else math.inf
            continue
        ref = ref.astype(np.float64, copy=False) if ref.dtype.kind == "V" else ref
        if ref.size and not np.all(np.isfinite(ref)):
            raise VerificationError(f"{what}: output {name!r} of the original is not finite; "
                                    f"comparing it would prove nothing")
        errors[name] = relative_error(ref, got.astype(np.float64))
    return errors


def relative_error(ref: np.ndarray, got: np.ndarray) -> float:
    """max |got - ref| / max |ref| over finite ``ref`` (inf where ``got`` is not
    finite; a zero ``ref`` is matched only by zeros)."""
    if not ref.size:
        return 0.0
    scale = max_abs(ref)
    err = float(np.max(np.abs(got - ref)))
    if not math.isfinite(err):
        return math.inf
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


def max_abs(a: np.ndarray) -> float:
    # max and min instead of abs: no temporary array the size of ``a``
    return max(float(a.max()), -float(a.min())) if a.size else 0.0


def check_tolerance(error: float, floor: float, noise, what: str, where: str) -> None:
    """Pass ``error`` when it is below ``floor``, or below SAFETY times the measured
    round-off noise (``noise()``, called only then); VerificationError otherwise."""
    if error <= floor:
        return
    measured = noise() if math.isfinite(error) else 0.0
    allowed = max(floor, SAFETY * measured)
    if error <= allowed <= MAX_RTOL:
        log.info("%s: %s differs by %.3g relative, within %g x its round-off noise %.3g",
                 what, where, error, SAFETY, measured)
        return
    if error <= allowed:
        reason = (f"round-off alone moves {where} by {measured:.3g} relative (one rounding error "
                  f"per input), against a difference of {error:.3g}")
        raise Inconclusive(f"{what}: inconclusive: {reason}: a wrong graph cannot be told from "
                            f"round-off", zero=False, reason=reason)
    raise VerificationError(f"{what}: {where} differs from the original by {error:.3g} relative "
                            f"(tolerance {allowed:.3g}: {floor:g}, or {SAFETY:g} x the round-off "
                            f"noise {measured:.3g})")


class Inconclusive(VerificationError):
    def __init__(self, message: str, zero: bool, reason: str = ""):
        super().__init__(message)
        self.zero = zero  # the output is all zeros (rather than not finite or too noisy)
        self.reason = reason


def output_floor(step: float, rtol: float = RTOL) -> float:
    """The difference an output may show whatever the noise: ``rtol``, or FLOOR_STEPS
    rounding steps (``step``: the coarsest on its path, ``rounding_steps``) where that is
    coarser: float16's, and a quantized path's 8 bits (1.6 % of the output's peak, as
    a few roundings that round-off flips move it)."""
    return max(rtol, FLOOR_STEPS * step)
