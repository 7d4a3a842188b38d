"""The DAG-extraction integer program over a subset of e-nodes, built for HiGHS.

Columns: one binary x per node, paid by its cost (so a shared node is paid once), then
one continuous y in [0, 1] per absorbable node (egraph.py), which carries that node's
cost instead of its x, then one continuous order variable t per class that lies on a
cycle of the model's class graph. Rows:
- each root class, and each class every extraction uses (``required``, from
  bounds.Necessity; valid for every acyclic choice, and what lifts the LP bound on
  resnet50 from 1 % of the optimum to 99.8 %): sum of its nodes = 1;
- each class: sum of its nodes <= 1 (a choice takes one node; tightens the relaxation);
- each node n and child class d: sum of d's nodes >= x_n;
- each node n of class c with a child class d in the same strongly connected component
  (size M): t_c - t_d >= 1 - M (1 - x_n), so chosen edges strictly descend in t.
  Edges between components can never close a cycle and get no order row.
- each absorbable node m of class c and each node p of the model that uses c but does
  not absorb m: y_m >= x_m + x_p - 1; and y_m >= x_m where c is a root. So m is paid
  exactly when it is chosen and some chosen user does not absorb it (the objective
  equals check.check_choice's cost on the used nodes);
- only where some node of the model costs less than zero: each non-root class c:
  sum of c's nodes <= sum of the nodes that have c as a child (a class is chosen only
  if a chosen node uses it). With the order rows no chosen set of classes can hold
  itself up in a cycle, so every chosen node is reachable from the roots and the
  objective is exactly the DAG cost; without negative costs an unused chosen node
  can only cost more, and the rows are left out.
"""

from __future__ import annotations

from collections import Counter

import highspy
import numpy as np

from .choice_check import absorbed_classes, used_classes
from .cycles import strongly_connected
from .egraph import EGraph
from .result import OPTIMAL_GAP


class IlpModel:
    def __init__(
        self, egraph: EGraph, nodes: list[int], roots: tuple[int, ...], required: frozenset[int] = frozenset()
    ):
        self.egraph = egraph
        self.roots = roots
        self.nodes = nodes
        self.build_seconds = 0.0  # the last build's: no solve starts with less time left
        classes = sorted({int(egraph.node_class[n]) for n in nodes})
        self.class_pos = {c: i for i, c in enumerate(classes)}
        # Roots first, then the other required classes that this model holds.
        self.used = list(dict.fromkeys([*roots, *sorted(c for c in required if c in self.class_pos)]))
        self.col_class = [self.class_pos[int(egraph.node_class[n])] for n in nodes]
        self.col_children = [[self.class_pos[d] for d in egraph.child_sets[n]] for n in nodes]
        self.members: list[list[int]] = [[] for _ in classes]
        for col, cls in enumerate(self.col_class):
            self.members[cls].append(col)
        succ: list[set[int]] = [set() for _ in classes]
        for col, cls in enumerate(self.col_class):
            succ[cls].update(self.col_children[col])
        self.component = strongly_connected(len(classes), succ)
        self.component_size = Counter(self.component)
        self.users: list[list[int]] = [[] for _ in classes]
        for col, children in enumerate(self.col_children):
            for child in children:
                self.users[child].append(col)
        # absorbable columns -> their y column
        self.absorb_col = {col: len(nodes) + i for i, col in enumerate(
            col for col, n in enumerate(nodes) if n in egraph.absorbers)}
        first_order = len(nodes) + len(self.absorb_col)
        cyclic = [c for c in range(len(classes)) if self.component_size[self.component[c]] > 1]
        self.order_col = {c: first_order + i for i, c in enumerate(cyclic)}
        self.negative = bool((egraph.node_cost[nodes] < 0).any()) if nodes else False

    @property
    def n_cols(self) -> int:
        return len(self.nodes) + len(self.absorb_col) + len(self.order_col)

    def _cols(self, order: bool) -> int:
        return self.n_cols if order else len(self.nodes) + len(self.absorb_col)

    def build(self, integer: bool, order: bool, verbose: bool = False, gap: float = OPTIMAL_GAP) -> highspy.Highs:
        """A HiGHS instance holding the model (the LP relaxation if not ``integer``;
        without order rows if not ``order``, which then allows cycles). HiGHS stops
        once its relative gap is at most ``gap``."""
        h = _quiet_highs() if not verbose else highspy.Highs()
        h.setOptionValue("output_flag", verbose)
        h.setOptionValue("threads", 1)
        h.setOptionValue("mip_rel_gap", max(gap, OPTIMAL_GAP))
        # Relative gaps only: the default absolute gap (1e-6) is 3 % of a 0.035 ms model.
        h.setOptionValue("mip_abs_gap", 0.0)
        nx = len(self.nodes)
        n_cols = self._cols(order)
        upper = np.ones(n_cols)
        if order:
            for cls, col in self.order_col.items():
                upper[col] = self.component_size[self.component[cls]] - 1
        h.addVars(n_cols, np.zeros(n_cols), upper)
        cost = np.zeros(n_cols)
        cost[:nx] = self.egraph.node_cost[self.nodes]
        for col, y in self.absorb_col.items():
            cost[y], cost[col] = cost[col], 0.0
        idx = np.arange(n_cols, dtype=np.int32)
        h.changeColsCost(n_cols, idx, cost)
        idx = np.arange(nx, dtype=np.int32)
        if integer:
            h.changeColsIntegrality(nx, idx, np.full(nx, highspy.HighsVarType.kInteger))
        _add_rows(h, self._rows(order))
        return h

    def _rows(self, order: bool):
        inf = highspy.kHighsInf
        used = [self.class_pos[c] for c in self.used]
        for cls in used:
            yield 1.0, 1.0, self.members[cls], 1.0
        used = set(used)
        for cls, m in enumerate(self.members):
            if len(m) > 1 and cls not in used:
                yield -inf, 1.0, m, 1.0
        for col, cls in enumerate(self.col_class):
            for child in self.col_children[col]:
                yield 0.0, inf, self.members[child] + [col], [1.0] * len(self.members[child]) + [-1.0]
                if order and self.component[child] == self.component[cls] and cls in self.order_col:
                    big = float(self.component_size[self.component[cls]])
                    yield 1.0 - big, inf, [self.order_col[cls], self.order_col[child], col], [1.0, -1.0, -big]
        roots = {self.class_pos[r] for r in self.roots}
        for col, y in self.absorb_col.items():
            cls = self.col_class[col]
            absorbers = self.egraph.absorbers[self.nodes[col]]
            if cls in roots:
                yield 0.0, inf, [y, col], [1.0, -1.0]
            for user in self.users[cls]:
                if self.nodes[user] not in absorbers:
                    yield -1.0, inf, [y, col, user], [1.0, -1.0, -1.0]
        if self.negative:
            for cls, m in enumerate(self.members):
                if cls not in roots:
                    yield -inf, 0.0, m + self.users[cls], [1.0] * len(m) + [-1.0] * len(self.users[cls])

    def start(self, choice: dict[int, int], order: bool) -> highspy.HighsSolution:
        """Column values of a valid choice whose nodes are all in the model."""
        values = np.zeros(self._cols(order))
        col_of = {n: i for i, n in enumerate(self.nodes)}
        for node in choice.values():
            values[col_of[node]] = 1.0
        if self.absorb_col:
            classes = used_classes(self.egraph, choice, self.roots)
            waived = absorbed_classes(self.egraph, choice, classes, self.roots)
            for cls in classes:
                y = self.absorb_col.get(col_of[choice[cls]])
                if y is not None and cls not in waived:
                    values[y] = 1.0
        if order:
            # Height within the component: children first, so each edge descends by >= 1.
            for cls0 in used_classes(self.egraph, choice, self.roots):
                cls = self.class_pos[cls0]
                if cls in self.order_col:
                    same = [
                        values[self.order_col[d]] + 1
                        for d in (self.class_pos[c] for c in self.egraph.child_sets[choice[cls0]])
                        if self.component[d] == self.component[cls]
                    ]
                    values[self.order_col[cls]] = max(same, default=0.0)
        sol = highspy.HighsSolution()
        sol.col_value = values.tolist()
        sol.value_valid = True
        return sol

    def choice(self, col_value) -> dict[int, int]:
        """The chosen nodes (x > 0.5) as class -> node, in e-graph indices."""
        x = np.asarray(col_value[: len(self.nodes)])
        return {int(self.egraph.node_class[self.nodes[j]]): self.nodes[j] for j in np.flatnonzero(x > 0.5)}


def _add_rows(h: highspy.Highs, rows) -> None:
    lower, upper, starts, index, value = [], [], [], [], []
    for lo, hi, cols, vals in rows:
        lower.append(lo)
        upper.append(hi)
        starts.append(len(index))
        index.extend(cols)
        value.extend([vals] * len(cols) if isinstance(vals, float) else vals)
    h.addRows(
        len(lower), np.array(lower), np.array(upper), len(index),
        np.array(starts, dtype=np.int32), np.array(index, dtype=np.int32), np.array(value),
    )


def _quiet_highs() -> highspy.Highs:
    """HiGHS prints its banner on the C-level stdout when constructed, before any
    option can silence it: point file descriptor 1 at /dev/null for that moment."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
