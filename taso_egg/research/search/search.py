"""TASO's cost-based backtracking search over the graph IR, with the rules and the
cost model equality saturation uses, so the two can be compared side by side.

A priority queue of graphs ordered by cost and a set of the structure hashes already
seen. Pop the cheapest; apply every rule at every match; queue a rewritten graph if its
cost is below ``alpha`` times the best cost popped so far, it has no cycle and its hash
is new. Stop after ``budget`` pops, on an empty queue or at the time limit.

The queue holds recipes (parent graph, match), not graphs: a graph is rebuilt when it
is popped, so memory grows with the number of pops, not with the candidates. A
candidate's cost is the parent's plus the cost of the nodes the rewrite added minus
that of the nodes it removed (weight-only work is free); only a rewrite that turns a
replaced tensor weight-only, or the reverse, is costed from scratch.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

from taso_egg.cost import CostModel, graph_cost, load_cost_model, node_config
from taso_egg.options import DEFAULT_PROFILE, SearchOptions
from taso_egg.errors import LimitError
from taso_egg.graph import Graph, Node, node_digest, node_local_bytes, outputs_digest

from .matcher import GraphIndex, Match, RuleMatcher, compile_rules
from .rewrite import Rejected, apply_match

REJECT_REASONS = ("shape", "cycle", "cost", "duplicate")


@dataclass
class StepStats:
    """One pop: the popped graph's cost, the best cost so far, the queue size after
    expanding it, and what became of the candidates it generated."""

    step: int
    cost: float
    best_cost: float
    queue_size: int
    generated: int
    queued: int
    rejected: dict[str, int]
    seconds: float


@dataclass
class SearchResult:
    graph: Graph
    original: Graph
    cost_before: float
    cost_after: float
    graphs_explored: int  # popped
    graphs_generated: int  # rewrites attempted (one per match)
    graphs_queued: int
    seconds: float
    stop_reason: str  # "budget (N)", "queue empty" or "time limit (S s)"
    cost_model: str
    steps: list[StepStats] = field(default_factory=list)
    # worst relative error of the numeric check; None when the input came back unchanged
    check_error: float | None = None

    @property
    def speedup(self) -> float:
        return self.cost_before / self.cost_after if self.cost_after > 0 else float("inf")

    @property
    def rejected(self) -> dict[str, int]:
        total = dict.fromkeys(REJECT_REASONS, 0)
        for s in self.steps:
            for k, v in s.rejected.items():
                total[k] += v
        return total


class _State:
    """A popped graph with its index, exact cost, per-node costs and per-node digests
    of its structural hash."""

    def __init__(self, graph: Graph, search: _Search):
        self.graph = graph
        self.index = GraphIndex(graph)
        wo = self.index.weight_only
        self.node_cost = {nid: search.node_cost(n, [t.node in wo for t in n.inputs])
                          for nid, n in graph.nodes.items() if nid not in wo}
        self.cost = sum(self.node_cost.values())
        self.digest: dict[int, bytes] = {}
        for n in self.index.order:
            self.digest[n.id] = node_digest(search.local_bytes(n), n.inputs, self.digest.__getitem__)


class _Search:
    def __init__(self, model: CostModel, matchers: list[RuleMatcher]):
        self.model = model
        self.matchers = matchers
        # Node objects are shared between popped graphs: cache what depends on one alone
        # (and, for costs, on which inputs are known before run time). Candidates' new
        # nodes are not cached: most are never popped, and the cache would grow with them.
        self._costs: dict[tuple[Node, tuple[bool, ...]], float] = {}
        self._local: dict[Node, bytes] = {}

    def node_cost(self, n: Node, constant) -> float:
        key = (n, tuple(constant))
        c = self._costs.get(key)
        if c is None:
            c = self.model.cost(node_config(n, key[1]))
            self._costs[key] = c
        return c

    # Structural hashes as Graph.structural_hash computes them (the same functions),
    # but only for the nodes a rewrite added and those downstream of it.

    def local_bytes(self, n: Node) -> bytes:
        b = self._local.get(n)
        if b is None:
            b = self._local[n] = node_local_bytes(n)
        return b

    def candidate_hash(self, state: _State, rw) -> str:
        graph, digest, rank = rw.graph, state.digest, state.index.rank
        new: dict[int, bytes] = {}

        def digest_of(nid: int) -> bytes:
            return new.get(nid) or digest[nid]

        for nid in rw.added:  # ids grow in creation order, which is topological
            n = graph.nodes[nid]
            new[nid] = node_digest(node_local_bytes(n), n.inputs, digest_of)
        # Nodes downstream of a redirected one: scan the parent's order from the first.
        if rw.redirected:
            redirected = set(rw.redirected)
            for n in state.index.order[min(rank[r] for r in redirected):]:
                nid = n.id
                current = graph.nodes.get(nid)
                if current is None or (nid not in redirected
                                       and not any(t.node in new for t in current.inputs)):
                    continue
                new[nid] = node_digest(self.local_bytes(n), current.inputs, digest_of)
        return outputs_digest(graph.outputs, digest_of)

    def candidate_cost(self, state: _State, rw) -> float:
        if rw.weight_status_changed:
            return graph_cost(rw.graph, self.model)
        cost = state.cost
        for n in rw.removed:
            cost -= state.node_cost.get(n.id, 0.0)
        wo, first_new = state.index.weight_only, state.graph.next_id
        for nid in rw.added:
            if nid not in rw.added_weight_only:
                n = rw.graph.nodes[nid]
                constant = [t.node in rw.added_weight_only if t.node >= first_new else t.node in wo
                            for t in n.inputs]
                cost += self.model.cost(node_config(n, constant))
        return cost


def backtracking_search(graph: Graph, rules=None, cost_model: CostModel | None = None,
                        budget: int = SearchOptions.budget, alpha: float = SearchOptions.alpha,
                        time_limit: float | None = None,
                        progress=None, verify: bool = True, seed: int = 0,
                        profile: str = DEFAULT_PROFILE) -> SearchResult:
    """TASO's backtracking search: ``budget`` graphs popped, ``alpha`` the relaxation
    (TASO's 1000 and 1.05 by default, ``SearchOptions``). ``rules``: parsed Rule objects (default: the
    corpus, as saturation uses); costs from ``cost_model`` when given, else from
    ``profile``, with the same default as ``taso_egg.product.optimize_graph.optimize``. ``progress`` is
    called with each StepStats. The best graph is checked numerically against
    ``graph`` (``verify``) before it is returned."""
    from taso_egg.check.whole_graph import check_graphs_equivalent
    from taso_egg.rules.corpus import load_corpus

    SearchOptions(budget, alpha)  # a one-line error when either is out of range
    if time_limit is not None and not time_limit > 0:
        raise LimitError(f"time_limit must be positive seconds, got {time_limit!r}")
    model = cost_model or load_cost_model(profile)
    graph.validate()
    start = time.perf_counter()
    search = _Search(model, compile_rules(load_corpus() if rules is None else rules))

    root = graph.copy()
    if not graph.has_named_outputs:  # outputs are the sinks: name them, so rewrites keep them
        for name, t in graph.outputs:
            root.mark_output(t, name)
    seen = {root.structural_hash()}
    best = _State(root, search)
    cost_before = best.cost
    counter = itertools.count()
    queue: list[tuple[float, int, _State | None, Match | None]] = [(best.cost, next(counter), None, None)]
    steps: list[StepStats] = []
    generated = queued = 0
    stop = "queue empty"
    while queue:
        if len(steps) >= budget:
            stop = f"budget ({budget})"
            break
        if time_limit is not None and time.perf_counter() - start >= time_limit:
            stop = f"time limit ({time_limit:g} s)"
            break
        _, _, parent, match = heapq.heappop(queue)
        state = best if parent is None else _State(apply_match(parent.index, match).graph, search)
        if state.cost < best.cost:
            best = state
        threshold = alpha * best.cost
        rejected = dict.fromkeys(REJECT_REASONS, 0)
        step_generated = step_queued = 0
        for matcher in search.matchers:
            for m in matcher.matches(state.index):
                step_generated += 1
                try:
                    rw = apply_match(state.index, m, matcher.rhs_tensor_vars)
                except Rejected as r:
                    rejected[r.reason] += 1
                    continue
                cost = search.candidate_cost(state, rw)
                if not cost < threshold:
                    rejected["cost"] += 1
                    continue
                h = search.candidate_hash(state, rw)
                if h in seen:
                    rejected["duplicate"] += 1
                    continue
                seen.add(h)
                heapq.heappush(queue, (cost, next(counter), state, m))
                step_queued += 1
        generated += step_generated
        queued += step_queued
        stats = StepStats(len(steps) + 1, state.cost, best.cost, len(queue), step_generated,
                          step_queued, rejected, time.perf_counter() - start)
        steps.append(stats)
        if progress is not None:
            progress(stats)
    check_error = None
    if verify and best.graph is not root:
        check_error = check_graphs_equivalent(graph, best.graph, seed=seed,
                                              what="backtracking search result")
    return SearchResult(best.graph, graph, cost_before, best.cost, len(steps), generated, queued,
                        time.perf_counter() - start, stop, getattr(model, "name", "cost model"),
                        steps, check_error)


__all__ = ["REJECT_REASONS", "SearchResult", "StepStats", "backtracking_search"]
