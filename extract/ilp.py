"""Exact DAG-cost extraction as an integer program, solved by HiGHS.

1. A first solution: greedy DAG (tree extraction if greedy cannot finish in its share
   of the time): the upper bound and the warm start.
2. The node set is shrunk (see shrink.py) with that bound; shrinking also names the
   classes every extraction uses, whose rows become equalities (bounds.py).
   The longest-path bound (bounds.py) may already prove the first solution close
   enough (vgg: equal to greedy's cost), and then nothing else runs.
3. A short run of the full MIP (SCOUT_SHARE of the time): it proves small e-graphs
   optimal at once, and then nothing else runs.
4. Neighbourhood search (lns.py) re-solves small sub-models around shared inputs,
   each warm-started from the incumbent; this is where large e-graphs get their good
   solutions (on bert the full MIP alone stalls far above them). It gets at most
   LNS_SHARE of the time, and stops early once no region improves, or once half the
   time spent before it (at least 2 s) passes without a better solution.
5. The full MIP, warm-started from the best solution so far, runs for the rest of the
   time, or until it stalls: as long as half the time spent before it (at least 2 s)
   passes with neither a better solution nor, where the gap is small enough to be
   worth closing (GAP_WORTH_PROVING), the gap shrinking by a fifth. It proves
   optimality, and its dual bound is the proven lower bound; where its relaxation is
   weak it would otherwise spend the whole limit proving nothing (a GPT-2 decode
   step's bound rose from 49 % to 19 % below the incumbent over 25 s, and the
   incumbent, greedy's, never moved).
Every phase stops at the deadline, and every phase stops once the proven gap (the
incumbent against the best bound so far, the longest-path bound or HiGHS's dual bound)
is at most ``gap_tolerance``, 0.1 % by default: on the zoo's e-graphs the costs are
predicted milliseconds, and 0.1 % of them is far below what onnxruntime measures
reliably, while proving the last 0.1 % can take most of the time limit. The status
then says "within gap" (OPTIMAL only for a gap of at most 1e-6).

HiGHS's word is never taken. Each answer is read back and checked: the point must be
a complete, acyclic choice; its recomputed DAG cost must match the objective HiGHS
reports (no lower; no higher either, if it claims optimality); the bound may not lie
above the cost of a known choice. A run that fails is logged and solved again in a
safer configuration, first without the start point, then without presolve too (HiGHS
1.16 with presolve and a start point has answered "optimal" with a wrong objective and
bound and handed back the start point), while time is left. Only a run that passes
the check may claim optimality or give the lower bound.
"""

from __future__ import annotations

import logging
import math
import time
from typing import NamedTuple

import highspy

from ..errors import ExtractionError, LimitError
from ..options import ExtractionOptions
from .choice_check import check_choice, used_classes
from .bounds import path_bound
from .egraph import EGraph
from .extractor import Extractor, Solution
from .greedy_dag import first_choice
from .ilp_model import IlpModel
from .lns import NeighbourhoodSearch
from .result import (
    NO_IMPROVEMENT, OPTIMAL, OPTIMAL_GAP, PATH_BOUND, SOLVER_BOUND, STALLED, STALLED_NO_IMPROVEMENT, TIME_LIMIT,
    WITHIN_GAP, agrees, relative_gap,
)
from .shrink import shrink

log = logging.getLogger(__name__)

DEFAULT_GAP_TOLERANCE = 1e-3  # stop at a proven gap of 0.1 % (see the module docstring)
WARM_SHARE = 0.2  # of the time limit, at most, for greedy DAG in step 1
SCOUT_SHARE = 0.05  # of the time limit, at most, for step 3
LNS_SHARE = 0.7  # of the time limit, at most, for steps 1-4 together
SUB_MIP_SHARE = 0.1  # of the time limit, at most, for one sub-model of step 4
# The last full MIP stops after this share of the time spent before it without progress
# (a better solution, or the proven gap down by STALL_GAP_SHRINK of itself), and never
# sooner than STALL_FLOOR seconds: the time follows what it still finds, up to the limit.
STALL_SHARE = 0.5
STALL_FLOOR = 2.0
STALL_GAP_SHRINK = 0.2
# ... and the gap shrinking counts as progress only below this: a wider one is the weak
# relaxation's, which never closed on the e-graphs at hand (bert 16 %, a decode step 19 %).
GAP_WORTH_PROVING = 0.02
# (warm start, presolve): the configurations a model is solved in, safest last.
CONFIGS = ((True, "on"), (False, "on"), (False, "off"))
# A solve that starts with less than this share of the whole time limit left runs without
# presolve: HiGHS's presolve does not always stop at its time limit (extraction-gym's
# herbie/859 under load: 60 s asked, 70 s taken).
PRESOLVE_SHARE = 0.1
_EPS = 1e-9
_OPTIMAL = highspy.HighsModelStatus.kOptimal


class Answer(NamedTuple):
    """What one HiGHS run claims: its status, the objective and column values of its
    point (None without one) and its dual bound (None if not finite)."""

    status: highspy.HighsModelStatus
    objective: float | None
    point: list[float] | None
    bound: float | None


def read_answer(h: highspy.Highs) -> Answer:
    info = h.getInfo()
    feasible = info.primal_solution_status == 2  # a feasible point exists
    bound = info.mip_dual_bound
    return Answer(
        h.getModelStatus(),
        info.objective_function_value if feasible else None,
        list(h.getSolution().col_value) if feasible else None,
        bound if math.isfinite(bound) else None,
    )


class IlpExtractor(Extractor):
    name = "ilp"

    def __init__(self, verbose: bool = False, gap_tolerance: float = DEFAULT_GAP_TOLERANCE):
        """``gap_tolerance``: stop once the proven relative gap is at most this (0: prove
        optimality, or run to the time limit)."""
        super().__init__(verbose)
        self._presolve_until = math.inf  # the running solve's: no presolve starts later
        self.stalled = False  # the last solve stopped for want of progress, not at the limit
        if isinstance(gap_tolerance, bool) or not isinstance(gap_tolerance, (int, float)) \
                or not 0 <= gap_tolerance < 1:
            raise LimitError(f"gap tolerance must be a number in [0, 1), got {gap_tolerance!r}")
        self.gap_tolerance = float(gap_tolerance)

    def solve(self, egraph: EGraph, roots: tuple[int, ...], time_limit: float | None) -> Solution:
        self.stalled = False
        limit = ExtractionOptions.time_limit if time_limit is None else time_limit
        start = time.perf_counter()
        deadline = start + limit
        self._presolve_until = deadline - PRESOLVE_SHARE * limit
        best = _Incumbent(egraph, roots, first_choice(egraph, roots, start + WARM_SHARE * limit))
        shrunk = shrink(egraph, roots, best.cost, protect=frozenset(best.choice.values()), deadline=deadline)
        nodes = shrunk.nodes
        lower = _Lower(best, max(self.gap_tolerance, OPTIMAL_GAP))
        alive = [False] * egraph.n_nodes
        for n in nodes:
            alive[n] = True
        lower.offer(path_bound(egraph, alive, roots, deadline), PATH_BOUND)
        if lower.close():
            return lower.proven(None)
        full = _Configs("full MIP", logging.WARNING)
        model = IlpModel(egraph, nodes, roots, shrunk.required)  # the scout's and the last phase's
        scout = self._mip(model, best, min(deadline, time.perf_counter() + SCOUT_SHARE * limit), full)
        if scout is not None:
            lower.offer(scout.bound, SOLVER_BOUND)
            if scout.status == _OPTIMAL or lower.close():
                return lower.proven(scout)

        subs = _Configs("sub-model", logging.DEBUG)

        def solve_sub(sub_nodes: list[int]) -> None:
            sub_deadline = min(deadline, time.perf_counter() + SUB_MIP_SHARE * limit)
            sub = IlpModel(egraph, sub_nodes, roots, shrunk.required)
            self._mip(sub, best, sub_deadline, subs, log_solver=False, gap=OPTIMAL_GAP)

        lns_deadline = min(deadline, start + LNS_SHARE * limit)
        if time.perf_counter() < lns_deadline:
            # Its tree and greedy picks only close sub-models: a short share will do.
            picks_deadline = min(lns_deadline, time.perf_counter() + WARM_SHARE * limit)
            search = NeighbourhoodSearch(egraph, nodes, deadline=picks_deadline)
            patience = max(STALL_FLOOR, STALL_SHARE * (time.perf_counter() - start))
            search.run(best, solve_sub, lns_deadline, stop=lower.close, patience=patience)
        if subs.failed:
            log.warning("%s: %d of %d sub-model answers failed the check and were solved again",
                        egraph.source, subs.failed, subs.runs)
        if lower.close():
            return lower.proven(None)

        # The last run gets as long without progress as half of what came before (at least
        # STALL_FLOOR): where its relaxation is weak (many merges of one input) HiGHS
        # neither improves nor proves for the rest of the limit.
        stall = max(STALL_FLOOR, STALL_SHARE * (time.perf_counter() - start))
        answer = self._mip(model, best, deadline, full, stall=stall)
        if answer is not None:
            lower.offer(answer.bound, SOLVER_BOUND)
            if answer.status == _OPTIMAL or lower.close():
                return lower.proven(answer)
        if self.stalled:
            return Solution(best.choice, STALLED if best.improved else STALLED_NO_IMPROVEMENT, lower.value,
                            best.cost, lower.source)
        return Solution(best.choice, TIME_LIMIT if best.improved else NO_IMPROVEMENT, lower.value, best.cost,
                        lower.source)

    def _mip(self, model: IlpModel, best: _Incumbent, deadline: float, configs: _Configs,
             log_solver: bool = True, gap: float | None = None, stall: float | None = None) -> Answer | None:
        """Solve ``model`` until the deadline, from the incumbent where the configuration
        says so; keep every valid point that improves it. Returns the first answer that
        passes the check, or None (no time, or no configuration gave a sound answer).
        ``log_solver``: show the solver's log if verbose (not for the many sub-models).
        ``gap``: the relative gap HiGHS may stop at (default: the extractor's tolerance).
        ``stall``: stop once this many seconds pass without progress (``_Stall``)."""
        gap = self.gap_tolerance if gap is None else gap
        for i in range(configs.first, len(CONFIGS)):
            warm, presolve = CONFIGS[i]
            seconds = deadline - time.perf_counter()
            if seconds <= max(0.05, model.build_seconds):  # no time left to solve once built
                return None
            built = time.perf_counter()
            h = model.build(integer=True, order=True, verbose=self.verbose and log_solver, gap=gap)
            model.build_seconds = time.perf_counter() - built
            if time.perf_counter() > self._presolve_until:
                presolve = "off"
            h.setOptionValue("presolve", presolve)
            if warm:
                h.setSolution(model.start(best.choice, order=True))
            seconds = deadline - time.perf_counter()
            if seconds <= 0.05:
                return None
            h.setOptionValue("time_limit", seconds)
            if stall is not None:
                watch = _Stall(stall, best.cost)
                h.cbMipImprovingSolution.subscribe(watch.improved)
                h.cbMipInterrupt.subscribe(watch.interrupt)
            h.run()
            if stall is not None and watch.stopped:
                self.stalled = True
            configs.runs += 1
            answer = read_answer(h)
            fault = _check(model, best, answer, gap)
            if fault is None:
                return answer
            configs.failed += 1
            configs.first = max(configs.first, i + 1)  # this model family misleads HiGHS here
            log.log(configs.level, "%s: %s (start point %s, presolve %s): %s", best.egraph.source,
                    configs.what, "given" if warm else "not given", presolve, fault)
        return None


class _Stall:
    """HiGHS's callbacks: interrupt the solve once ``seconds`` pass without progress, a
    better solution or a gap below GAP_WORTH_PROVING shrunk by STALL_GAP_SHRINK of itself."""

    def __init__(self, seconds: float, incumbent: float):
        self.seconds = seconds
        self.incumbent = incumbent
        self.last = time.perf_counter()
        self.gap = math.inf
        self.stopped = False

    def improved(self, event) -> None:
        # HiGHS reports each solution better than its own previous one: where it set the
        # start point aside, those can all be worse than ours
        value = event.data_out.objective_function_value
        if value < self.incumbent * (1 - _EPS):
            self.incumbent, self.last = value, time.perf_counter()

    def interrupt(self, event) -> None:
        gap = event.data_out.mip_gap
        if math.isfinite(gap) and gap < GAP_WORTH_PROVING and gap < self.gap * (1 - STALL_GAP_SHRINK):
            self.gap, self.last = gap, time.perf_counter()
        if time.perf_counter() - self.last > self.seconds:
            event.data_in.user_interrupt = True
            self.stopped = True


class _Configs:
    """Which configuration a family of models (the full MIP, the sub-models) starts in,
    and how many of its runs failed the check."""

    def __init__(self, what: str, level: int):
        self.what, self.level = what, level
        self.first = 0
        self.runs = self.failed = 0


def _check(model: IlpModel, best: _Incumbent, answer: Answer, gap: float) -> str | None:
    """Why ``answer`` cannot be believed, or None. Offers its point to the incumbent
    (a valid point is a valid choice, whatever HiGHS said about it). ``gap``: the
    relative gap HiGHS was allowed to stop at, so "optimal" means within it."""
    optimal = answer.status == _OPTIMAL
    if answer.point is None:
        return "claims optimality without a point" if optimal else None
    try:
        cost = best.offer(model.choice(answer.point))
    except ExtractionError as e:
        return f"its point is not a valid choice ({e})"
    obj = answer.objective
    if obj < cost and not agrees(obj, cost):
        return f"reports objective {obj:.9g} for a point that costs {cost:.9g}"
    # "Optimal" means within the gap HiGHS was given: its point (which may carry unused
    # nodes) and the known choices may lie below its objective by that much, no more.
    slack = gap * abs(obj)
    if optimal and obj - slack > cost and not agrees(obj - slack, cost):
        return f"reports optimal objective {obj:.9g} for a point that costs less, {cost:.9g}"
    if optimal and best.cost < obj - slack and not agrees(obj - slack, best.cost):
        return f"reports optimal objective {obj:.9g}, but a choice in the model costs {best.cost:.9g}"
    if answer.bound is not None and answer.bound > best.cost and not agrees(answer.bound, best.cost):
        return f"reports lower bound {answer.bound:.9g} above the cost {best.cost:.9g} of a known choice"
    return None


class _Lower:
    """The best proven lower bound so far, what proved it, and whether it is close
    enough to the incumbent to stop."""

    def __init__(self, best: _Incumbent, tolerance: float):
        self.best, self.tolerance = best, tolerance
        self.value: float | None = None
        self.source: str | None = None

    def offer(self, bound: float | None, source: str) -> None:
        if bound is not None and (self.value is None or bound > self.value):
            self.value, self.source = bound, source

    def close(self) -> bool:
        return self.value is not None and relative_gap(self.best.cost, self.value) <= self.tolerance

    def proven(self, answer: Answer | None) -> Solution:
        """The incumbent as proven optimal, or within the tolerance (``answer``: the
        HiGHS run that proved it, whose objective is kept as the claim if it is about
        the incumbent). A HiGHS "optimal" that stopped short of the tolerance (by its
        absolute gap) is reported as what it is: a time-limit-like stop with a bound."""
        best = self.best
        claim = best.cost
        if answer is not None and answer.objective is not None and agrees(answer.objective, best.cost):
            claim = answer.objective
        gap = None if self.value is None else relative_gap(best.cost, self.value)
        if gap is not None and gap <= OPTIMAL_GAP:
            status = OPTIMAL
        elif gap is not None and gap <= self.tolerance:
            status = WITHIN_GAP
        else:
            status = TIME_LIMIT if best.improved else NO_IMPROVEMENT
        return Solution(best.choice, status, self.value, claim, self.source)


class _Incumbent:
    """The best valid choice seen, and whether anything beat the first one."""

    def __init__(self, egraph: EGraph, roots: tuple[int, ...], choice: dict[int, int]):
        self.egraph, self.roots = egraph, roots
        self.choice, self.cost = self._used(choice), check_choice(egraph, choice, roots)
        self.improved = False

    def offer(self, choice: dict[int, int]) -> float:
        """The choice's recomputed cost (ExtractionError if it is not a valid choice);
        it becomes the incumbent if it is cheaper."""
        cost = check_choice(self.egraph, choice, self.roots)
        if cost < self.cost - _EPS * max(1.0, abs(self.cost)):
            self.choice, self.cost, self.improved = self._used(choice), cost, True
        return cost

    def _used(self, choice: dict[int, int]) -> dict[int, int]:
        # Only the classes in use: the rest may name nodes the shrunk model dropped.
        return {c: choice[c] for c in used_classes(self.egraph, choice, self.roots)}
