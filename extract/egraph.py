"""A serialized e-graph, loaded into a compact index-based form.

The input is the egraph-serialize JSON that egglog writes: ``nodes`` maps a node id
to ``{op, children, eclass, cost}``, where a child names a *node* and stands for that
node's e-class, and ``root_eclasses`` lists the roots. Extractors work on integer
indices only; the string ids are kept to report results and errors.

Costs are finite numbers, zero and negative ones included, as the format and
extraction-gym allow, or +inf ("never extract this node"). The DAG cost of a choice
(one node for each class reachable from the roots through chosen nodes) is the sum of
the costs of those chosen nodes, each paid once however many nodes use its class.
With negative costs that sum is what every extractor minimizes and what check.py
computes; a node is paid for only if its class is in use, never for being picked.

What is guaranteed then: the ILP is exact for this objective (its model only lets a
class be chosen when a chosen node uses it, so unused negative nodes cannot lower
it); tree and greedy DAG are heuristics on shifted costs (see tree.py) and return a
valid choice, priced with the true costs.

A node may also be *absorbed* by some of its users (``absorbers``): then it is free
whenever its class is no root and every chosen node that uses its class is one of
them. That is how a nested concat costs what the one flat concat it becomes costs: an
inner concat read only by concats on its axis is never materialized (the graph
builder flattens it into them), so a chain of binary concats pays for one copy of
its output, not one per level. Lower bounds (bounds.py, shrink.py) take an absorbable
node at 0 (``low_cost``); the ILP prices it exactly (ilp_model.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path

import numpy as np

from ..errors import ExtractionError

# egraph-serialize gives a node without "cost" the cost 1.
_DEFAULT_COST = 1.0


class EGraph:
    """E-classes and e-nodes by index; children are class indices, costs a float array."""

    def __init__(
        self,
        class_ids: list[str],
        node_ids: list[str],
        node_class: list[int],
        node_cost: list[float],
        node_children: list[tuple[int, ...]],
        roots: list[int],
        ops: list[str],
        source: str = "<e-graph>",
        absorbers: Mapping[int, Iterable[int]] | None = None,
    ):
        self.class_ids = tuple(class_ids)
        self.node_ids = tuple(node_ids)
        self.node_class = np.asarray(node_class, dtype=np.int64)
        self.node_cost = np.asarray(node_cost, dtype=np.float64)
        # Child classes in argument order, duplicates kept (a tree pays for each use).
        self.node_children = tuple(node_children)
        self.roots = tuple(roots)
        self.ops = tuple(ops)
        self.source = source
        # node -> the user nodes that absorb it (see the module docstring), for the
        # absorbable nodes that cost something (nothing else has a cost to waive)
        self.absorbers = {int(n): frozenset(users) for n, users in (absorbers or {}).items()
                          if users and self.node_cost[int(n)] > 0}
        members: list[list[int]] = [[] for _ in class_ids]
        for node, cls in enumerate(node_class):
            members[cls].append(node)
        self.class_nodes = tuple(tuple(m) for m in members)

    @property
    def n_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def n_classes(self) -> int:
        return len(self.class_ids)

    @cached_property
    def low_cost(self) -> np.ndarray:
        """The least each node can cost in a choice: its cost, 0 where absorbable."""
        low = self.node_cost.copy()
        low[list(self.absorbers)] = 0.0
        return low

    @cached_property
    def class_index(self) -> dict[str, int]:
        return {cid: i for i, cid in enumerate(self.class_ids)}

    @cached_property
    def node_index(self) -> dict[str, int]:
        return {nid: i for i, nid in enumerate(self.node_ids)}

    @cached_property
    def child_sets(self) -> tuple[tuple[int, ...], ...]:
        """Distinct child classes of each node: what a DAG needs, each paid once."""
        return tuple(tuple(sorted(set(ch))) for ch in self.node_children)

    @cached_property
    def parents(self) -> tuple[tuple[int, ...], ...]:
        """For each class, the nodes that have it as a child (each node listed once)."""
        users: list[list[int]] = [[] for _ in self.class_ids]
        for node, children in enumerate(self.child_sets):
            for cls in children:
                users[cls].append(node)
        return tuple(tuple(u) for u in users)

    def resolve_roots(self, roots: Iterable[str] | None) -> tuple[int, ...]:
        """Class indices for root class ids; ``None`` means the file's own roots."""
        if roots is None:
            if not self.roots:
                raise ExtractionError(f"{self.source}: no root e-classes given")
            return self.roots
        out = []
        for cid in roots:
            if cid not in self.class_index:
                raise ExtractionError(f"{self.source}: root e-class {cid!r} is not in the e-graph")
            out.append(self.class_index[cid])
        if not out:
            raise ExtractionError(f"{self.source}: no root e-classes given")
        return tuple(out)

    def named_choice(self, choice: Mapping[int, int]) -> dict[str, str]:
        """The choice with string ids, as egraph-serialize / extraction-gym write it."""
        return {self.class_ids[c]: self.node_ids[n] for c, n in sorted(choice.items())}


def load_egraph(source: str | Path | Mapping) -> EGraph:
    """Load an egraph-serialize JSON file (path) or an already parsed dict."""
    if isinstance(source, Mapping):
        return _from_dict(source, "<e-graph>")
    path = Path(source)
    try:
        with path.open() as f:
            data = json.load(f)
    except OSError as e:
        raise ExtractionError(f"{path}: cannot read e-graph file ({e.strerror})") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ExtractionError(f"{path}: not valid JSON ({e})") from e
    return _from_dict(data, str(path))


def _from_dict(data: Mapping, src: str) -> EGraph:
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), Mapping):
        raise ExtractionError(f"{src}: expected a JSON object with a 'nodes' object")
    raw = data["nodes"]
    node_ids = list(raw)
    node_pos = {nid: i for i, nid in enumerate(node_ids)}
    class_pos: dict[str, int] = {}
    node_class, node_cost, ops = [], [], []
    for nid in node_ids:
        node = raw[nid]
        if not isinstance(node, Mapping):
            raise ExtractionError(f"{src}: node {nid!r} is not an object")
        eclass = node.get("eclass")
        if not isinstance(eclass, str):
            raise ExtractionError(f"{src}: node {nid!r} has no string 'eclass'")
        node_class.append(class_pos.setdefault(eclass, len(class_pos)))
        node_cost.append(_cost(node.get("cost", _DEFAULT_COST), nid, src))
        ops.append(str(node.get("op", "")))
    node_children = []
    for nid in node_ids:
        children = raw[nid].get("children", [])
        if not isinstance(children, list):
            raise ExtractionError(f"{src}: node {nid!r} has non-list 'children'")
        classes = []
        for child in children:
            if child not in node_pos:
                raise ExtractionError(f"{src}: node {nid!r} has child {child!r}, which is not a node")
            classes.append(node_class[node_pos[child]])
        node_children.append(tuple(classes))
    class_ids = list(class_pos)
    roots = data.get("root_eclasses", [])
    if not isinstance(roots, list):
        raise ExtractionError(f"{src}: 'root_eclasses' must be a list")
    roots = [_canonical_root(root, raw, class_pos, src) for root in roots]
    return EGraph(
        class_ids, node_ids, node_class, node_cost, node_children,
        [class_pos[r] for r in roots], ops, src,
    )


def _canonical_root(root, raw: Mapping, class_pos: Mapping, src: str) -> str:
    """``root`` when it is an e-class of the file; else the e-class it was merged into,
    where the file says so: egg's serializer names a node ``CLASS.INDEX`` after the
    class it was added to, and some writers (extraction-gym's lean-egg e-graphs) list
    that id as the root, not its canonical class, which the nodes' ``eclass`` gives."""
    if root in class_pos:
        return root
    merged = {raw[nid]["eclass"] for nid in raw if isinstance(nid, str) and nid.startswith(f"{root}.")}
    if len(merged) == 1:
        return merged.pop()
    raise ExtractionError(f"{src}: root e-class {root!r} has no nodes"
                          + (f" (its nodes {root}.* are in several classes: {sorted(merged)})" if merged else ""))


def _cost(value, nid: str, src: str) -> float:
    # +inf is allowed and means "never extract this node"; negative and zero costs are
    # allowed (see the module docstring); NaN and -inf are not, having no sum.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExtractionError(f"{src}: node {nid!r} has non-numeric cost {value!r}")
    cost = float(value)
    if math.isnan(cost) or cost == -math.inf:
        raise ExtractionError(f"{src}: node {nid!r} has invalid cost {value!r} (must be a number or +inf)")
    return cost
