"""The guard: whether a candidate is faster than the original, measured.

It times the original and its candidates in onnxruntime in paired, interleaved rounds
(``timing.ort_rounds``: each round runs each once, in an order drawn afresh) and keeps
timing until the answer is clear or its budget (rounds, seconds) runs out. Per
candidate it takes the log of the original's time over the candidate's in each round,
and at each look of a fixed schedule puts a confidence interval on their centre: the
Hodges-Lehmann estimate with the Wilcoxon signed-rank interval (exact,
distribution-free, robust: a load spike moves one rank, not the estimate). Under no
difference, with the order a fair draw, each round's log-ratio is as likely to be
negative as positive whatever the machine's load does, which is all the interval
assumes. Its level is split (Bonferroni) over every look and every candidate, so that
stopping as soon as the answer looks clear, and choosing among several candidates,
keeps a false "faster" at ALPHA at most. A candidate is "faster" when its whole
interval lies above 1 + MARGIN.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import timing
from ..options import MAX_ROUNDS, MIN_ROUNDS

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
