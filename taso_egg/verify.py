"""Numerical equivalence checks: every rewritten or exported graph passes one before
it is returned or written.

- ``check_onnx_model``: two ONNX models in onnxruntime (float32) on random inputs, the
  runtime users deploy. It proves nothing where the input's float32 outputs are not
  finite or are all zero, and it says so (``OnnxCheck.skipped``).
- ``check_locally``: an extracted graph against its input, region by region (float64,
  tracked exponents). Each tensor the extraction built carries the e-class it came
  from; the input's tensors have classes too. A node of the result that repeats an
  input node (same operator and parameters, same input and output classes) is not
  recomputed; every other node is computed from the input's own tensors at its
  region's boundary and compared with what the input computes of the same class
  (from the same boundary values; through random projections where matmuls make it).
  Errors do not compound through depth, so deep ill-conditioned graphs (TASO's BERT
  at 32 layers) are checked as tightly as shallow ones.
- ``check_graphs_equivalent``: any two graphs, whole (float64, tracked exponents).

A difference above a check's fixed floor passes only while it stays within SAFETY
times what perturbing the inputs by one rounding error moves the same outputs
(measured only then, so a passing check costs nothing more): the tolerance follows
the conditioning of what is compared, and a comparison that round-off alone moves by
more than MAX_RTOL fails as inconclusive rather than pass.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .errors import VerificationError, first_line
from .ops import OPS
from .ops.precision import NARROW_DTYPES, ROUNDING_STEP, is_float, is_quantizing

log = logging.getLogger("taso_egg.verify")

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

_EPS = ROUNDING_STEP


def compare_outputs(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    rtol: float = RTOL, what: str = "optimized graph") -> float:
    """Raise VerificationError naming the first output that differs by more than
    ``rtol`` (or its dtype's floor, ``output_floor``: float16's round-off is coarser);
    return the worst relative error seen."""
    errors = relative_errors(expected, actual, what)
    for name, rel in errors.items():
        floor = output_floor(_EPS.get(np.asarray(expected[name]).dtype.name, 0.0), rtol)
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
        errors[name] = _relative(ref, got.astype(np.float64))
    return errors


def _relative(ref: np.ndarray, got: np.ndarray) -> float:
    """max |got - ref| / max |ref| over finite ``ref`` (inf where ``got`` is not
    finite; a zero ``ref`` is matched only by zeros)."""
    if not ref.size:
        return 0.0
    scale = _peak(ref)
    err = float(np.max(np.abs(got - ref)))
    if not math.isfinite(err):
        return math.inf
    return err / scale if scale > 0 else (0.0 if err == 0 else math.inf)


def _peak(a: np.ndarray) -> float:
    # max and min instead of abs: no temporary array the size of ``a``
    return max(float(a.max()), -float(a.min())) if a.size else 0.0


def _tolerance(error: float, floor: float, noise, what: str, where: str) -> None:
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
        raise _Inconclusive(f"{what}: inconclusive: {reason}: a wrong graph cannot be told from "
                            f"round-off", zero=False, reason=reason)
    raise VerificationError(f"{what}: {where} differs from the original by {error:.3g} relative "
                            f"(tolerance {allowed:.3g}: {floor:g}, or {SAFETY:g} x the round-off "
                            f"noise {measured:.3g})")


# --- whole graphs -------------------------------------------------------------------------

def check_graphs_equivalent(original, candidate, seed: int = 0, rtol: float = RTOL,
                            what: str = "optimized graph") -> float:
    """Run both graphs with our executor on the same random inputs and compare.

    Both run in float64 with a tracked exponent per tensor (``run_scaled``): some
    graphs (TASO's BERT: attention without softmax is cubic per layer) overflow or
    vanish in any fixed-range float type on almost every input, and a comparison of
    infinities proves nothing. A difference above ``rtol`` passes only within SAFETY
    times the outputs' round-off noise (BERT's grows 3x per layer: 1e-2 relative at
    32 layers). If even then the original's outputs are not finite and
    non-zero, the check fails as inconclusive rather than pass vacuously, with one
    exception: outputs that are zero because weights are (torchvision initializes
    ViT's classifier head to zeros) are checked again with random stand-ins for the
    all-zero weights, in both graphs alike. Rewrites hold for any weight values, so
    agreeing there is agreeing on the model's own weights too, and it tests the graph
    above the zeros, which the zero outputs hide."""
    from .executor import random_inputs

    feeds = random_inputs(original, seed)
    _same_inputs(candidate, feeds, what)
    share_weights(original, candidate)
    with np.errstate(all="ignore"):  # overflow is detected below, not warned about
        try:
            return _check(original, candidate, feeds, rtol, what, seed)
        except _Inconclusive as e:
            zero = _zero_weights(original)
            if not e.zero or not zero:
                raise VerificationError(str(e)) from None
            _note_stand_ins(zero)
            with _stand_ins(original, candidate, zero, seed):
                return _check(original, candidate, feeds, rtol, what + " (zero weights replaced)", seed)


class _Inconclusive(VerificationError):
    def __init__(self, message: str, zero: bool, reason: str = ""):
        super().__init__(message)
        self.zero = zero  # the output is all zeros (rather than not finite or too noisy)
        self.reason = reason


def _same_inputs(candidate, feeds, what: str) -> None:
    names = {n.params["name"] for n in candidate.inputs()}
    if names != set(feeds):
        raise VerificationError(f"{what}: inputs {sorted(names)} differ from the original's {sorted(feeds)}")


def _all_zero(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" and a.size > 0 and not np.any(a)


def _zero_weights(graph) -> list:
    return [n for n in graph.weights() if _all_zero(graph.weight_array(n))]


def _note_stand_ins(zero) -> None:
    names = ", ".join(n.params["name"] for n in zero[:3]) + (" ..." if len(zero) > 3 else "")
    log.warning("note: %d all-zero weight(s) (%s) would make the check vacuous where they "
                "zero what follows; they get random stand-ins in both graphs", len(zero), names)


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


def _check(original, candidate, feeds, rtol, what, seed) -> float:
    ref, got = run_scaled(original, feeds), run_scaled(candidate, feeds)
    if set(ref) != set(got):
        raise VerificationError(f"{what}: outputs {sorted(got)} differ from the original's {sorted(ref)}")
    errors = {}
    for name, (m, e) in ref.items():
        if m.dtype.kind == "f" and m.size and not (np.all(np.isfinite(m)) and np.any(m)):
            raise _Inconclusive(f"{what}: inconclusive: the original's output {name!r} is "
                                f"not finite and non-zero even with tracked exponents, so "
                                f"equality cannot be checked", zero=bool(np.all(m == 0)))
        if got[name][0].shape != m.shape:
            raise VerificationError(f"{what}: output {name!r} has shape {list(got[name][0].shape)}, "
                                    f"expected {list(m.shape)}")
        errors[name] = _scaled_error((m, e), got[name])
    worst = max(errors.values(), default=0.0)
    if worst > rtol:
        name = max(errors, key=errors.get)
        perturbed = run_scaled(original, feeds, perturb=np.random.default_rng(seed + 2))
        _tolerance(worst, rtol, lambda: _scaled_error(ref[name], perturbed[name]), what,
                   f"output {name!r}")
    return worst


def _scaled_error(ref: tuple[np.ndarray, int], got: tuple[np.ndarray, int]) -> float:
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
        g = g * _pow2(f - e)  # on the original's scale
    finite = np.isfinite(m)
    if not np.all(finite):
        if not np.array_equal(m[~finite], g[~finite], equal_nan=True):
            return math.inf
        m, g = m[finite], g[finite]
    return _relative(m, g)


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
    for key, value in _scaled_values(graph, feeds, keys, perturb):
        out[key] = value
    if wanted is not None:
        return out
    return {name: out[(t.node, t.index)] for name, t in graph.outputs}


def _scaled_values(graph, feeds, wanted, perturb=None, dtype=np.float64):
    """Yield ``(key, value)`` for each wanted tensor as ``graph`` computes it (in
    topological order), running only the nodes the wanted tensors depend on and
    holding each intermediate only until its last consumer has run. Float tensors
    are computed in ``dtype``."""
    from .executor import leaf_value

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
        outs = _scaled_leaf(graph, node, feeds, leaf_value, perturb, dtype)
        if outs is None:
            outs = _scaled_apply(node, [values[(t.node, t.index)] for t in node.inputs])
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


def _scaled_leaf(graph, node, feeds, leaf_value, perturb=None, dtype=np.float64):
    leaf = leaf_value(graph, node, feeds, np)
    if leaf is None:
        return None
    outs = []
    for a in leaf:
        if a.dtype.kind == "f":
            m = a.astype(dtype, copy=False)
            if perturb is not None:
                m = m * (1 + _EPS["float64"] * perturb.standard_normal(a.shape))
            elif m is a:  # the graph's own data, not copied: left as it is unless far from 1
                peak = _peak(m)
                if peak == 0 or not math.isfinite(peak) or abs(math.frexp(peak)[1]) <= 16:
                    outs.append((m, 0))
                    continue
            outs.append(_normalize(m, 0, owned=m is not a))
        else:
            outs.append((a, 0))
    return outs


# operators whose output holds exactly its input's entries, rearranged
_PERMUTATIONS = ("reshape", "transpose")


def _scaled_apply(node, args) -> list[tuple[np.ndarray, int]]:
    from .executor import call_kernel

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
            return [_normalize(o, exponent, owned and _fresh(o, mantissas))
                    for o in call_kernel(np, node, mantissas, True)]
        if scaling == "first":
            return [_normalize(o, args[0][1], owned and _fresh(o, mantissas))
                    for o in call_kernel(np, node, mantissas, True)]
        if scaling == "additive":
            top = max(e for _, e in args)
            aligned = [m * _pow2(e - top) if e != top else m for m, e in args]
            return [_normalize(o, top, owned and _fresh(o, aligned))
                    for o in call_kernel(np, node, aligned, True)]
    with np.errstate(over="ignore"):  # tanh/sigmoid of an infinite input is still exact
        true = [np.ldexp(m, e) if m.dtype.kind == "f" else m for m, e in args]
    return [_normalize(o, 0, owned and _fresh(o, true)) for o in call_kernel(np, node, true, True)]


def _fresh(out: np.ndarray, args) -> bool:
    return out.base is None and not any(out is a for a in args)


def _normalize(m: np.ndarray, e: int, owned: bool = False) -> tuple[np.ndarray, int]:
    """Rescale so that max|m| lies in [0.5, 1); zero or non-finite arrays keep e.
    ``owned``: ``m`` is ours to rescale in place."""
    if m.dtype.kind != "f" or not m.size:
        return m, e
    peak = _peak(m)
    if peak == 0.0 or not np.isfinite(peak):
        return m, e
    shift = int(np.frexp(peak)[1])
    if shift == 0:  # a view of a normalized tensor (reshape, transpose, split) stays as it is
        return m, e
    if abs(shift) >= 1000:
        return np.ldexp(m, -shift), e + shift
    if owned and m.flags.writeable:
        m *= _pow2(-shift)
        return m, e + shift
    return m * _pow2(-shift), e + shift


def _pow2(k: int) -> float:
    # A multiply by an exact power of two is ~10x faster than np.ldexp on big arrays.
    return math.ldexp(1.0, k) if k > -1075 else 0.0


def share_weights(original, candidate) -> None:
    """Weights are identified by name: give the candidate the original's data."""
    by_name = {n.params["name"]: n for n in original.weights()}
    for n in candidate.weights():
        src = by_name.get(n.params["name"])
        if src is not None and n.id not in candidate.weight_data:
            candidate.weight_data[n.id] = original.weight_array(src)


# --- region by region ---------------------------------------------------------------------

@dataclass
class LocalCheck:
    """What ``check_locally`` compared."""

    error: float       # the worst relative error of a recomputed tensor against the input's
    regions: int       # changed regions computed and compared
    recomputed: int    # result nodes computed (the others repeat an input node)
    nodes: int         # result nodes in all, leaves included
    input_nodes_run: int  # the input's nodes run for the values the regions read and compare
    compared: int      # tensors compared
    projected: int     # of those, compared through random projections (``PROJECTIONS`` columns)
    rechecked: int     # projected groups past their floor, so compared whole after all
    # True: each region against the input's own operators run from the same boundary
    # values (the input's tensors computed in float32); False: against the input's
    # tensors computed in float64 (where a boundary does not cut the input's
    # computation, classes are shared, or the first way fails)
    cones: bool = False
    # with ``outputs``: whether an output of the input lies beyond float32's range (then
    # no float32 run of it proves anything); None when not asked
    outputs_beyond_float32: bool | None = None


def check_locally(original, candidate, original_classes: Mapping, candidate_classes: Mapping,
                  seed: int = 0, rtol: float = LOCAL_RTOL, what: str = "optimized graph",
                  outputs: bool = False) -> LocalCheck:
    """Check ``candidate`` (an extracted graph) against ``original`` (its input) region
    by region, in float64 with tracked exponents, on random inputs.

    ``original_classes`` and ``candidate_classes`` map ``(node id, output index)`` to
    the e-class the tensor belongs to (the claim to check: equal classes, equal values).
    A candidate node that repeats an input node, the same operator and parameters with
    inputs and outputs of the same classes, computes what that node computes and is
    not recomputed. Every other node is computed, with connected ones grouped into
    regions through the tensors no input tensor shares a class with; a region's inputs
    are the input graph's own tensors of the classes at its boundary, and each tensor
    it produces of such a class is compared with the input's. The input's tensors that
    share a class are compared with each other, and the outputs' classes must be the
    input's. By induction over the candidate's order every tensor then equals the
    input's of its class, outputs included, to within ``rtol`` per region (or SAFETY
    times the region's round-off noise, measured only when ``rtol`` is exceeded).

    Two ways (``LocalCheck.cones``). First: the input's tensors regions read are
    computed in float32 (tracked exponents), and each region is compared with its
    cone, the input's own operators from the classes it reads to the classes it makes,
    run in float64 from the same values; both sides then start from the same numbers,
    however far float32's round-off has moved them from float64's. Where a region's
    cone reaches a graph input (its boundary does not cut the input's computation),
    classes are shared, a read is not finite in float32, or a region fails, the check
    runs again the second way, on the input's float64 tensors, whose verdict stands.
    Tensors made by matmuls (through splits, concats and adds) are compared through
    PROJECTIONS random projections (``_Projected``; Freivalds): ``sum_k T_k @ R_k``,
    with ``A @ B @ R`` computed as ``A @ (B @ R)``, so neither side runs a matmul
    whole; their floor is ``rtol`` over 4 times the root of the contracted length,
    about what one entry off by ``rtol`` moves a projection by, and a group past it is
    compared whole, entry by entry (``LocalCheck.rechecked``): projections only speed
    up a pass.

    ``outputs`` also computes the input's outputs, for ``outputs_beyond_float32`` (the
    first way reads their range from float32 values, so only a margin of 2**32 past
    float32's limits counts).

    Regions never read each other's results: a tensor one region makes and another
    reads is the input's own at the second one's boundary, and the first is compared
    on it, so no error travels from one to the next. A wrong rule's merge of classes
    shows where it is used: the node built from the merged class computes something
    else than the input's tensor of that class. Opaque nodes always repeat the input's
    and are not run for the result (they are for the input where a region needs what
    they feed). Weights are the input's by name; one whose data differs is compared
    too. All-zero weights get random stand-ins, as in ``check_graphs_equivalent``.

    What it cannot see: a region's error below its tolerance (1e-9 relative, against
    float64 round-off of ~1e-14 for a few operators) however much the rest of the
    graph would amplify it; a region whose input path to a compared tensor is much
    worse conditioned than the region itself (its noise is measured on the region);
    inputs on which a wrong rewrite happens to agree (random inputs make this
    unlikely; a projected difference is missed with probability zero, but its size
    is judged from PROJECTIONS columns); and the exporter, which only the onnxruntime
    check sees."""
    from .executor import random_inputs

    feeds = random_inputs(original, seed)
    _same_inputs(candidate, feeds, what)
    share_weights(original, candidate)
    zero = _zero_weights(original)
    if zero:
        _note_stand_ins(zero)
    with np.errstate(all="ignore"), _stand_ins(original, candidate, zero, seed):
        return _Local(original, candidate, original_classes, candidate_classes, feeds, rtol, what,
                      seed, outputs).run()


def _beyond_float32(value, margin: int = 0) -> bool:
    """A float tensor (``m * 2**e``) float32 cannot hold: not finite, all zeros, or
    its largest entry past float32's largest or below its smallest normal number.
    ``margin`` > 0 (for a value computed in float32, whose round-off may be large):
    only an entry past those limits by ``2**margin`` counts, and a tensor that is not
    finite or all zeros does not."""
    m, e = value
    if m.dtype.kind != "f" or not m.size:
        return False
    peak = _peak(m)
    if peak == 0 or not math.isfinite(peak):
        return not margin
    return not -126 - margin <= e + math.log2(peak) < 128 + margin


@dataclass
class _Region:
    nodes: list          # candidate nodes, in the candidate's topological order
    needs: set           # classes of the input graph's tensors it reads or compares
    waiting: int = 0     # of those, not yet computed
    reads: set = field(default_factory=set)   # of ``needs``, those its nodes read
    # the input's nodes that compute the classes it makes from the classes it reads (in
    # the input's order); None where that computation reaches past them to a graph input
    cone: list | None = None
    need: set = field(default_factory=set)    # what this run waits for: ``needs``, or ``reads``


class _Local:
    def __init__(self, original, candidate, ocls, ccls, feeds, rtol, what, seed, outputs):
        self.original, self.candidate, self.ccls, self.outputs = original, candidate, ccls, outputs
        self.feeds, self.rtol, self.what, self.seed = feeds, rtol, what, seed
        self.order = original.topo_order()
        self.by_class: dict[str, list[tuple[int, int]]] = {}
        for n in self.order:
            for i in range(len(n.outputs)):
                cls = ocls.get((n.id, i))
                if cls is None:
                    raise VerificationError(f"{what}: the input's {n.label()} output {i} has no e-class")
                self.by_class.setdefault(cls, []).append((n.id, i))
        self.ocls = ocls
        self.worst, self.compared, self.projected, self.rechecked = 0.0, 0, 0, 0

    def anchored(self, cls) -> bool:
        return cls in self.by_class

    def run(self) -> LocalCheck:
        cand, ccls = self.candidate, self.ccls
        self._check_outputs()
        changed = self._changed()
        regions = self._regions(changed)
        # classes the candidate uses that hold several input tensors: they must agree
        used = {ccls.get((t.node, t.index)) for n in cand.nodes.values() for t in n.inputs}
        used |= {ccls.get((t.node, t.index)) for _, t in cand.outputs}
        shared = {c for c in used if self.anchored(c) and len(self.by_class[c]) > 1}
        if not shared and all(self._cone(r) for r in regions):
            try:
                return self._run(regions, shared, cones=True)
            except VerificationError as e:  # a region that may rely on its boundary's exact values
                log.info("%s; checked again on the input's own float64 tensors", first_line(str(e)))
                self.worst, self.compared, self.projected, self.rechecked = 0.0, 0, 0, 0
        return self._run(regions, shared, cones=False)

    def _run(self, regions, shared, cones: bool) -> LocalCheck:
        """With ``cones``: the input's tensors that regions read are computed in float32
        (tracked exponents; half a float64 run's cost), and each region is compared
        with the input's own operators (``_Region.cone``) run in float64 from the same
        boundary values, so both sides of a comparison start from the same numbers.
        Else the input's tensors are computed in float64, regions compared with them."""
        cand = self.candidate
        for r in regions:
            r.need = r.reads if cones else r.needs
        wanted = {self.by_class[c][0] for r in regions for c in r.need}
        wanted |= {k for c in shared for k in self.by_class[c]}
        holds = {c: len(self.by_class[c]) - 1 for c in shared}  # comparisons still to come
        waiters: dict[str, list[_Region]] = {}
        for r in regions:
            r.waiting = len(r.need)
            for c in r.need:
                waiters.setdefault(c, []).append(r)
                holds[c] = holds.get(c, 0) + 1
        values: dict[str, tuple[np.ndarray, int]] = {}
        outputs = {(t.node, t.index) for _, t in self.original.outputs} if self.outputs else set()
        beyond = False
        ran = self._needed_input_nodes(wanted | outputs)
        dtype = np.float32 if cones else np.float64

        def release(c):
            holds[c] -= 1
            if not holds[c]:
                values.pop(c, None)

        for key, v in _scaled_values(self.original, self.feeds, wanted | outputs, dtype=dtype):
            if key in outputs:
                beyond = beyond or _beyond_float32(v, margin=32 if cones else 0)
                if key not in wanted:
                    continue
            if cones and v[0].dtype == np.float32:
                if not math.isfinite(_peak(v[0])):  # float64 may hold it: no place to compare from
                    raise VerificationError(f"{self.what}: the input's {self._name(key)} is not finite "
                                            f"in float32")
                v = (v[0].astype(np.float64), v[1])
            c = self.ocls[key]
            if c in values:  # another input tensor of a class already computed
                error = _scaled_error(values[c], v)
                self.compared += 1
                _tolerance(error, self.rtol, lambda: 0.0, self.what,
                           f"the input's {self._name(key)}, which the e-graph holds equal to its "
                           f"{self._name(self.by_class[c][0])},")
                self.worst = max(self.worst, error)
                release(c)
                continue
            values[c] = v
            for r in waiters.get(c, ()):
                r.waiting -= 1
                if not r.waiting:
                    self._evaluate(r, values, cones)
                    for need in r.need:
                        release(need)
        return LocalCheck(self.worst, len(regions), sum(len(r.nodes) for r in regions),
                          len(cand.nodes), ran, self.compared, self.projected, self.rechecked, cones,
                          beyond if self.outputs else None)

    def _name(self, key) -> str:
        return f"{self.original.nodes[key[0]].label()} output {key[1]}"

    def _check_outputs(self) -> None:
        theirs = dict(self.candidate.outputs)
        if set(theirs) != {name for name, _ in self.original.outputs}:
            raise VerificationError(f"{self.what}: outputs {sorted(theirs)} differ from the original's "
                                    f"{sorted(name for name, _ in self.original.outputs)}")
        for name, t in self.original.outputs:
            mine, ours = self.ocls[(t.node, t.index)], self.ccls.get((theirs[name].node, theirs[name].index))
            if mine != ours:
                raise VerificationError(f"{self.what}: output {name!r} is built from e-class {ours}, "
                                        f"the input's from {mine}")

    def _changed(self) -> list:
        """Candidate nodes that do not repeat an input node."""
        cand, ccls = self.candidate, self.ccls
        repeats: dict[tuple, list[tuple]] = {}
        for n in self.order:
            repeats.setdefault(_signature(n, self.ocls), []).append(
                tuple(self.ocls[(n.id, i)] for i in range(len(n.outputs))))
        used = {(t.node, t.index) for n in cand.nodes.values() for t in n.inputs}
        used |= {(t.node, t.index) for _, t in cand.outputs}
        weights = {n.params["name"]: n for n in self.original.weights()}
        changed = []
        for n in cand.topo_order():
            mine = [ccls.get((n.id, i)) for i in range(len(n.outputs))]
            same = any(all(m == o or (n.id, i) not in used for i, (m, o) in enumerate(zip(mine, outs)))
                       for outs in repeats.get(_signature(n, ccls), ()))
            if same and n.op == "weight":  # a weight repeats the input's only with its data
                a, b = cand.weight_array(n), self.original.weight_array(weights[n.params["name"]])
                same = a is b or np.array_equal(a, b)
            if not same:
                changed.append(n)
        return changed

    def _regions(self, changed) -> list[_Region]:
        """Changed nodes joined through tensors of classes no input tensor has; a region
        none of whose tensors has such a class computes nothing the outputs use."""
        ccls = self.ccls
        ids = {n.id for n in changed}
        parent = {i: i for i in ids}

        def root(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for n in changed:
            for t in n.inputs:
                if t.node in ids and not self.anchored(ccls.get((t.node, t.index))):
                    parent[root(t.node)] = root(n.id)
        groups: dict[int, _Region] = {}
        for n in changed:  # candidate order, so each region's nodes stay in it
            r = groups.setdefault(root(n.id), _Region([], set()))
            r.nodes.append(n)
            r.reads.update(c for c in (ccls.get((t.node, t.index)) for t in n.inputs) if self.anchored(c))
            r.needs.update(r.reads)
            r.needs.update(c for c in (ccls.get((n.id, i)) for i in range(len(n.outputs))) if self.anchored(c))
        return [r for r in groups.values()
                if any(self.anchored(ccls.get((n.id, i))) for n in r.nodes for i in range(len(n.outputs)))]

    def _cone(self, region: _Region) -> bool:
        """Find the input's nodes that compute the classes ``region`` makes from the
        classes it reads (``region.cone``); False where they reach a graph input, that
        is, where the region's boundary does not cut the input's computation of them."""
        made = {self.ccls.get((n.id, i)) for n in region.nodes for i in range(len(n.outputs))}
        todo = [self.by_class[c][0] for c in made if self.anchored(c)]
        seen: set[int] = set()
        while todo:
            node = self.original.nodes[todo.pop()[0]]
            if node.id in seen:
                continue
            if node.op == "input":
                return False
            seen.add(node.id)
            todo += [(t.node, t.index) for t in node.inputs
                     if self.ocls[(t.node, t.index)] not in region.reads]
        region.cone = [n for n in self.order if n.id in seen]
        return True

    def _needed_input_nodes(self, wanted) -> int:
        needed = {k[0] for k in wanted}
        for node in reversed(self.order):
            if node.id in needed:
                needed.update(t.node for t in node.inputs)
        return len(needed)

    def _region_values(self, region: _Region, values, perturb=None) -> _RegionValues:
        return _RegionValues(self.candidate, region.nodes, self.ccls, self.anchored, values, self.feeds,
                             perturb)

    def _evaluate(self, region: _Region, values, cones: bool = False) -> None:
        """Compute the region from the input's tensors at its boundary and compare what it
        makes with the input's tensors of the same classes (with ``cones``: with what
        the input's own operators make from the same boundary values): exactly, or, for
        tensors made by matmuls (through splits, concats and adds), through random
        projections (``_Projected``), which skip the matmuls' cubic cost."""
        rng = np.random.default_rng(self.seed + 3)
        ev = self._region_values(region, values)
        exact, groups = ev.plan(rng)
        if cones:
            reads = region.reads
            ref_ev = _RegionValues(self.original, region.cone, self.ocls, lambda c: c in reads, values,
                                   self.feeds)
            exact_ref = lambda key: ref_ev.make(self.by_class[self.ccls[key]][0])
            group_ref = lambda g: ref_ev.project([(self.by_class[c][0], r, 0, True)
                                                  for c, r in zip(g.classes, g.mats)])
        else:
            exact_ref = lambda key: values[self.ccls[key]]
            group_ref = lambda g: g.reference(values)
        refs = [group_ref(g) for g in groups]
        if not all(np.all(np.isfinite(m)) for m, _ in refs):
            exact, groups, refs = exact + [k for g in groups for k in g.keys], [], []  # entry by entry
        measured = {("exact", key): (exact_ref(key), ev.make(key)) for key in exact}
        errors = {label: _scaled_error(ref, got) for label, (ref, got) in measured.items()}
        flagged = {}  # projections past their floor: each tensor of the group compared whole
        for g, ref in zip(groups, refs):
            error, floor = _scaled_error(ref, g.value(ev)), g.floor(self.rtol)
            if error <= floor:
                self.worst = max(self.worst, error)
                continue
            self.rechecked += 1
            for key in g.keys:
                measured[("exact", key)] = (exact_ref(key), ev.make(key))
                errors[("exact", key)] = _scaled_error(*measured[("exact", key)])
                flagged[key] = (error, floor, g.columns)
        self.compared += len(exact) + sum(len(g.keys) for g in groups)
        self.projected += sum(len(g.keys) for g in groups)
        if not errors:
            return
        worst = max(errors, key=errors.get)
        if errors[worst] > self.rtol:  # round-off or a wrong rewrite: how noisy is this region?
            noisy = {c: (m * (1 + _EPS["float64"] * rng.standard_normal(m.shape)), e)
                     if m.dtype.kind == "f" else (m, e) for c, (m, e) in values.items() if c in region.needs}
            noise = lambda: _scaled_error(measured[worst][1],
                                          self._region_values(region, noisy, rng).make(worst[1]))
            key = worst[1]
            against = " (and the input's operators from the same values)" if cones else ""
            seen = (f"; its group's {flagged[key][2]} random projections differ by {flagged[key][0]:.3g}, "
                    f"above their floor {flagged[key][1]:.3g}") if key in flagged else ""
            where = (f"{self.candidate.nodes[key[0]].label()} (e-class {self.ccls[key]}; in a region of "
                     f"{len(region.nodes)} changed node(s), computed from the input's tensors at its "
                     f"boundary{against}{seen})")
            _tolerance(errors[worst], self.rtol, noise, self.what, where)
        self.worst = max(self.worst, max(errors.values()))


# Random projections per compared group: Freivalds' check, each column an independent
# chance to see a difference (a nonzero difference is missed with probability 0).
PROJECTIONS = 4


@dataclass
class _Projected:
    """Tensors a region makes, compared through ``sum_k key_k @ R_k`` (the last axis
    contracted with random ``R_k``): the matmuls that make them run on ``PROJECTIONS``
    columns instead of whole matrices (``A @ B @ R`` as ``A @ (B @ R)``)."""

    keys: list              # candidate tensors, one leading shape
    mats: list              # their R, (last dim, PROJECTIONS) each
    classes: list           # their e-classes (the input's tensors to compare with)

    @property
    def columns(self) -> int:
        return self.mats[0].shape[1]

    def floor(self, rtol: float) -> float:
        # A projection's scale, its largest entry, is up to ~4 standard deviations of a
        # row's random sum, sqrt(contracted length) entries of the tensor's scale; one
        # entry off by ``rtol`` moves it by ~rtol times a standard normal. So the floor
        # is that much lower (and still far above float64 round-off).
        return rtol / (4 * math.sqrt(sum(r.shape[0] for r in self.mats)))

    def reference(self, values) -> tuple[np.ndarray, int]:
        return _sum_scaled([_times(values[c], r) for c, r in zip(self.classes, self.mats)])

    def value(self, ev: _RegionValues) -> tuple[np.ndarray, int]:
        return ev.project([(k, r, 0, True) for k, r in zip(self.keys, self.mats)])


def _times(value, r: np.ndarray, f: int = 0) -> tuple[np.ndarray, int]:
    """``value @ (r * 2**f)``, ``value`` tracked as ``(m, e)``."""
    m, e = value
    return _normalize(np.matmul(m, r), e + f, owned=True)


def _sum_scaled(terms) -> tuple[np.ndarray, int]:
    top = max(e for _, e in terms)
    out = None
    for m, e in terms:  # each a fresh array
        m = m * _pow2(e - top) if e != top else m
        out = m if out is None else out + m
    return _normalize(out, top, owned=True)


class _RegionValues:
    """The tensors ``nodes`` (of ``graph``, in its order) compute from ``values`` (by
    class) at their boundary, the tensors whose class ``stop`` accepts: whole
    (``make``), or contracted with random matrices (``project``). A changed region of
    the candidate, or its cone in the input."""

    def __init__(self, graph, nodes, classes, stop, values, feeds, perturb=None):
        self.graph, self.classes, self.stop = graph, classes, stop
        self.values, self.feeds, self.perturb = values, feeds, perturb
        self.nodes = {n.id: n for n in nodes}
        self.pos = {n.id: i for i, n in enumerate(nodes)}
        self.made: dict[tuple[int, int], tuple[np.ndarray, int]] = {}

    def _cls(self, key):
        return self.classes.get(key)

    def read(self, key):
        """A tensor as a node reads it: the boundary's value where its class is a
        boundary class, else made here."""
        c = self._cls(key)
        return self.values[c] if self.stop(c) else self.make(key)

    def make(self, key):
        if key not in self.made:
            from .executor import leaf_value

            node = self.nodes[key[0]]
            outs = _scaled_leaf(self.graph, node, self.feeds, leaf_value, self.perturb)
            if outs is None:
                outs = _scaled_apply(node, [self.read((t.node, t.index)) for t in node.inputs])
            for i, v in enumerate(outs):
                self.made[(node.id, i)] = v
        return self.made[key]

    # --- projections ---

    def plan(self, rng) -> tuple[list, list[_Projected]]:
        """The region's tensors of the input's classes, split into those compared entry
        by entry and groups compared through projections (those a matmul makes)."""
        exact, groups = [], {}
        for n in self.nodes.values():
            for i, t in enumerate(n.outputs):
                key = (n.id, i)
                if not self.stop(self._cls(key)):
                    continue
                if len(t.shape) >= 2 and t.dtype.startswith("float") and self._reaches_matmul(key):
                    g = groups.setdefault(t.shape[:-1], _Projected([], [], []))
                    g.keys.append(key)
                    g.mats.append(rng.standard_normal((t.shape[-1], PROJECTIONS)))
                    g.classes.append(self._cls(key))
                else:
                    exact.append(key)
        return exact, list(groups.values())

    def _reaches_matmul(self, key) -> bool:
        node = self.nodes.get(key[0])
        if node is None:
            return False
        pushed = self._push(node, {key[1]: None}, dry=True)
        if pushed is None:
            return False
        if pushed == "matmul":
            return True
        return any(self._reaches_matmul(k) for k, _, _ in pushed if not self.stop(self._cls(k)))

    def project(self, demands) -> tuple[np.ndarray, int]:
        """``sum key @ (R * 2**e)`` over ``demands`` (``(key, R, e, made)``; ``made``: the
        tensor these nodes make, else as a node reads it), all of one leading shape.
        Splits, concats and adds pass the contraction to their inputs, and a matmul
        ``A @ B`` becomes ``A @ (B @ R)``, ``A`` contracted in turn where ``B @ R`` is a
        matrix (demands on one tensor add up, so it is contracted once); anything else
        is made whole and multiplied."""
        pending: dict[tuple, tuple[np.ndarray, int]] = {}

        def add(key, r, e, made):
            made = made or not self.stop(self._cls(key))
            pending[(key, made)] = _sum_scaled([pending[(key, made)], (r, e)]) if (key, made) in pending \
                else (r, e)

        for key, r, e, made in demands:
            add(key, r, e, made)
        terms = []
        while pending:
            # latest producer first, so that every demand on a node's outputs is in
            (key, made) = max(pending, key=lambda km: self.pos[km[0][0]] if km[1] else -1)
            if not made:
                terms.append(_times(self.read(key), *pending.pop((key, made))))
                continue
            node = self.nodes[key[0]]
            outs = {k[1]: pending.pop((k, m)) for k, m in list(pending) if m and k[0] == node.id}
            pushed = self._push(node, outs)
            if pushed is None:
                terms += [_times(self.make((node.id, i)), *r) for i, r in outs.items()]
            elif isinstance(pushed, tuple):  # a matmul's term
                terms.append(pushed)
            else:
                for k, r, e in pushed:
                    add(k, r, e, False)
        return _sum_scaled(terms)

    def _push(self, node, outs: dict, dry: bool = False):
        """Where ``sum out_i @ R_i`` over ``node``'s outputs (``R_i`` as ``(r, e)``) goes: a
        list of demands ``(key, r, e)`` on its inputs, a term (``"matmul"`` when ``dry``),
        or None (made whole)."""
        types = [t.type for t in node.inputs]
        if not all(t.dtype.startswith("float") for t in list(types) + list(node.outputs)):
            return None
        last = len(node.outputs[0].shape) - 1
        keys = [(t.node, t.index) for t in node.inputs]
        if node.op == "matmul" and node.params.get("activation", "NONE") == "NONE":
            if dry:
                return "matmul"
            p, e = self.project([(keys[1], *outs[0], False)])
            if p.ndim == 2:  # A @ P is a contraction of A's last axis as well
                return [(keys[0], p, e)]
            m, f = self.read(keys[0])
            return _normalize(np.matmul(m, p), e + f, owned=True)
        if node.op == "split" and node.params["axis"] % (last + 1) == last:
            if dry:
                return [(keys[0], None, 0)]
            top = max(e for _, e in outs.values())
            r = np.zeros((types[0].shape[-1], next(iter(outs.values()))[0].shape[1]))
            offsets = np.cumsum((0,) + tuple(node.params["sizes"]))
            for i, (ri, e) in outs.items():
                r[offsets[i]:offsets[i + 1]] = ri * _pow2(e - top)
            return [(keys[0], r, top)]
        if node.op == "concat" and node.params["axis"] % (last + 1) == last:
            offsets = np.cumsum((0,) + tuple(t.shape[-1] for t in types))
            r, e = outs[0] if not dry else (None, 0)
            return [(k, None if dry else r[offsets[j]:offsets[j + 1]], e) for j, k in enumerate(keys)]
        if node.op == "ewadd" and all(t.shape == node.outputs[0].shape for t in types):
            return [(k, *(outs[0] if not dry else (None, 0))) for k in keys]
        return None


def _signature(node, classes) -> tuple:
    return (node.op, _freeze(node.params), tuple(classes.get((t.node, t.index)) for t in node.inputs),
            node.outputs)


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    return v


# --- onnxruntime --------------------------------------------------------------------------

def onnx_outputs(model, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run an ONNX model in onnxruntime (all graph optimizations off: we want the
    model's own arithmetic). ``model`` is a path, bytes, a ModelProto, a
    ``onnx_io.fed.FedModel`` (its arrays given to onnxruntime, not serialized), or a
    ``(ModelProto, weights)`` pair from ``onnx_io.exporter.export_for_check``, whose
    weights are fed with the inputs (onnxruntime reads NumPy feeds in place)."""
    import onnxruntime as ort

    from .onnx_io.fed import weights_as_inputs

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
    options.log_severity_level = 3
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
                     what: str = "optimized model in onnxruntime") -> OnnxCheck:
    """ONNX ``model`` against ``reference`` (an ONNX model, or a callable that makes
    one) in onnxruntime (float32) on random inputs for ``graph`` (the graph both
    compute). Skipped, with the reason, where the comparison would prove nothing:
    onnxruntime cannot run the reference, a float output is not finite or is all
    zeros on these inputs, or round-off alone moves it by more than MAX_RTOL. The
    model runs first; where its outputs prove nothing the reference is not made or
    run (``reference_run``: TASO's BERT spends ~2 s there to overflow too).
    VerificationError when they differ beyond ``rtol`` and SAFETY times the
    reference's round-off noise (its outputs' change when the inputs move by one
    float32 rounding error), or when the model does not run where the reference does."""
    from .executor import random_inputs

    feeds = random_inputs(graph, seed)
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
        expected = onnx_outputs(ref(), feeds)
    except Exception as e:
        return OnnxCheck(None, f"onnxruntime cannot run the input model ({first_line(e)})")
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
    floors = {name: output_floor(steps.get(name, _EPS["float32"]), rtol) for name in errors}
    name = max(errors, key=lambda n: errors[n] / floors[n], default=None)
    if name is not None and errors[name] > floors[name]:
        # the inputs only (the weights are inside the model), each moved by one
        # rounding step of the coarsest precision on the output's path
        rng = np.random.default_rng(seed + 2)
        step = steps.get(name, _EPS["float32"])
        noisy = {k: (v * (1 + step * rng.standard_normal(v.shape))).astype(v.dtype)
                 if is_float(v.dtype) else v for k, v in feeds.items()}
        try:
            _tolerance(errors[name], floors[name],
                       lambda: _relative(expected[name].astype(np.float64),
                                         onnx_outputs(ref(), noisy)[name].astype(np.float64)),
                       what, f"output {name!r}")
        except _Inconclusive as e:  # float32 cannot tell; float64 may
            return OnnxCheck(None, f"in {expected[name].dtype.name} {e.reason}")
    worst = max(errors.values(), default=0.0)
    if overflow:
        return OnnxCheck(None, f"{why} (where the input's is, and equal to it within {worst:.2g} "
                               f"relative where finite)")
    return OnnxCheck(worst)


def output_floor(step: float, rtol: float = RTOL) -> float:
    """The difference an output may show whatever the noise: ``rtol``, or FLOOR_STEPS
    rounding steps (``step``: the coarsest on its path, ``rounding_steps``) where that is
    coarser: float16's, and a quantized path's 8 bits (1.6 % of the output's peak, as
    a few roundings that round-off flips move it)."""
    return max(rtol, FLOOR_STEPS * step)


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
        return _EPS.get(np.dtype(helper.tensor_dtype_to_np_dtype(code)).name, 0.0) if code else 0.0

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
                coarsest = max(coarsest, _EPS["uint8"])
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
    type (no rounding step dropped). Only the weights the reference's nodes read count."""
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
            raise VerificationError(f"{what}: changes the model's precision: it has "
                                    f"{have.get((kind, name), 0)} {name} nodes where the input has {count}")


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
            counts[("op", n.op_type)] = counts.get(("op", n.op_type), 0) + 1
    return counts


def check_float32_proves_nothing(reference, graph, skipped: str, seed: int = 0,
                                 what: str = "optimized model in onnxruntime") -> None:
    """Where the written model's float32 outputs proved nothing (``skipped``), the
    reference's must not prove something: else the model overflows (or vanishes)
    where the input does not, a VerificationError."""
    from .executor import random_inputs

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
