"""The public API: saturate a graph, extract the cheapest equivalent graph, or both.

``optimize`` checks every result numerically against the input graph before it is
returned; a mismatch raises VerificationError.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field

from .cost import AnalyticCost, CostModel, graph_cost
from .egraph.convert import TensorEGraph, build_graph
from .egraph.saturate import Limits, Saturation, saturate
from .errors import ExtractionError, TasoEggError
from .graph import Graph
from .ops import OPS, TensorType
from .verify import check_graphs_equivalent

_FREE = ("proj", "tnil", "tcons")


@dataclass
class Extraction:
    graph: Graph
    dag_cost: float
    seconds: float
    extractor: str
    status: str


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


def _node_cost(n, eg: TensorEGraph, model: CostModel, weight_only: set, opaque) -> float:
    if n.op in _FREE or OPS[n.op].is_leaf:
        return 0.0
    if n.children and all(c in weight_only for c in n.children) and n.op != "opaque":
        return 0.0
    if n.op == "opaque":
        node = opaque[n.params["key"]]
        return model.cost(node.op, node.params, [t.type for t in node.inputs], node.outputs)
    if n.op == "split":
        return 0.0  # a view; its outputs are costed by their users
    shapes = [eg.shapes.get(c) for c in n.children]
    if any(s is None for s in shapes):
        return math.inf
    ins = [TensorType(tuple(s)) for s in shapes]
    try:
        outs = OPS[n.op].infer(n.params, ins)
    except TasoEggError:
        return math.inf
    return model.cost(n.op, n.params, ins, outs)


def _weight_only_classes(eg: TensorEGraph) -> set[str]:
    out: set[str] = set()
    changed = True
    while changed:
        changed = False
        for cid, nodes in eg.classes.items():
            if cid in out:
                continue
            for n in nodes:
                leaf_const = n.op != "proj" and n.op in OPS and OPS[n.op].is_constant
                derived = n.op not in ("opaque", "input", "tnil", "tcons") and n.children and \
                    all(c in out for c in n.children)
                if leaf_const or derived:
                    out.add(cid)
                    changed = True
                    break
    return out


def extract_graph(saturation: Saturation, extractor: str = "greedy-dag",
                  cost_model: CostModel | None = None, time_limit: float | None = None) -> Extraction:
    """Pick the cheapest graph in a saturated e-graph (DAG cost) and rebuild it."""
    from .extract import EXTRACTORS
    from .extract import egraph as xeg
    from .extract.check import used_classes

    if extractor not in EXTRACTORS:
        raise ExtractionError(f"unknown extractor {extractor!r}; choose from {sorted(EXTRACTORS)}")
    model = cost_model or AnalyticCost()
    eg = saturation.tensor_egraph()
    weight_only = _weight_only_classes(eg)
    class_ids = list(eg.classes)
    index = {c: i for i, c in enumerate(class_ids)}
    node_ids, node_class, costs, children, ops = [], [], [], [], []
    for cid, nodes in eg.classes.items():
        for n in nodes:
            c = _node_cost(n, eg, model, weight_only, saturation.program.opaque)
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
    return Extraction(graph, result.dag_cost, result.seconds, extractor, result.status)


def optimize(graph: Graph, rules=None, limits: Limits | None = None, extractor: str = "greedy-dag",
             cost_model: CostModel | None = None, progress=None, verify: bool = True,
             seed: int = 0) -> OptimizeResult:
    """Saturate, extract, check numerically, and keep the better of input and result."""
    model = cost_model or AnalyticCost()
    graph.validate()
    t0 = time.perf_counter()
    sat = saturate(graph, rules=rules, limits=limits, progress=progress)
    ext = extract_graph(sat, extractor, model)
    before, after = graph_cost(graph, model), graph_cost(ext.graph, model)
    if verify:
        check_graphs_equivalent(graph, ext.graph, seed=seed)
    best = ext.graph if after <= before else graph
    stats = {
        "saturation_seconds": sat.seconds,
        "extraction_seconds": ext.seconds,
        "total_seconds": time.perf_counter() - t0,
        "stop_reason": sat.stop_reason,
        "iterations": len(sat.iterations),
        "enodes": sat.enodes,
        "eclasses": sat.iterations[-1].eclasses if sat.iterations else 0,
        "extractor": extractor,
        "extractor_status": ext.status,
        "ops_before": Counter(graph.op_counts()),
        "ops_after": Counter(best.op_counts()),
        "rules": len(sat.rules),
    }
    return OptimizeResult(best, graph, before, min(before, after), getattr(model, "name", "cost model"),
                          stats, sat)
