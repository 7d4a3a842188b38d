"""The one interface every extractor implements."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import ClassVar, NamedTuple

from ..errors import LimitError
from .choice_check import check_choice, used_classes
from .egraph import EGraph
from .result import OPTIMAL, REJECTED, WITHIN_GAP, ExtractionResult, agrees

log = logging.getLogger(__name__)


class Solution(NamedTuple):
    choice: dict[int, int]
    status: str
    lower_bound: float | None = None
    objective: float | None = None  # the cost the extractor believes its choice has
    bound_source: str | None = None  # what proved lower_bound (result.SOLVER_BOUND, PATH_BOUND)


class Extractor:
    """Subclasses set ``name`` and implement ``solve``; ``extract`` times and validates."""

    name: ClassVar[str]
    gap_tolerance: float | None = None  # the proven gap to stop at; None for heuristics

    def __init__(self, verbose: bool = False):
        self.verbose = verbose  # let the solver print its own log, if it has one

    def extract(
        self, egraph: EGraph, roots: Iterable[str] | None = None, time_limit: float | None = None
    ) -> ExtractionResult:
        if time_limit is not None and not time_limit > 0:
            raise LimitError(f"time limit must be positive, got {time_limit}")
        root_idx = egraph.resolve_roots(roots)
        start = time.perf_counter()
        sol = self.solve(egraph, root_idx, time_limit)
        seconds = time.perf_counter() - start
        # Never trust an extractor's own bookkeeping: validate and recompute the cost.
        used = used_classes(egraph, sol.choice, root_idx)
        choice = {c: sol.choice[c] for c in used}
        cost = check_choice(egraph, choice, root_idx)
        status, lower = sol.status, sol.lower_bound
        if sol.objective is not None and not agrees(sol.objective, cost):
            log.warning("%s: %s reported objective %.9g, but its choice costs %.9g; status %r rejected",
                        egraph.source, self.name, sol.objective, cost, status)
            status, lower = REJECTED, None  # the bound came from the same wrong bookkeeping
        if lower is not None and lower > cost and not agrees(lower, cost):
            log.warning("%s: %s reported lower bound %.9g above the cost %.9g of its choice; bound dropped",
                        egraph.source, self.name, lower, cost)
            status, lower = (REJECTED if status in (OPTIMAL, WITHIN_GAP) else status), None
        return ExtractionResult(
            extractor=self.name,
            choice=choice,
            dag_cost=cost,
            seconds=seconds,
            status=status,
            lower_bound=lower,
            objective=sol.objective,
            bound_source=None if lower is None else sol.bound_source,
            gap_tolerance=self.gap_tolerance,
        )

    def solve(self, egraph: EGraph, roots: tuple[int, ...], time_limit: float | None) -> Solution:
        raise NotImplementedError
