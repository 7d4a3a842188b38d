"""What every extractor returns."""

from __future__ import annotations

from dataclasses import dataclass

# Status words, shared by all extractors and printed by the CLI and the benchmark.
OPTIMAL = "optimal"  # proven optimal DAG cost (within the solver's tolerance)
HEURISTIC = "heuristic"  # no claim of optimality
TIME_LIMIT = "time-limit"  # stopped by the clock; lower_bound says how far off it may be
NO_IMPROVEMENT = "time-limit, greedy kept"  # the ILP found nothing better than its warm start


@dataclass(frozen=True)
class ExtractionResult:
    extractor: str
    choice: dict[int, int]  # class index -> node index, for exactly the classes in use
    dag_cost: float  # recomputed by check_choice, never the solver's own number
    seconds: float
    status: str
    lower_bound: float | None = None  # proven bound on the optimum, when there is one

    @property
    def gap(self) -> float | None:
        """Relative distance to the proven bound: 0 means optimal, None means unknown."""
        if self.lower_bound is None:
            return None
        if self.dag_cost <= 0:
            return 0.0
        return max(0.0, (self.dag_cost - self.lower_bound) / self.dag_cost)
