"""What every extractor returns."""

from __future__ import annotations

from dataclasses import dataclass

# Status words, shared by all extractors and printed by the CLI and the benchmark.
OPTIMAL = "optimal"  # proven optimal DAG cost (gap at most OPTIMAL_GAP)
WITHIN_GAP = "within gap"  # proven within the extractor's gap tolerance of the optimum
HEURISTIC = "heuristic"  # no claim of optimality
TIME_LIMIT = "time-limit"  # stopped by the clock; lower_bound says how far off it may be
NO_IMPROVEMENT = "time-limit, greedy kept"  # the ILP found nothing better than its warm start
STALLED = "stalled"  # stopped once it no longer progressed, before the clock; lower_bound says how far off
STALLED_NO_IMPROVEMENT = "stalled, greedy kept"
REJECTED = "claim rejected"  # the solver's objective or bound disagreed with the recomputed cost


OPTIMAL_GAP = 1e-6  # a relative gap this small is "optimal" (HiGHS's own tolerances are of this size)

# Where a proven lower bound came from.
SOLVER_BOUND = "HiGHS dual bound"
PATH_BOUND = "longest-path bound"


def agrees(a: float, b: float) -> bool:
    """Two costs equal within the solver's tolerance (relative 1e-6, absolute 1e-9)."""
    return abs(a - b) <= 1e-6 * max(abs(a), abs(b)) + 1e-9


@dataclass(frozen=True)
class ExtractionResult:
    extractor: str
    choice: dict[int, int]  # class index -> node index, for exactly the classes in use
    dag_cost: float  # recomputed by check_choice, never the solver's own number
    seconds: float
    status: str
    lower_bound: float | None = None  # proven bound on the optimum, when there is one
    objective: float | None = None  # the extractor's own claim of the cost, which dag_cost was checked against
    bound_source: str | None = None  # what proved lower_bound (SOLVER_BOUND, PATH_BOUND)
    gap_tolerance: float | None = None  # the proven gap at which the extractor was told to stop

    @property
    def gap(self) -> float | None:
        """Relative distance to the proven bound: 0 means optimal, None means unknown."""
        return None if self.lower_bound is None else relative_gap(self.dag_cost, self.lower_bound)


def relative_gap(cost: float, bound: float) -> float:
    """(cost - bound) / |cost|, as HiGHS measures it (negative costs too); 0 when the
    two agree."""
    diff = cost - bound
    if diff <= 0 or agrees(cost, bound):
        return 0.0
    return diff / abs(cost) if cost != 0 else 1.0
