"""Bounded equality saturation: one egglog iteration at a time, limits checked after
every iteration, statistics kept for the notebooks."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from ..errors import LimitError
from ..graph import Graph
from .convert import GraphProgram, TensorEGraph, graph_to_program, read_serialized
from .language import declarations

# Functions that are analyses, not e-nodes of the tensor language.
_ANALYSES = {"shape", "dtype", "wlo", "whi", "pending"}


@dataclass(frozen=True)
class Limits:
    """Saturation stops at whichever limit comes first."""
    nodes: int = 20_000        # e-nodes in the tensor language
    iterations: int = 15
    seconds: float = 30.0
    # Iterations in which multi-pattern rules run (k_multi). Tensat uses 1; 2 lets a
    # merge see the results of the first round (BERT's q/k/v after associativity,
    # NasRNN's concatenated pairs) and, measured on the zoo, beats backtracking search
    # on every model at a few thousand extra e-nodes; 3 blows NasRNN past 50,000.
    multi_iterations: int = 2

    def __post_init__(self):
        for name in ("nodes", "iterations", "multi_iterations"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < (0 if name == "multi_iterations" else 1):
                raise LimitError(f"limit {name}={v!r} must be an integer >= "
                                 f"{0 if name == 'multi_iterations' else 1}")
        if not self.seconds > 0:
            raise LimitError(f"limit seconds={self.seconds!r} must be positive")


@dataclass
class IterationStats:
    iteration: int
    enodes: int
    eclasses: int
    seconds: float
    matches: dict[str, int]
    multi: bool


@dataclass
class Saturation:
    """The saturated e-graph of a graph, with how it got there."""
    graph: Graph
    egraph: object                  # egglog.bindings.EGraph
    program: GraphProgram
    stop_reason: str
    iterations: list[IterationStats] = field(default_factory=list)
    seconds: float = 0.0
    rules: tuple = ()
    initial: IterationStats | None = None  # the e-graph before any rewrite ("iteration 0")
    _decoded: TensorEGraph | None = field(default=None, repr=False)

    def serialized(self) -> dict:
        """The e-graph in egraph-serialize JSON form (analysis rows included)."""
        from egglog.bindings import PanicSpan, Var

        span = PanicSpan()
        roots = [Var(span, v) for v in self.program.output_vars]
        return json.loads(self.egraph.serialize(roots).to_json())

    def tensor_egraph(self) -> TensorEGraph:
        """The final e-graph, decoded (once: it no longer changes)."""
        if self._decoded is None:
            self._decoded = read_serialized(self.serialized())
        return self._decoded

    def eclasses(self) -> int:
        """E-classes of tensor sorts in the final e-graph."""
        return _eclasses(self.egraph, self.program)

    @property
    def enodes(self) -> int:
        return self.iterations[-1].enodes if self.iterations else 0


def _sizes(egraph) -> int:
    from egglog.bindings import PrintAllFunctionsSize

    out = egraph.parse_and_run_program("(print-size)")
    sizes = next(o for o in out if isinstance(o, PrintAllFunctionsSize)).sizes
    return sum(n for name, n in sizes if name not in _ANALYSES)


def _eclasses(egraph, program) -> int:
    from egglog.bindings import PanicSpan, Var

    data = json.loads(egraph.serialize([Var(PanicSpan(), program.output_vars[0])]).to_json())
    sorts = {cid: info.get("type") for cid, info in data.get("class_data", {}).items()}
    return sum(1 for s in sorts.values() if s in ("T", "TTup"))


def _run(egraph, schedule: str):
    from egglog.bindings import RunScheduleOutput

    out = egraph.parse_and_run_program(f"(run-schedule {schedule})")
    return next(o.report for o in out if isinstance(o, RunScheduleOutput))


def rules_egraph(rules):
    """An egglog e-graph holding the tensor language and ``rules``, and no terms yet.
    Compiling a large corpus costs more than saturating a small graph with it, so
    callers that saturate many graphs with one corpus reuse this one, between egglog's
    ``(push)`` and ``(pop)``."""
    import egglog.bindings as eb

    from ..rules.egglog import compile_rules

    egraph = eb.EGraph(num_threads=1)
    egraph.parse_and_run_program(declarations() + compile_rules(rules))
    return egraph


# Operators the e-graph of any graph may hold beyond the graph's own: the conversion
# writes conv biases as a broadcast add plus activation, and broadcasts as reshapes.
_CONVERSION_OPS = frozenset({"reshape", "ewadd", "relu", "sigmoid", "tanh"})


def rules_that_can_match(rules, graph: Graph) -> list:
    """The rules whose left-hand sides use only operators that can ever be in the
    e-graph of ``graph``: its own, those of the conversion, and those the right-hand
    sides of such rules add (to a fixed point). The others can never match, and
    compiling them costs more than saturating most models (the generated corpus is
    mostly rules over the generator's constants, which no model holds)."""
    from ..rules.lang import operators

    sides = [(r, operators(r.lhs), operators(r.rhs)) for r in rules]
    present = {n.op for n in graph.nodes.values()} | _CONVERSION_OPS
    grew = True
    while grew:
        grew = False
        for _, lhs, rhs in sides:
            if lhs <= present and not rhs <= present:
                present |= rhs
                grew = True
    return [r for r, lhs, _ in sides if lhs <= present]


def saturate(graph: Graph, rules=None, limits: Limits | None = None, progress=None,
             count_classes: bool = True, egraph=None) -> Saturation:
    """Build the e-graph of ``graph`` and apply ``rules`` (parsed Rule objects;
    default: the proved corpus) until saturation or a limit. ``progress`` is called
    with each IterationStats. ``egraph``: a :func:`rules_egraph` of ``rules`` to add
    the graph to (the caller pushes and pops around it)."""
    from ..rules.lang import load_corpus

    limits = limits or Limits()
    rules = tuple(load_corpus() if rules is None else rules)
    start = time.perf_counter()
    program = graph_to_program(graph)
    if egraph is None:
        egraph = rules_egraph(rules_that_can_match(rules, graph))
    egraph.parse_and_run_program(program.text)
    _run(egraph, "(saturate (run analysis))")
    sat = Saturation(graph, egraph, program, "saturated", rules=rules)
    sat.initial = IterationStats(0, _sizes(egraph), _eclasses(egraph, program) if count_classes else 0,
                                 time.perf_counter() - start, {}, False)
    has_multi = any(r.multi for r in rules)
    for it in range(1, limits.iterations + 1):
        t0 = time.perf_counter()
        use_multi = has_multi and it <= limits.multi_iterations
        before = _sizes(egraph)
        schedule = "(seq (run rewrites) (run multi))" if use_multi else "(run rewrites)"
        report = _run(egraph, schedule)
        _run(egraph, "(saturate (run analysis))")
        enodes = _sizes(egraph)
        stats = IterationStats(it, enodes, _eclasses(egraph, program) if count_classes else 0,
                               time.perf_counter() - t0,
                               {k: v for k, v in report.num_matches_per_rule.items() if v}, use_multi)
        sat.iterations.append(stats)
        if progress:
            progress(stats)
        elapsed = time.perf_counter() - start
        if not report.updated and enodes == before:
            sat.stop_reason = "saturated"
            break
        if enodes >= limits.nodes:
            sat.stop_reason = f"node limit ({limits.nodes})"
            break
        if elapsed >= limits.seconds:
            sat.stop_reason = f"time limit ({limits.seconds:g} s)"
            break
    else:
        sat.stop_reason = f"iteration limit ({limits.iterations})"
    sat.seconds = time.perf_counter() - start
    return sat
