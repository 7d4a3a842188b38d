"""Exact DAG-cost extraction as an integer program, solved by HiGHS.

1. Greedy DAG gives a first solution: an upper bound and the warm start.
2. The node set is shrunk (see shrink.py) with that bound.
3. Neighbourhood search (lns.py) re-solves small sub-models around shared inputs,
   each warm-started from the incumbent; this is where large e-graphs get their good
   solutions (on bert the full MIP alone stalls far above them). It gets at most
   LNS_SHARE of the time, and stops early once no region improves.
4. The full MIP, warm-started from the best solution so far, runs for the rest of the
   time: it proves optimality on small e-graphs, and its dual bound is the proven
   lower bound.
Every solution read back from HiGHS is checked to be complete and acyclic before it
may replace the incumbent.
"""

from __future__ import annotations

import math
import time

import highspy

from ..errors import ExtractionError
from .base import Extractor, Solution
from .check import check_choice, used_classes
from .egraph import EGraph
from .greedy_dag import GreedyDagExtractor
from .ilp_model import IlpModel
from .lns import NeighbourhoodSearch
from .result import NO_IMPROVEMENT, OPTIMAL, TIME_LIMIT
from .shrink import shrink

DEFAULT_TIME_LIMIT = 60.0
LNS_SHARE = 0.7  # of the time limit, at most, for step 3
SUB_MIP_SHARE = 0.1  # of the time limit, at most, for one sub-model of step 3
_EPS = 1e-9
_OPTIMAL = highspy.HighsModelStatus.kOptimal


class IlpExtractor(Extractor):
    name = "ilp"

    def solve(self, egraph: EGraph, roots: tuple[int, ...], time_limit: float | None) -> Solution:
        limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
        start = time.perf_counter()
        deadline = start + limit
        greedy = GreedyDagExtractor().solve(egraph, roots, None).choice
        best = _Incumbent(egraph, roots, greedy)
        nodes = shrink(egraph, roots, best.cost, protect=frozenset(best.choice.values()))

        def solve_sub(sub_nodes: list[int]) -> None:
            sub_deadline = min(deadline, time.perf_counter() + SUB_MIP_SHARE * limit)
            self._mip(IlpModel(egraph, sub_nodes, roots), best, sub_deadline, log=False)

        NeighbourhoodSearch(egraph, nodes).run(best, solve_sub, min(deadline, start + LNS_SHARE * limit))

        status, lower = self._mip(IlpModel(egraph, nodes, roots), best, deadline)
        if status == _OPTIMAL:
            return Solution(best.choice, OPTIMAL, lower)
        return Solution(best.choice, TIME_LIMIT if best.improved else NO_IMPROVEMENT, lower)

    def _mip(self, model: IlpModel, best: _Incumbent, deadline: float, log: bool = True):
        """Solve ``model`` from the incumbent until the deadline; keep what improves it.
        Returns HiGHS's model status and dual bound (None if it did not run or has none).
        ``log``: show the solver's log if verbose (not for the many sub-models)."""
        h = model.build(integer=True, order=True, verbose=self.verbose and log)
        h.setSolution(model.start(best.choice, order=True))
        if not self._run(h, deadline - time.perf_counter()):
            return None, None
        if h.getInfo().primal_solution_status == 2:  # a feasible point exists
            best.offer(model.choice(h.getSolution().col_value))
        bound = h.getInfo().mip_dual_bound
        return h.getModelStatus(), bound if math.isfinite(bound) else None

    @staticmethod
    def _run(h: highspy.Highs, seconds: float) -> bool:
        if seconds <= 0.05:
            return False
        h.setOptionValue("time_limit", seconds)
        h.run()
        return True


class _Incumbent:
    """The best valid choice seen, and whether anything beat the first one."""

    def __init__(self, egraph: EGraph, roots: tuple[int, ...], choice: dict[int, int]):
        self.egraph, self.roots = egraph, roots
        self.choice, self.cost = self._used(choice), check_choice(egraph, choice, roots)
        self.improved = False

    def offer(self, choice: dict[int, int]) -> None:
        try:
            cost = check_choice(self.egraph, choice, self.roots)
        except ExtractionError:
            return  # HiGHS's point violates a row within tolerance; not a valid choice
        if cost < self.cost - _EPS * max(1.0, self.cost):
            self.choice, self.cost, self.improved = self._used(choice), cost, True

    def _used(self, choice: dict[int, int]) -> dict[int, int]:
        # Only the classes in use: the rest may name nodes the shrunk model dropped.
        return {c: choice[c] for c in used_classes(self.egraph, choice, self.roots)}
