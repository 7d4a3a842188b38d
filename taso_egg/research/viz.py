"""Pictures for the notebooks: a graph, an e-graph (classes as boxes around their
e-nodes, the extracted choice highlighted) and saturation growth, drawn with
matplotlib alone (no Graphviz binary needed on a fresh machine).

Layout is layered: a node sits one layer below its deepest input; within a layer,
nodes are ordered by the mean position of their inputs (one barycentre sweep),
which keeps small drawings readable without a layout engine.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping, Sequence

from ..graph import Graph
from ..ops import OPS
from ..ops.base import elementwise_flops

def _colour(op: str) -> str:
    """A node's fill, by what the operator table says it is: inputs, weights and
    constants, activations, layout (views, concats, tuple projections), element-wise
    work, and heavy compute."""
    spec = OPS.get(op)
    if spec is None:  # proj, tnil, tcons: e-graph plumbing
        return "#fff3b0"
    if spec.is_leaf:
        return "#e6e6e6" if spec.is_constant else "#cfe8ff"
    if spec.activation:
        return "#f6d0f0"
    if spec.is_view or spec.multi_output or spec.egraph_inputs:
        return "#fff3b0"
    if spec.flops is elementwise_flops:
        return "#d8f0c8"
    return "#ffd9a8"


def _layers(ids: Sequence, preds: Mapping) -> dict:
    """Layer of each id: 0 for sources, else 1 + the deepest predecessor. Ids on a
    cycle (possible in an e-graph) are placed by the part of the cycle seen first."""
    layer: dict = {}
    visiting: set = set()

    def visit(root):
        stack = [(root, iter(preds.get(root, ())))]
        visiting.add(root)
        while stack:
            node, it = stack[-1]
            nxt = next((p for p in it if p not in layer and p not in visiting), None)
            if nxt is not None:
                visiting.add(nxt)
                stack.append((nxt, iter(preds.get(nxt, ()))))
                continue
            stack.pop()
            visiting.discard(node)
            layer[node] = 1 + max((layer[p] for p in preds.get(node, ()) if p in layer), default=-1)

    for i in ids:
        if i not in layer:
            visit(i)
    return layer


def _positions(ids: Sequence, preds: Mapping) -> dict:
    layer = _layers(ids, preds)
    rows: dict[int, list] = defaultdict(list)
    for i in ids:
        rows[layer[i]].append(i)
    x: dict = {}
    for depth in sorted(rows):
        row = rows[depth]
        if depth:  # barycentre of the inputs already placed
            row.sort(key=lambda i: sum(x[p] for p in preds.get(i, ()) if p in x) /
                     max(1, sum(1 for p in preds.get(i, ()) if p in x)))
        width = len(row)
        for k, i in enumerate(row):
            x[i] = k - (width - 1) / 2
    return {i: (x[i], -layer[i]) for i in ids}


def _new_axes(ax, n_layers: int, width: int):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 1.4 * width), max(3.0, 0.9 * n_layers)))
    ax.set_axis_off()
    return ax


def _label(op: str, params: Mapping) -> str:
    bits = [op]
    if params.get("activation", "NONE") not in ("NONE", None):
        bits.append(str(params["activation"]).lower())
    if op in OPS and OPS[op].is_leaf and params.get("name"):
        bits = [str(params["name"])]
    return "\n".join(bits)


def draw_graph(graph: Graph, ax=None, hide_weights: bool = True, title: str | None = None):
    """Draw ``graph`` top to bottom (inputs first). Weight leaves and weight-only
    operators are left out by default: they fold away at export."""
    skip = graph.weight_only_nodes() if hide_weights else set()
    nodes = [n for n in graph.topo_order() if n.id not in skip]
    preds = {n.id: [t.node for t in n.inputs if t.node not in skip] for n in nodes}
    pos = _positions([n.id for n in nodes], preds)
    width = max((sum(1 for p in pos.values() if p[1] == y) for y in {p[1] for p in pos.values()}), default=1)
    ax = _new_axes(ax, len({p[1] for p in pos.values()}), width)
    for n in nodes:
        for p in preds[n.id]:
            ax.annotate("", xy=pos[n.id], xytext=pos[p],
                        arrowprops=dict(arrowstyle="->", color="#777777", lw=0.8,
                                        shrinkA=9, shrinkB=9))
    for n in nodes:
        x, y = pos[n.id]
        ax.text(x, y, _label(n.op, n.params), ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="round,pad=0.3", fc=_colour(n.op), ec="#444444"))
    _fit(ax, pos.values(), title or f"{len(nodes)} operators")
    return ax


def draw_egraph(egraph, ax=None, chosen: Iterable[str] = (), title: str | None = None,
                max_nodes: int = 120):
    """Draw a :class:`~taso_egg.egraph.convert.TensorEGraph`: each e-class is a
    dashed box around its e-nodes, each e-node points at the classes of its
    children; the e-nodes in ``chosen`` (ids, e.g. an extraction's picks) are drawn
    bold. Refuses e-graphs above ``max_nodes`` e-nodes (they would be unreadable)."""
    from matplotlib.patches import FancyBboxPatch

    from ..errors import TasoEggError

    if egraph.num_nodes > max_nodes:
        raise TasoEggError(f"e-graph has {egraph.num_nodes} e-nodes; drawing is limited to "
                           f"{max_nodes} (pass max_nodes= to override)")
    chosen = set(chosen)
    classes = list(egraph.classes)
    # classes by layer, children above parents (inputs at the top, as in draw_graph)
    preds = {c: sorted({ch for n in egraph.classes[c] for ch in n.children if ch in egraph.classes})
             for c in classes}
    centre = _positions(classes, preds)
    # Each layer's classes side by side in barycentre order, as wide as their members.
    pos = {}
    for y in {p[1] for p in centre.values()}:
        row = sorted((c for c in classes if centre[c][1] == y), key=lambda c: centre[c][0])
        widths = [len(egraph.classes[c]) * 0.9 + 0.5 for c in row]
        cursor = -sum(widths) / 2
        for c, w in zip(row, widths):
            for k, n in enumerate(egraph.classes[c]):
                pos[n.id] = (cursor + 0.7 + k * 0.9, y * 1.4)
            cursor += w
    ax = _new_axes(ax, len({p[1] for p in centre.values()}), max(
        sum(len(egraph.classes[c]) for c in classes if centre[c][1] == y) for y in {p[1] for p in centre.values()}))
    for c in classes:
        xs = [pos[n.id][0] for n in egraph.classes[c]]
        y = pos[egraph.classes[c][0].id][1]
        ax.add_patch(FancyBboxPatch((min(xs) - 0.42, y - 0.32), max(xs) - min(xs) + 0.84, 0.64,
                                    boxstyle="round,pad=0.02", fill=False, ls="--", ec="#999999"))
    class_anchor = {c: (sum(pos[n.id][0] for n in egraph.classes[c]) / len(egraph.classes[c]),
                        pos[egraph.classes[c][0].id][1]) for c in classes}
    for c in classes:
        for n in egraph.classes[c]:
            for ch in n.children:
                if ch in class_anchor:
                    ax.annotate("", xy=pos[n.id], xytext=class_anchor[ch],
                                arrowprops=dict(arrowstyle="->", lw=1.4 if n.id in chosen else 0.6,
                                                color="#c0392b" if n.id in chosen else "#aaaaaa",
                                                shrinkA=10, shrinkB=9))
    for c in classes:
        for n in egraph.classes[c]:
            x, y = pos[n.id]
            ax.text(x, y, _label(n.op, n.params), ha="center", va="center", fontsize=6.5,
                    fontweight="bold" if n.id in chosen else "normal",
                    bbox=dict(boxstyle="round,pad=0.25", fc=_colour(n.op),
                              ec="#c0392b" if n.id in chosen else "#555555",
                              lw=1.6 if n.id in chosen else 0.8))
    _fit(ax, pos.values(), title or f"{egraph.num_nodes} e-nodes in {len(classes)} e-classes")
    return ax


def plot_growth(runs: Mapping[str, object], axes=None):
    """E-nodes, e-classes and rule matches per iteration, one line per saturation
    in ``runs`` (name -> :class:`~taso_egg.egraph.saturate.Saturation`)."""
    import matplotlib.pyplot as plt

    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for name, sat in runs.items():
        steps = ([sat.initial] if sat.initial else []) + list(sat.iterations)
        its = [s.iteration for s in steps]
        axes[0].plot(its, [s.enodes for s in steps], marker="o", label=name)
        axes[1].plot(its, [s.eclasses for s in steps], marker="o", label=name)
        axes[2].plot(its[-len(sat.iterations):], [sum(s.matches.values()) for s in sat.iterations],
                     marker="o", label=name)
    for ax, what in zip(axes, ("e-nodes", "e-classes", "rule matches")):
        ax.set_xlabel("iteration")
        ax.set_ylabel(what)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return axes


def _fit(ax, points, title: str) -> None:
    pts = list(points)
    if pts:
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.set_xlim(min(xs) - 1, max(xs) + 1)
        ax.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    ax.set_title(title, fontsize=9)
