"""The decide stage of ``optimize``: which candidate graph is returned, on its
predicted cost or, when measured, by the guard (``guard``): each candidate is predicted
first from onnxruntime's kernel profiles (``predicted_speedups``), only those that could
pay are timed, and the best one the guard confirms faster is returned, else the original.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import guard, timing
from ..errors import ProfileError
from ..executor import random_inputs
from ..graph import Graph
from ..onnx_io.exporter import export_fed
from ..onnx_io.fed import array_of, file_backed
from ..options import MAX_ROUNDS, MIN_ROUNDS
from .guard import GuardReport
from .phases import PhaseTimes

if TYPE_CHECKING:
    import onnx

# Candidates are timed only where a gain can be: one predicted below its threshold is
# not timed, and where none is above it nothing is and the original is written. Each is
# predicted by onnxruntime's kernel profiles of it and of the original, matched kernel
# for kernel (``matched_speedup``): a cost model of the graph missed what onnxruntime
# does with what is written (a ViT's result predicted 1.024x by the calibrated costs,
# which priced its GELU apart from the one kernel onnxruntime runs it as, measured
# 0.990x; matched profiles 0.997x), and whole profiles' sums scattered 0.961x-1.051x
# where nothing changed (each profile one session, whose memory placement moves every
# kernel). The re-export keeps its 6 % from those sums (the re-exports that gain gain
# far more: a ResNet-50 from the dynamo exporter without its optimizer, 1.24x-1.59x).
# The result is timed where it could reach the guard's margin were its own memory-bound
# kernels PROFILE_ERROR faster than profiled, as what the kernel before left in cache
# moves them (ConvNeXt-T's Add and Gelu, one machine: 0.998x-1.016x profiled, 1.009x-1.034x
# measured); kernels whose time is arithmetic (COMPUTE_KERNELS, by name) count as profiled:
# matmuls, convs (a 1B Llama's merged projections: 0.999x, 1.001x) and transcendental
# activations (a ViT's Gelu moved half the bytes a second its Add did). docs/history.md.
REEXPORT_ABOVE = 1.06
PROFILE_ERROR = 0.25
COMPUTE_KERNELS = ("MatMul", "Gemm", "Conv", "Gelu", "Erf", "Tanh", "Softmax")  # BiasGelu, FusedConv, ...
# The result is also timed where the cost model prices it this much faster: BERT from
# the dynamo exporter, profiled at 0.988x, priced 1.069x, measured 1.025x-1.040x (two
# runs). The cost model missed by up to 3.4 points (the ViT above), hence not 1.005.
PRICED_ABOVE = 1.02
# Profiled runs of each candidate and the original (each kernel's median over them);
# three keep a ViT of a quarter second a run within its 15 s when nothing is timed.
PREDICTION_RUNS = 3
# Models whose kernels take less than this many seconds a run are profiled twice each,
# in both orders, for QUICK_RUNS runs, keeping each one's smaller sum: a model of a
# millisecond, profiled once each, was predicted 1.11x against its own re-export (an
# Identity dropped), and twice for 5 runs 0.987x-1.064x.
QUICK_PROFILE = 0.05
QUICK_RUNS = 25


@dataclass(frozen=True)
class Prediction:
    """A candidate's speedup over the original from kernel profiles (``matched_speedup``),
    and the most it could reach: its own memory-bound kernels PROFILE_ERROR faster."""

    speedup: float
    reach: float


@dataclass
class Decision:
    """The decide stage's outcome: the graph ``optimize`` returns, which candidate it is
    ("original", "re-export", "result"), and why when it is not the result."""

    graph: Graph
    kept_input: str = ""                         # "" when the result is returned
    measured_ms: dict[str, float] | None = None  # when timed in onnxruntime
    chosen: str = "result"
    not_measured: tuple[str, ...] = ()
    exported: onnx.ModelProto | None = None      # the chosen candidate's ONNX, when timed
    guard: GuardReport | None = None             # when timed
    # each candidate's prediction over the original (``predicted_speedups``), where
    # measurement was asked for: what decided whether any was timed
    predictions: dict[str, Prediction] = field(default_factory=dict)


def decide(graph: Graph, result: Graph | None, before: float, after: float, min_gain: float, measure: int,
           phase, measure_progress, reference=None, no_result: str = "", as_written=None,
           phases: PhaseTimes | None = None) -> Decision:
    """Without ``measure``: the result when its predicted cost falls by more than
    ``min_gain``, else the original. With ``measure`` (the most rounds): every
    candidate timed by the guard in onnxruntime; the fastest confirmed faster than the
    original is returned, else the original; measurement overrides the prediction
    both ways. A candidate that computes node for node what an earlier one does (the
    result what the re-export does, say) is not timed apart. ``result`` None: there is
    none to weigh (``no_result`` says why). ``as_written(candidate)``: the model a
    candidate graph is written as, what is timed (None: it cannot be written, and is
    not a candidate); the graph exported when not given. Where no candidate is
    worth timing (``predicted_speedups``, ``worth_timing``), none is timed and the
    original is returned. ``phases`` records the seconds predicting and
    timing take."""
    phases = phases or PhaseTimes()
    if result is None:
        predicted = f"the extracted graph cannot be written: {no_result}"
    elif before <= 0:
        predicted = "the input costs nothing"
    elif after >= before * (1 - min_gain):
        predicted = f"predicted gain {1 - after / before:+.2%} is not above min_gain {min_gain:.2%}"
    else:
        predicted = ""
    if not measure:
        unmeasured = ("re-export",) if reference is not None else ()
        if predicted:
            return Decision(graph, predicted, chosen="original", not_measured=unmeasured)
        return Decision(result, not_measured=unmeasured)
    # candidates as FedModels: the re-export's weights are the graph's arrays, the
    # result's too where it keeps them (those it computes in a file: fed.file_backed)
    written = as_written or export_fed
    models = {"original": reference if reference is not None else export_fed(graph)}
    if reference is not None:
        models["re-export"] = written(graph)
    if result is not None:
        models["result"] = file_backed(written(result))
    unwritten = [name for name, model in models.items() if model is None]
    models = {name: model for name, model in models.items() if model is not None}
    if "result" in unwritten:  # the writer accepted it: a fault of ours
        raise ValueError("the writer cannot write the result it accepted")
    # a candidate that computes node for node what an earlier one does is not timed
    # (the earlier one stands for it), so that noise does not choose between twins
    seen: dict[tuple, str] = {}
    twins: dict[str, str] = {}
    for name in list(models):
        twin = seen.setdefault(computation(models[name]), name)
        if twin != name:
            twins[name] = twin
            del models[name]
    if len(models) == 1:
        return Decision(graph, predicted if result is None else
                        "every candidate computes node for node what the original does", chosen="original")
    feeds = random_inputs(graph)
    try:
        with phases("calibration"):
            profiled = predicted_speedups(models, feeds, phase)
        priced = before / after if after > 0 else math.inf  # the cost model's word on the result
        timed = {name for name, p in profiled.items()
                 if worth_timing(name, p) or (name == "result" and priced >= PRICED_ABOVE)}
        if not timed:
            price = (f"; the cost model's {priced:.3f}x, below {PRICED_ABOVE:g}x" if "result" in profiled
                     else "")
            return Decision(graph, f"no candidate is predicted to gain enough to be timed "
                                   f"({predicted_below(profiled)}{price}), so none was", chosen="original",
                            predictions=profiled)
        # a candidate predicted to gain nothing is not timed beside one that may: its
        # rounds and its share of the level go to the other
        models = {name: model for name, model in models.items()
                  if name == "original" or name in timed}
        names = " and ".join(", ".join(models).rsplit(", ", 1))
        phase(f"timing {names} in onnxruntime (paired interleaved rounds, {MIN_ROUNDS} to {measure}, "
              f"at most {guard.TIME_BUDGET:g} s, {guard.MAX_TIME_BUDGET:g} s for slow rounds)")
        with phases("timing"):
            report = guard.time_in_onnxruntime(models, feeds, measure, measure_progress)
    except ProfileError:
        why = timing.cannot_build(models["original"])
        if not why:  # the original runs: a candidate does not, which is a fault of ours
            raise
        return Decision(graph, f"onnxruntime cannot run the input ({why}), so no candidate can be timed",
                        chosen="original")
    faster = {k: c for k, c in report.comparisons.items() if c.decision == "faster"}
    best = max(faster, key=lambda k: faster[k].ratio, default="original")
    if best == "result":
        return Decision(result, "", report.medians, "result", exported=models["result"], guard=report,
                        predictions=profiled)
    # timed, the cost model's word (``predicted``, min_gain's) is not why: the guard's is
    why = predicted if result is None else _why_not_the_result(report, twins, best, profiled)
    return Decision(graph, why, report.medians, best, exported=models[best] if best == "re-export" else None,
                    guard=report, predictions=profiled)


def predicted_speedups(models: dict, feeds, phase=None) -> dict[str, Prediction]:
    """Each candidate of ``models`` (the original first; twins already left out) with
    its predicted speedup over the original: one onnxruntime profile of each, the
    kernels matched (``matched_speedup``), and the most it could reach. Measured rather than priced: onnxruntime
    runs what is written its own way (a bias written 1-d gets GELU fused with it, into
    a kernel slower than the two apart; a scale beside a matmul fused into it), which
    no cost model of the graph sees."""
    if phase is not None:
        phase(f"predicting the candidates' speedups: one onnxruntime profile of each of {', '.join(models)}")
    profiles = {name: profiled_kernels(model, feeds) for name, model in models.items()}
    if max(_total(profile) for profile in profiles.values()) < QUICK_PROFILE:
        # cheap to repeat, and noisy: again in the other order, each model's quicker kept
        for name in reversed(list(models)):
            again = profiled_kernels(models[name], feeds, QUICK_RUNS)
            if _total(again) < _total(profiles[name]):
                profiles[name] = again
    return {name: Prediction(matched_speedup(profiles["original"], profile),
                             matched_speedup(profiles["original"], profile, PROFILE_ERROR))
            for name, profile in profiles.items() if name != "original"}


def profiled_kernels(model, feeds, runs: int = PREDICTION_RUNS) -> dict[tuple[str, str], list[float]]:
    """The seconds of one run of ``model``'s kernels in onnxruntime (one thread,
    ORT_ENABLE_ALL; each kernel's median over ``runs`` profiled runs), grouped by what
    they compute: the operator as onnxruntime runs it, and the shapes."""
    from .calibrate import seconds_per_run

    with timing.pinned_threads():
        events = timing.kernel_times(model, feeds, runs)
    kind = {event["name"]: (event["op"], event["shapes"]) for event in events}
    kernels: dict[tuple[str, str], list[float]] = {}
    for name, seconds in seconds_per_run(events, runs).items():
        kernels.setdefault(kind[name], []).append(seconds)
    return kernels


def _total(profile: dict[tuple[str, str], list[float]]) -> float:
    return sum(map(sum, profile.values()))


def matched_speedup(original: dict, candidate: dict, faster_by: float = 0.0) -> float:
    """The candidate's predicted speedup from kernel profiles (``profiled_kernels``) of it
    and of the original: a kernel both run (same operator, same shapes) counts the
    original's seconds in both, so only the kernels that differ are measured apart.
    Where a session's memory placement moves every kernel by a few percent, the ratio
    of whole sums scattered 0.961x-1.051x on models that changed nothing. The
    memory-bound kernels only the candidate runs are taken ``faster_by`` (a fraction)
    faster than profiled."""
    only_original = only_candidate = 0.0
    for kind in original.keys() | candidate.keys():
        a, b = original.get(kind, []), candidate.get(kind, [])
        common = min(len(a), len(b))
        # the kernels one side runs more of, each at its side's mean
        if len(a) > common:
            only_original += sum(a) * (len(a) - common) / len(a)
        if len(b) > common:
            own = sum(b) * (len(b) - common) / len(b)
            only_candidate += own if any(w in kind[0] for w in COMPUTE_KERNELS) else own * (1 - faster_by)
    total = _total(original)
    after = total - only_original + only_candidate
    return total / after if after > 0 else math.inf


def worth_timing(name: str, prediction: Prediction) -> bool:
    """Whether candidate ``name`` is timed on its profiles: the re-export where predicted
    REEXPORT_ABOVE faster, the result where it could reach the guard's margin."""
    if name == "re-export":
        return prediction.speedup >= REEXPORT_ABOVE
    return prediction.reach >= 1 + guard.MARGIN


def predicted_below(predictions: dict[str, Prediction]) -> str:
    """``the re-export 1.003x (below 1.06x), the result 1.001x (at most 1.006x, below 1.01x)``."""
    def one(name: str, p: Prediction) -> str:
        word = "from" if worth_timing(name, p) else "below"
        if name == "re-export":
            return f"the {name} {p.speedup:.3f}x ({word} {REEXPORT_ABOVE:g}x)"
        return f"the {name} {p.speedup:.3f}x (at most {p.reach:.3f}x, {word} {1 + guard.MARGIN:g}x)"
    return ", ".join(one(name, p) for name, p in predictions.items())


def _why_not_the_result(report: GuardReport, twins: dict[str, str], best: str,
                        predictions: dict[str, Prediction]) -> str:
    if "result" in twins:
        return f"the result computes node for node what the {twins['result']} does"
    if "result" not in report.comparisons:
        return (f"the result was predicted at {predictions['result'].speedup:.3f}x the original (at most "
                f"{predictions['result'].reach:.3f}x, below {1 + guard.MARGIN:g}x), and not timed")
    c = report.comparisons["result"]
    if c.decision == "faster":  # and the re-export more so
        return (f"the {best} measured faster than the result ({guard.format_ratio(report.comparisons[best])} "
                f"against {guard.format_ratio(c)})")
    return guard.not_faster_why(report, "result", "the original")


def computation(model) -> tuple:
    """What an ONNX graph computes, node for node, names aside: a digest of each output
    over its operators, attributes, graph inputs and weight values (constants by value)."""
    import hashlib

    from onnx import TensorProto, helper, numpy_helper

    def tensor_key(t, model) -> str:
        a = np.ascontiguousarray(array_of(model, t) if model is not None else numpy_helper.to_array(t))
        digest = hashlib.sha1(f"{a.dtype}{a.shape}".encode())
        digest.update(a.reshape(-1).view(np.uint8) if a.dtype != object else a.tobytes())  # no copy
        return digest.hexdigest()

    g = model.graph
    key = {"": ""}
    key.update({t.name: tensor_key(t, model) for t in g.initializer})
    key.update({i.name: "input " + i.name for i in g.input if i.name not in key})
    for node in g.node:
        attrs = []
        for a in sorted(node.attribute, key=lambda a: a.name):
            v = helper.get_attribute_value(a)
            attrs.append((a.name, tensor_key(v, None) if isinstance(v, TensorProto) else repr(v)))
        digest = hashlib.sha1(repr((node.domain, node.op_type, attrs,
                                    [key.get(i, "?" + i) for i in node.input])).encode()).hexdigest()
        for j, out in enumerate(node.output):
            key[out] = f"{digest}:{j}"
    return tuple(key.get(o.name, "?" + o.name) for o in g.output)


def keep_unless_faster(graph: Graph, candidate: Graph, max_rounds: int = MAX_ROUNDS,
                       progress=None) -> tuple[Graph, GuardReport, str]:
    """The guard on ``graph`` ("original") and ``candidate`` ("optimized") in
    onnxruntime: ``(candidate, report, "")`` when the candidate is confirmed faster,
    else ``(graph, report, why)``. Every command that writes an optimized graph
    applies this guard."""
    report = guard.time_in_onnxruntime({"original": export_fed(graph), "optimized": export_fed(candidate)},
                                 random_inputs(graph), max_rounds, progress)
    if report.comparisons["optimized"].decision == "faster":
        return candidate, report, ""
    return graph, report, guard.not_faster_why(report, "optimized", "the input")
