"""Extractors by name, and one call to run any of them."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ExtractionError
from ..options import EXTRACTOR_NAMES, ExtractionOptions
from .egraph import EGraph
from .extractor import Extractor
from .greedy_dag import GreedyDagExtractor
from .ilp import IlpExtractor
from .result import ExtractionResult
from .tree import TreeExtractor

EXTRACTORS: dict[str, type[Extractor]] = {
    cls.name: cls for cls in (TreeExtractor, GreedyDagExtractor, IlpExtractor)
}
# the names every command offers are declared once, in options (below the commands)
assert tuple(EXTRACTORS) == EXTRACTOR_NAMES, (tuple(EXTRACTORS), EXTRACTOR_NAMES)


def extract(
    egraph: EGraph,
    extractor: str = ExtractionOptions.extractor,
    roots: Iterable[str] | None = None,
    time_limit: float | None = None,
    verbose: bool = False,
    gap_tolerance: float | None = None,
) -> ExtractionResult:
    """Run the named extractor on the e-graph (roots default to the file's own).
    ``gap_tolerance``: the proven relative gap the ILP stops at (None: its default);
    the heuristics prove no gap and take none."""
    if extractor not in EXTRACTORS:
        known = ", ".join(EXTRACTORS)
        raise ExtractionError(f"unknown extractor {extractor!r} (known: {known})")
    if gap_tolerance is None:
        return EXTRACTORS[extractor](verbose=verbose).extract(egraph, roots=roots, time_limit=time_limit)
    if extractor != IlpExtractor.name:
        raise ExtractionError(f"a gap tolerance applies to the ilp extractor only, not {extractor!r}")
    return IlpExtractor(verbose=verbose, gap_tolerance=gap_tolerance).extract(egraph, roots=roots,
                                                                            time_limit=time_limit)
