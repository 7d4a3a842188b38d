"""The public API: saturate a graph, extract the cheapest equivalent graph, or both.

``optimize`` checks every result numerically against the input graph before it is
returned; a mismatch raises VerificationError.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .cost import DEFAULT_PROFILE, MIN_GAIN, CostModel, graph_cost, load_cost_model
from .egraph.convert import build_graph
from .egraph.pricing import ENodeConfigs, node_cost
from .egraph.saturate import Limits, Saturation, saturate
from .errors import ExtractionError, LimitError, TasoEggError
from .graph import Graph
from .rules.lang import load_corpus
from .timing import measure as measure_runs
from .verify import check_graphs_equivalent


@dataclass
class Extraction:
    graph: Graph
    dag_cost: float
    seconds: float
    extractor: str
    status: str
    picks: list[str] = field(default_factory=list)  # the chosen e-node ids (for pictures)


@dataclass
class OptimizeResult:
    graph: Graph
    original: Graph
    cost_before: float
    cost_after: float
    cost_model: str
    stats: dict = field(default_factory=dict)
    saturation: Saturation | None = None

    @property
    def speedup(self) -> float:
        return self.cost_before / self.cost_after if self.cost_after > 0 else math.inf


def extract_graph(saturation: Saturation, extractor: str = "greedy-dag",
                  cost_model: CostModel | None = None, time_limit: float | None = None) -> Extraction:
    """Pick the cheapest graph in a saturated e-graph (DAG cost) and rebuild it."""
    from .extract import EXTRACTORS
    from .extract import egraph as xeg
    from .extract.check import used_classes

    if extractor not in EXTRACTORS:
        raise ExtractionError(f"unknown extractor {extractor!r}; choose from {sorted(EXTRACTORS)}")
    model = cost_model or load_cost_model()
    configs = ENodeConfigs(saturation)
    eg = configs.eg
    class_ids = list(eg.classes)
    index = {c: i for i, c in enumerate(class_ids)}
    node_ids, node_class, costs, children, ops = [], [], [], [], []
    for cid, nodes in eg.classes.items():
        for n in nodes:
            c = node_cost(n, configs, model)
            if not math.isfinite(c) or any(ch not in index for ch in n.children):
                continue
            node_ids.append(n.id)
            node_class.append(index[cid])
            costs.append(c)
            children.append(tuple(index[ch] for ch in n.children))
            ops.append(n.op)
    roots = [index[r] for r in eg.roots]
    xgraph = xeg.EGraph(class_ids, node_ids, node_class, costs, children, roots, ops, "saturation")
    result = EXTRACTORS[extractor]().extract(xgraph, None, time_limit)
    picks = [(class_ids[c], node_ids[result.choice[c]]) for c in used_classes(xgraph, result.choice)]
    graph = build_graph(eg, picks, saturation.graph, saturation.program.opaque)
    return Extraction(graph, result.dag_cost, result.seconds, extractor, result.status,
                      [node for _, node in picks])


# An upper bound on ``measure``: each run times both graphs once more; past a few
# hundred interleaved runs the median no longer moves, only the wait grows.
MAX_MEASURE = 200


def check_optimize_arguments(min_gain: float, measure: int, extract_time_limit: float | None) -> None:
    """What ``optimize`` refuses, checked alone (the CLI calls it before loading anything)."""
    if not 0 <= min_gain < 1:
        raise TasoEggError(f"min_gain (--min-gain) must be a fraction in [0, 1), got {min_gain!r}")
    check_measure(measure)
    if extract_time_limit is not None and not extract_time_limit > 0:
        raise LimitError(f"extract_time_limit (--extract-time-limit) must be a positive number "
                         f"of seconds, got {extract_time_limit!r}")


def check_measure(runs) -> None:
    """LimitError unless ``runs`` is a number of measured runs from 0 to MAX_MEASURE."""
    if not (isinstance(runs, int) and 0 <= runs <= MAX_MEASURE):
        raise LimitError(f"measure (--measure) must be a number of runs from 0 to {MAX_MEASURE}, "
                         f"got {runs!r}")


def optimize(graph: Graph, rules=None, limits: Limits | None = None, extractor: str = "greedy-dag",
             cost_model: CostModel | None = None, progress=None, verify: bool = True,
             seed: int = 0, profile: str = DEFAULT_PROFILE, min_gain: float = MIN_GAIN,
             measure: int = 0, extract_time_limit: float | None = None, phase=None,
             measure_progress=None) -> OptimizeResult:
    """Saturate, extract, check numerically, and keep the better of input and result.

    Costs come from ``cost_model`` when given, else from ``profile`` (a shipped profile's
    name, a profile path, or "analytic"; see ``taso_egg.cost.load_cost_model``).
    The result replaces the input only when its predicted cost is lower by more than
    ``min_gain`` (a fraction): smaller predicted gains are within the cost model's
    error and measured as often slower as faster. With ``measure`` > 0 (at most
    MAX_MEASURE) both graphs are also exported and timed in onnxruntime (``measure``
    interleaved runs each); a result measured slower than the input is not returned.

    ``extract_time_limit`` bounds the extractor in seconds (the ILP's default, 60 s,
    when None). ``progress(iteration_stats)`` is called after each saturation
    iteration, ``phase(message)`` when a later phase starts, and
    ``measure_progress(done, total)`` after each measured run."""
    check_optimize_arguments(min_gain, measure, extract_time_limit)
    phase = phase or (lambda message: None)
    model = cost_model or load_cost_model(profile)
    graph.validate()
    t0 = time.perf_counter()
    rules = tuple(load_corpus() if rules is None else rules)
    # Counting e-classes serializes the e-graph: per iteration only for a progress display.
    sat = saturate(graph, rules=rules, limits=limits, progress=progress, count_classes=progress is not None)
    phase(f"extracting ({extractor}"
          + (f", time limit {extract_time_limit:g} s)" if extract_time_limit else ")"))
    ext = extract_graph(sat, extractor, model, extract_time_limit)
    before, after = runtime_cost(graph, rules, model), graph_cost(ext.graph, model)
    t_check = time.perf_counter()
    if verify:
        phase("checking the extracted graph against the input (our executor, float64)")
    check_error = check_graphs_equivalent(graph, ext.graph, seed=seed) if verify else None
    check_seconds = time.perf_counter() - t_check
    best, kept = ext.graph, ""  # kept: why the input is returned instead
    if after >= before * (1 - min_gain):
        best = graph
        kept = f"predicted gain {1 - after / before:+.2%} is not above min_gain {min_gain:.2%}" \
            if before > 0 else "the input costs nothing"
    measured = None
    if measure and best is not graph:
        phase(f"timing input and result in onnxruntime ({measure} interleaved runs each)")
        best, measured, kept = keep_unless_faster(graph, best, measure, measure_progress)
    stats = {
        "saturation_seconds": sat.seconds,
        "extraction_seconds": ext.seconds,
        "check_seconds": check_seconds,
        "check_error": check_error,
        "total_seconds": time.perf_counter() - t0,
        "stop_reason": sat.stop_reason,
        "iterations": len(sat.iterations),
        "enodes": sat.enodes,
        "eclasses": sat.iterations[-1].eclasses if progress is not None else sat.eclasses(),
        "extractor": extractor,
        "extractor_status": ext.status,
        "ops_before": graph.op_counts(runtime_only=True),  # what runs after export
        "ops_after": best.op_counts(runtime_only=True),
        "rules": len(sat.rules),
        "extracted_cost": after,
        "input_cost": graph_cost(graph, model),  # every operator priced alone, no fusions
        "kept_input": kept,  # "" when the result is returned
        "measured_ms": measured,  # onnxruntime, input and result, when measured
    }
    if hasattr(model, "lookups"):  # a profiled model: how many costs were measured vs estimated
        stats["cost_lookups"] = model.lookups()
    return OptimizeResult(best, graph, before, after if best is ext.graph else before,
                          getattr(model, "name", "cost model"), stats, sat)


def keep_unless_faster(graph: Graph, candidate: Graph, repeats: int,
                       progress=None) -> tuple[Graph, dict[str, float], str]:
    """Time ``graph`` and ``candidate`` in onnxruntime (``repeats`` interleaved runs,
    median); ``(graph, times, why)`` when the candidate measured slower, else
    ``(candidate, times, "")``. Times are milliseconds under "original" and
    "optimized". Every command that writes an optimized graph applies this guard."""
    times = measure_runs(graph, {"optimized": candidate}, repeats, runtimes=("ort",),
                         progress=progress)["ort"]
    if times["optimized"] > times["original"]:
        return graph, times, "the result measured slower than the input in onnxruntime"
    return candidate, times, ""


def runtime_form(graph: Graph, rules, model: CostModel) -> Graph:
    """``graph`` as a runtime runs it: with the corpus's fusion rules (named
    ``*-fusion``) applied and nothing else; ``graph`` itself when none applies or
    pays. cuDNN and onnxruntime fuse activations and residual adds into convolutions
    by themselves, so a predicted gain must be measured from there, not from every
    operator priced alone."""
    fusions = [r for r in rules if r.name.endswith("-fusion")]
    if not fusions:
        return graph
    sat = saturate(graph, rules=fusions, limits=Limits(iterations=4, multi_iterations=0),
                   count_classes=False)
    fused = extract_graph(sat, "greedy-dag", model).graph
    return fused if graph_cost(fused, model) < graph_cost(graph, model) else graph


def runtime_cost(graph: Graph, rules, model: CostModel) -> float:
    return graph_cost(runtime_form(graph, rules, model), model)
