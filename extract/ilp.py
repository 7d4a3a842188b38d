"""Exact DAG-cost extraction as an integer program, solved by HiGHS.

1. Greedy DAG gives a first solution: an upper bound and the warm start.
2. The node set is shrunk (see shrink.py) with that bound.
3. The LP relaxation without order rows is cheap and a valid lower bound (if it meets
   the greedy cost, greedy is optimal). Neighbourhood: the nodes it uses, plus the
   incumbent's, closed under greedy-DAG and tree picks so that every class they need
   has a node, make a small MIP that HiGHS often solves to optimality in seconds. This
   only finds solutions (its bound proves nothing), and gets at most half the time.
4. The full MIP, warm-started from the best solution so far, runs for the rest of the
   time; its dual bound is the proven lower bound.
Every solution read back from HiGHS is checked to be complete and acyclic before it
may replace the incumbent.
"""

from __future__ import annotations

import time

import highspy

from ..errors import ExtractionError
from .base import Extractor, Solution
from .check import check_choice, used_classes
from .egraph import EGraph
from .greedy_dag import GreedyDagExtractor, greedy_dag_picks
from .ilp_model import IlpModel
from .result import NO_IMPROVEMENT, OPTIMAL, TIME_LIMIT
from .shrink import shrink
from .tree import tree_costs

DEFAULT_TIME_LIMIT = 60.0
NEIGHBOURHOOD_SHARE = 0.5  # of the time limit, at most, for step 3
_EPS = 1e-9
_OPTIMAL = highspy.HighsModelStatus.kOptimal


class IlpExtractor(Extractor):
    name = "ilp"

    def solve(self, egraph: EGraph, roots: tuple[int, ...], time_limit: float | None) -> Solution:
        limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
        deadline = time.perf_counter() + limit
        greedy = GreedyDagExtractor().solve(egraph, roots, None).choice
        best = _Incumbent(egraph, roots, greedy)
        nodes = shrink(egraph, roots, best.cost, protect=frozenset(best.choice.values()))
        model = IlpModel(egraph, nodes, roots)

        lower = None
        lp = model.build(integer=False, order=False, verbose=self.verbose)
        if self._run(lp, deadline - time.perf_counter()) and lp.getModelStatus() == _OPTIMAL:
            lower = lp.getInfo().objective_function_value
            if lower >= best.cost - _EPS * max(1.0, best.cost):
                return Solution(best.choice, OPTIMAL, lower)
            used = [model.nodes[j] for j, v in enumerate(lp.getSolution().col_value) if v > _EPS]
            small = IlpModel(egraph, _close(egraph, nodes, used + list(best.choice.values())), roots)
            self._mip(small, best, min(deadline, time.perf_counter() + NEIGHBOURHOOD_SHARE * limit))

        status, bound = self._mip(model, best, deadline)
        if bound is not None:
            lower = bound if lower is None else max(lower, bound)
        if status == _OPTIMAL:
            return Solution(best.choice, OPTIMAL, lower)
        return Solution(best.choice, TIME_LIMIT if best.improved else NO_IMPROVEMENT, lower)

    def _mip(self, model: IlpModel, best: _Incumbent, deadline: float):
        """Solve ``model`` from the incumbent until the deadline; keep what improves it.
        Returns HiGHS's model status and dual bound (None if it did not run)."""
        h = model.build(integer=True, order=True, verbose=self.verbose)
        h.setSolution(model.start(best.choice, order=True))
        if not self._run(h, deadline - time.perf_counter()):
            return None, None
        if h.getInfo().primal_solution_status == 2:  # a feasible point exists
            best.offer(model.choice(h.getSolution().col_value))
        return h.getModelStatus(), h.getInfo().mip_dual_bound

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


def _close(egraph: EGraph, allowed: list[int], nodes: list[int]) -> list[int]:
    """``nodes`` plus the greedy-DAG and tree picks among ``allowed`` of every class that
    they touch or need, recursively: completable, inside the full model, and holding
    the nodes that the two greedy extractors found good."""
    mask = [False] * egraph.n_nodes
    for n in allowed:
        mask[n] = True
    picks = (tree_costs(egraph, mask)[1], greedy_dag_picks(egraph, mask))
    keep = set(nodes)
    have: set[int] = set()
    stack = [int(egraph.node_class[n]) for n in keep]
    while stack:
        cls = stack.pop()
        if cls in have:
            continue
        have.add(cls)
        keep.update(p[cls] for p in picks if p[cls] >= 0)
        stack.extend(d for n in egraph.class_nodes[cls] if n in keep for d in egraph.child_sets[n])
    return sorted(keep)
