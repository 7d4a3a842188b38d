"""Pricing e-nodes: the operator configuration each e-node of a saturated e-graph runs
as if extracted (the cost model's key), shared by extraction (``api.extract_graph``)
and the profiler (which measures every configuration a saturation could need); and
what runs fused, so that extraction does not pay for it twice (``extract.egraph``'s
absorption): nested concats the graph builder flattens, a sigmoid onnxruntime fuses
into x * sigmoid(x); and the saturated e-graph priced, as the extractors take it
(``priced_egraph``)."""

from __future__ import annotations

import math

from ..cost import CostModel, OpConfig
from ..errors import ShapeError, TasoEggError
from ..extract import egraph as xeg
from ..ops import CONCAT, CONV2D, OPAQUE, OPS, TensorType
from .convert import weight_only_classes
from .saturate import Saturation

_FREE = ("proj", "tnil", "tcons")


class ENodeConfigs:
    """The operator configuration each e-node of a saturation runs as if extracted:
    the cost model's key for it (the profiler enumerates them with
    ``enode_configurations``)."""

    def __init__(self, saturation: Saturation):
        self.eg = saturation.tensor_egraph()
        self.weight_only = weight_only_classes(self.eg)
        self.opaque = saturation.program.opaque
        self.constant_nodes = saturation.graph.weight_only_nodes()

    def __call__(self, n) -> OpConfig | None:
        """None when the e-node is free (plumbing, a leaf, or work on weights alone,
        folded at export); ShapeError when its inputs have no known shape."""
        if n.op in _FREE or OPS[n.op].is_leaf:
            return None
        if n.op == OPAQUE.name:
            node = self.opaque[n.params["key"]]
            return OpConfig.of(node.op, node.params, [t.type for t in node.inputs], node.outputs,
                               [t.node in self.constant_nodes for t in node.inputs])
        if n.children and all(c in self.weight_only for c in n.children):
            return None
        shapes = [self.eg.shapes.get(c) for c in n.children]
        if any(s is None for s in shapes):
            raise ShapeError(f"e-node {n.id} ({n.op}): an input has no known shape")
        if n.op == CONV2D.name and len(shapes) == 3:
            # a fused conv (convert.add_fused_convs): its bias is the (o,) vector the
            # written conv takes, not the e-graph's (1, o, 1, 1) view of it
            shapes[2] = (shapes[1][0],)
        # dtypes as the e-graph's analysis has them: masks are bool, ids int64
        return OpConfig.of(n.op, n.params, [TensorType(tuple(s), self.eg.dtypes.get(c, "float32"))
                                            for s, c in zip(shapes, n.children)],
                           constant=[c in self.weight_only for c in n.children])


def enode_configurations(saturation: Saturation) -> list[OpConfig]:
    """Every distinct configuration any e-node could be extracted as."""
    configs = ENodeConfigs(saturation)
    seen: dict[str, OpConfig] = {}
    for nodes in configs.eg.classes.values():
        for n in nodes:
            try:
                config = configs(n)
            except TasoEggError:
                continue
            if config is not None:
                seen.setdefault(config.key, config)
    return list(seen.values())


def node_cost(n, configs: ENodeConfigs, model: CostModel) -> float:
    """What e-node ``n`` costs under ``model``: 0 when free, inf when it cannot be priced."""
    try:
        config = configs(n)
    except TasoEggError:
        return math.inf
    if config is None:
        return 0.0
    return model.cost(config)


# --- what the graph builder fuses, which extraction must not pay for -------------------

def nested_concats(node_class, children, concat_axis) -> dict[int, set[int]]:
    """Each concat e-node -> the concats on its axis that read its class. The e-graph's
    concat is binary; the graph builder flattens an inner concat that only concats on
    its axis read (``convert._flatten_concats``), so such an inner concat costs
    nothing (extract.egraph's absorption), and a chain costs one copy, as it runs."""
    readers: dict[tuple[int, int], set[int]] = {}
    for node, kids in enumerate(children):
        if concat_axis[node] is not None:
            for cls in kids:
                readers.setdefault((cls, concat_axis[node]), set()).add(node)
    return {node: readers[(node_class[node], axis)] for node, axis in enumerate(concat_axis)
            if axis is not None and (node_class[node], axis) in readers}


def fused_sigmoids(node_class, children, ops) -> dict[int, set[int]]:
    """Each sigmoid e-node -> the products x * sigmoid(x) that read its class, x its
    own input. onnxruntime runs such a pair as one kernel (QuickGelu, its fusion of
    SiLU), so the sigmoid costs nothing where those products are its only readers: an
    extraction then keeps SiLU's pair together (silu(g) * u, not sigmoid(g) * (g * u),
    one kernel more at the same price)."""
    products: dict[tuple[int, int], set[int]] = {}
    for node, op in enumerate(ops):
        if op == "ewmul" and len(children[node]) == 2:
            a, b = children[node]
            products.setdefault((a, b), set()).add(node)
            products.setdefault((b, a), set()).add(node)
    return {node: products[(children[node][0], node_class[node])] for node, op in enumerate(ops)
            if op == "sigmoid" and len(children[node]) == 1 and (children[node][0], node_class[node]) in products}


def priced_egraph(saturation: Saturation, model: CostModel, forbidden=frozenset()):
    """The saturated e-graph as the extractors take it (``extract.egraph.EGraph``), each
    e-node priced by ``model``; e-nodes that cannot run (no known input shape) and
    those ``forbidden`` (ids) are left out. Also the ``ENodeConfigs`` that priced them."""
    configs = ENodeConfigs(saturation)
    eg = configs.eg
    class_ids = list(eg.classes)
    index = {c: i for i, c in enumerate(class_ids)}
    node_ids, node_class, costs, children, ops, concat_axis = [], [], [], [], [], []
    for cid, nodes in eg.classes.items():
        for n in nodes:
            if n.id in forbidden:
                continue
            c = node_cost(n, configs, model)
            if not math.isfinite(c) or any(ch not in index for ch in n.children):
                continue
            node_ids.append(n.id)
            node_class.append(index[cid])
            costs.append(c)
            children.append(tuple(index[ch] for ch in n.children))
            ops.append(n.op)
            concat_axis.append(n.params["axis"] if n.op == CONCAT.name else None)
    roots = [index[r] for r in eg.roots]
    absorbers = nested_concats(node_class, children, concat_axis)
    absorbers.update(fused_sigmoids(node_class, children, ops))
    return xeg.EGraph(class_ids, node_ids, node_class, costs, children, roots, ops, "saturation",
                      absorbers=absorbers), configs
