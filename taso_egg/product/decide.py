"""The decide stage of ``optimize``: which candidate graph is returned, on its
predicted cost or, when measured, by the guard.

The guard times the original and its candidates in onnxruntime in paired,
interleaved rounds (``timing.ort_rounds``: each round runs each once, in an order
drawn afresh) and keeps timing until the answer is clear or its budget (rounds,
seconds) runs out. Per candidate it takes the log of the original's time over the
candidate's in each round, and at each look of a fixed schedule puts a confidence
interval on their centre: the Hodges-Lehmann estimate with the Wilcoxon signed-rank
interval (exact, distribution-free, robust: a load spike moves one rank, not the
estimate). Under no difference, with the order a fair draw, each round's log-ratio
is as likely to be negative as positive whatever the machine's load does, which is
all the interval assumes. Its level is split (Bonferroni) over every look and every
candidate, so that stopping as soon as the answer looks clear, and choosing among
several candidates, keeps a false "faster" at ALPHA at most. A candidate is "faster"
when its whole interval lies above 1 + MARGIN; the best of those is returned, else
the original.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import timing
from ..errors import ProfileError
from ..executor import random_inputs
from ..graph import Graph
from ..onnx_io.exporter import export_fed
from ..onnx_io.fed import array_of, file_backed
from ..options import MAX_ROUNDS, MIN_ROUNDS
from .phases import PhaseTimes

if TYPE_CHECKING:
    import onnx

# --- the guard's knobs (its round counts are ``measure``'s bounds, in ``options``) ------
# Timing stops after this many seconds (the round begun by then finishes; MIN_ROUNDS
# always run): on a model of a second a run, 60 rounds of three candidates take three
# minutes, more than a saturation.
TIME_BUDGET = 60.0
# Rounds slower than TIME_BUDGET / ENOUGH_ROUNDS (a transformer's three sessions built
# and timed take seconds) stretch the budget to fit ENOUGH_ROUNDS, up to
# MAX_TIME_BUDGET: twelve rounds left BERT's 10 % gain undecided ([1.009, 1.187]).
ENOUGH_ROUNDS = 30
# Rounds so slow that the first look (MIN_ROUNDS) would end past MAX_TIME_BUDGET (a
# model of gigabytes: each round builds its sessions, tens of seconds) are spent only on
# a candidate whose first round measured it this much faster, a gain a user rewrites a
# model for; a gain near the margin could not be confirmed in that time anyway, and
# GPT-2-large (46 s a round) spent 457 s on a result predicted 1.008x. The others are
# dropped after one round, which decides nothing "faster".
SLOW_ROUNDS_GAIN = 1.05
MAX_TIME_BUDGET = 180.0
# A false "faster" (or "slower") has at most this probability over the whole session:
# every look and every candidate together (the intervals are two-sided at 1 - 2 ALPHA,
# 95 %).
ALPHA = 0.025
# What counts as faster: the whole interval above 1 + MARGIN. Two sessions of
# byte-identical models can differ by a fraction of a percent for the whole session
# (where their buffers fall), which no number of rounds averages out; a 1 % gain is
# also below what a user would rewrite a model for.
MARGIN = 0.01
# Looks at MIN_ROUNDS, then each about GROWTH times the last (even: both orders alike),
# and at the most: few looks keep each one's share of ALPHA large.
GROWTH = 1.5
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


@dataclass(frozen=True)
class Comparison:
    """One candidate against the original: the ratio of the original's time over the
    candidate's (above 1: faster) with its interval, and what the guard concluded:
    "faster" (the interval above 1 + margin), "slower" (below 1 / (1 + margin)), "same"
    (within the margin both ways) or "undecided"."""

    ratio: float
    low: float
    high: float
    decision: str
    rounds: int


@dataclass
class GuardReport:
    """What the guard measured: per candidate its ``Comparison`` (the original has
    none), each one's median milliseconds, the rounds timed, the seconds they took,
    why timing stopped ("decided", "rounds": the most allowed, "time": the budget,
    "futile": no candidate left that could be confirmed faster by the last look)
    and the intervals' confidence."""

    comparisons: dict[str, Comparison]
    medians: dict[str, float]
    rounds: int
    seconds: float
    stopped: str
    confidence: float
    budget: float = TIME_BUDGET  # the seconds the rounds were given (``time_budget``)
    most: int = 0                # the rounds that budget fits (the schedule's last look)
    futile: tuple[str, ...] = ()  # timed no more: could not clear the margin (``cannot_clear``)


# --- the statistics -------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _signed_rank_cdf(n: int) -> np.ndarray:
    """P(T <= t) for t = 0 .. n(n+1)/2, T the Wilcoxon signed-rank statistic of n
    untied differences symmetric about 0 (the sum of a random subset of 1..n)."""
    p = np.zeros(n * (n + 1) // 2 + 1)
    p[0] = 1.0
    for i in range(1, n + 1):
        shifted = np.zeros_like(p)
        shifted[i:] = p[:-i]
        p = (p + shifted) / 2
    return np.cumsum(p)


def signed_rank_interval(d, alpha: float) -> tuple[float, float, float]:
    """The Hodges-Lehmann estimate of the centre of ``d`` (the median of its Walsh
    averages, (d_i + d_j) / 2 for i <= j) and its exact interval from the Wilcoxon
    signed-rank test, each side missing with probability ``alpha`` at most; an end
    is infinite where ``d`` is too short to bound it at that level."""
    d = np.asarray(d, dtype=float)
    i, j = np.triu_indices(len(d))
    walsh = np.sort((d[i] + d[j]) / 2)
    # the k-th smallest Walsh average is below the centre unless T <= k - 1
    k = int(np.searchsorted(_signed_rank_cdf(len(d)), alpha, side="right"))
    low = walsh[k - 1] if k else -math.inf
    high = walsh[-k] if k else math.inf
    return float(np.median(walsh)), float(low), float(high)


def compare(original, candidate, alpha: float = ALPHA, margin: float = MARGIN) -> Comparison:
    """``candidate`` against ``original``, their times paired round by round: the
    ratio original / candidate from the signed-rank interval of the per-round log
    ratios (each end missing with probability ``alpha`` at most), and the decision
    it supports with ``margin``."""
    d = np.log(np.asarray(original, dtype=float)) - np.log(np.asarray(candidate, dtype=float))
    centre, low, high = (math.exp(x) for x in signed_rank_interval(d, alpha))
    if low >= 1 + margin:
        decision = "faster"
    elif high <= 1 / (1 + margin):
        decision = "slower"
    elif low > 1 / (1 + margin) and high < 1 + margin:
        decision = "same"
    else:
        decision = "undecided"
    return Comparison(centre, low, high, decision, len(d))


def time_budget(pace: float, seconds: float | None = None, longest: float | None = None) -> float:
    """The seconds to time rounds of ``pace`` seconds for: ``seconds`` (TIME_BUDGET),
    stretched to fit ENOUGH_ROUNDS where that takes longer, up to ``longest`` (MAX_TIME_BUDGET)."""
    seconds = TIME_BUDGET if seconds is None else seconds
    longest = MAX_TIME_BUDGET if longest is None else longest
    return max(seconds, min(longest, ENOUGH_ROUNDS * pace))


def looks(min_rounds: int, max_rounds: int, growth: float = GROWTH) -> list[int]:
    """The rounds after which the guard looks: ``min_rounds``, then each about
    ``growth`` times the last (rounded up to even) while the next would still leave
    that much room before ``max_rounds``, and ``max_rounds``: a look just before the
    last one would take a share of the level for almost no more rounds."""
    out = [min(min_rounds, max_rounds)]
    while out[-1] < max_rounds:
        nxt = math.ceil(out[-1] * growth)
        nxt += nxt % 2
        out.append(nxt if nxt * growth <= max_rounds else max_rounds)
    return out


def run_guard(next_round: Callable[[list[str]], dict[str, float]], names, min_rounds: int = MIN_ROUNDS,
              max_rounds: int = MAX_ROUNDS, seconds: float = TIME_BUDGET, longest: float = MAX_TIME_BUDGET,
              alpha: float = ALPHA, margin: float = MARGIN, progress=None, clock=time.monotonic) -> GuardReport:
    """Time ``names`` (the original first, then the candidates) with ``next_round``
    (each call times one more round of the names it is given, the original first, and
    returns their times) until each candidate is settled, confirmed faster or shown
    not to be (its interval below 1 + ``margin``: it is timed no more), or the rounds
    run out: ``max_rounds``, or as many as fit at the first round's pace in ``seconds``
    (stretched up to ``longest`` for slow rounds: ``time_budget``; after ``min_rounds``
    at least; should later rounds run slower, the look when the time is up is one of
    the schedule's, brought forward). The schedule of looks is
    fixed after the first round, and each look at each candidate gets an equal share of
    ``alpha``: looks that the budget would never reach take none. Where the first look
    would end past ``longest``, only candidates whose first round shows SLOW_ROUNDS_GAIN
    are timed on to it. ``progress(done, most)`` follows each round (and ``(done, done)`` at the end)."""
    original, *candidates = names
    share, schedule, most, budget = 0.0, [], max_rounds, seconds
    times = {name: [] for name in names}
    timed = list(names)  # the original and the candidates not yet settled "not faster"
    futile: list[str] = []  # dropped: their interval could no longer clear the margin in time
    comparisons: dict[str, Comparison] = {}
    start = clock()
    while True:
        for name, t in next_round(list(timed)).items():
            if name in timed:
                times[name].append(t)
        done = len(times[original])
        if done == 1:  # fix the schedule: as many rounds as fit in the budget at this pace
            pace = max(clock() - start, 1e-9)
            budget = seconds if math.isinf(seconds) else time_budget(pace, seconds, longest)
            most = max_rounds if math.isinf(budget) else \
                max(min(min_rounds, max_rounds), min(max_rounds, int(budget / pace)))
            schedule = looks(min_rounds, most)
            share = alpha / (len(schedule) * len(candidates))
            if not math.isinf(budget) and min(min_rounds, max_rounds) * pace > longest:
                slow = [c for c in timed[1:] if times[original][0] / times[c][0] < SLOW_ROUNDS_GAIN]
                for c in slow:  # dropping decides nothing "faster": it spends none of the level
                    comparisons[c] = compare(times[original], times[c], share, margin)
                    timed.remove(c)
                    futile.append(c)
                if len(timed) == 1:
                    settled = True
                    break
        if progress is not None:
            progress(done, most)
        out_of_time = done >= min_rounds and clock() - start >= budget
        if done not in schedule and not out_of_time:
            continue
        for c in timed[1:]:
            comparisons[c] = compare(times[original], times[c], share, margin)
            if comparisons[c].high < 1 + margin:
                timed.remove(c)
            elif done < most and comparisons[c].decision != "faster" and \
                    cannot_clear(np.log(times[original]) - np.log(times[c]), share, most, margin):
                timed.remove(c)  # dropping decides nothing "faster": it spends none of the level
                futile.append(c)
        settled = all(comparisons[c].decision == "faster" for c in timed[1:])
        if settled or out_of_time or done >= most:
            break
    if progress is not None:
        progress(done, done)
    stopped = ("futile" if futile and not any(comparisons[c].decision == "faster" for c in comparisons)
               else "decided") if settled else "rounds" if done >= max_rounds else "time"
    return GuardReport({c: comparisons[c] for c in candidates},
                       {k: statistics.median(v) for k, v in times.items()}, done,
                       clock() - start, stopped, 1 - 2 * alpha, budget, most, tuple(futile))


def cannot_clear(d, alpha: float, most: int, margin: float = MARGIN) -> bool:
    """Whether a candidate whose per-round log-ratios so far are ``d`` can no longer be
    confirmed faster (its interval at ``alpha`` a side above 1 + ``margin``) by round
    ``most``, even were the rounds still to come centred at the upper end of its
    interval now. The spread is robust (the median absolute deviation: a load spike
    moves it little) and the interval projected as a normal one, narrowing as the
    square root of the rounds: the signed-rank interval itself, at a look's small
    share of the level, spans nearly the extreme rounds at first, so projecting its own
    ends would drop a 3 % gain that spikes widened (a third of them, on a simulated
    machine with 15 % of runs spiked)."""
    d = np.asarray(d, dtype=float)
    n = len(d)
    if n >= most or n < 2:
        return False
    centre = signed_rank_interval(d, 0.5)[0]
    spread = 1.4826 * float(np.median(np.abs(d - np.median(d))))
    if spread == 0.0:
        return centre < math.log(1 + margin)
    # the Hodges-Lehmann estimate's standard error is about 1.02 sd / sqrt(n) on normal
    # data; Student's quantile, as the spread itself is estimated from n rounds
    z = _t_quantile(1 - alpha, n - 1) * 1.02 * spread
    hoped = centre + z / math.sqrt(n)
    pooled = (n * centre + (most - n) * hoped) / most
    return pooled - z / math.sqrt(most) < math.log(1 + margin)


def _t_quantile(p: float, df: int) -> float:
    """Student's t quantile, by its Cornish-Fisher expansion about the normal one (within
    about 1 % from 4 degrees of freedom on)."""
    z = statistics.NormalDist().inv_cdf(p)
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def time_in_onnxruntime(models: dict, feeds, max_rounds: int = MAX_ROUNDS, progress=None) -> GuardReport:
    """The guard on ONNX models in onnxruntime (``timing.ort_rounds``: one thread, CPU
    time), the first of ``models`` the original."""
    with timing.pinned_threads():
        return run_guard(timing.ort_rounds(models, feeds), list(models), max_rounds=max_rounds,
                         progress=progress)


def format_ratio(c: Comparison) -> str:
    """``1.031x [1.012, 1.049]``."""
    return f"{c.ratio:.3f}x [{c.low:.3f}, {c.high:.3f}]"


def not_faster_why(report: GuardReport, name: str, against: str) -> str:
    """Why candidate ``name`` was not confirmed faster than ``against`` (the original)."""
    c = report.comparisons[name]
    if c.decision == "slower":
        return f"the result measured slower than {against}: {format_ratio(c)}"
    if c.high < 1 + MARGIN:
        return f"the result measured no faster than {against} beyond {MARGIN:.0%}: {format_ratio(c)}"
    if name in report.futile and c.rounds == 1:
        pace = report.seconds / max(report.rounds, 1)
        return (f"a round takes {pace:.0f} s, so the first look ({MIN_ROUNDS} rounds) would end past the "
                f"{report.budget:.0f} s budget, and the first round measured the result at {c.ratio:.3f}x, "
                f"below the {SLOW_ROUNDS_GAIN:g}x that rounds this slow are spent on")
    if name in report.futile:
        return (f"the result could not be confirmed faster than {against} within the budget: "
                f"{format_ratio(c)} after {c.rounds} rounds, too low to clear {MARGIN:.0%} by round "
                f"{report.most}")
    budget = (f"the time budget ({report.budget:.0f} s) ran out after {report.rounds} rounds"
              if report.stopped == "time" else f"{report.rounds} rounds, the most allowed (--measure)")
    return (f"could not decide whether the result is faster than {against}: {format_ratio(c)} after "
            f"{budget} (the machine too noisy, or the gain too small, to confirm)")


# --- the decision ---------------------------------------------------------------------


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
              f"at most {TIME_BUDGET:g} s, {MAX_TIME_BUDGET:g} s for slow rounds)")
        with phases("timing"):
            report = time_in_onnxruntime(models, feeds, measure, measure_progress)
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
    return prediction.reach >= 1 + MARGIN


def predicted_below(predictions: dict[str, Prediction]) -> str:
    """``the re-export 1.003x (below 1.06x), the result 1.001x (at most 1.006x, below 1.01x)``."""
    def one(name: str, p: Prediction) -> str:
        word = "from" if worth_timing(name, p) else "below"
        if name == "re-export":
            return f"the {name} {p.speedup:.3f}x ({word} {REEXPORT_ABOVE:g}x)"
        return f"the {name} {p.speedup:.3f}x (at most {p.reach:.3f}x, {word} {1 + MARGIN:g}x)"
    return ", ".join(one(name, p) for name, p in predictions.items())


def _why_not_the_result(report: GuardReport, twins: dict[str, str], best: str,
                        predictions: dict[str, Prediction]) -> str:
    if "result" in twins:
        return f"the result computes node for node what the {twins['result']} does"
    if "result" not in report.comparisons:
        return (f"the result was predicted at {predictions['result'].speedup:.3f}x the original (at most "
                f"{predictions['result'].reach:.3f}x, below {1 + MARGIN:g}x), and not timed")
    c = report.comparisons["result"]
    if c.decision == "faster":  # and the re-export more so
        return (f"the {best} measured faster than the result ({format_ratio(report.comparisons[best])} "
                f"against {format_ratio(c)})")
    return not_faster_why(report, "result", "the original")


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
    report = time_in_onnxruntime({"original": export_fed(graph), "optimized": export_fed(candidate)},
                                 random_inputs(graph), max_rounds, progress)
    if report.comparisons["optimized"].decision == "faster":
        return candidate, report, ""
    return graph, report, not_faster_why(report, "optimized", "the input")
