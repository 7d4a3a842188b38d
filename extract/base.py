"""The one interface every extractor implements."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import ClassVar, NamedTuple

from ..errors import LimitError
from .check import check_choice, used_classes
from .egraph import EGraph
from .result import ExtractionResult


class Solution(NamedTuple):
    choice: dict[int, int]
    status: str
    lower_bound: float | None = None


class Extractor:
    """Subclasses set ``name`` and implement ``solve``; ``extract`` times and validates."""

    name: ClassVar[str]

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
        return ExtractionResult(
            extractor=self.name,
            choice=choice,
            dag_cost=check_choice(egraph, choice, root_idx),
            seconds=seconds,
            status=sol.status,
            lower_bound=sol.lower_bound,
        )

    def solve(self, egraph: EGraph, roots: tuple[int, ...], time_limit: float | None) -> Solution:
        raise NotImplementedError
