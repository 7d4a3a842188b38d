"""Pricing e-nodes: the operator configuration each e-node of a saturated e-graph runs
as if extracted (the cost model's key), shared by extraction (``api.extract_graph``)
and the profiler (which measures every configuration a saturation could need)."""

from __future__ import annotations

import math

from ..cost import CostModel, OpConfig
from ..errors import ShapeError, TasoEggError
from ..ops import OPS, TensorType
from .convert import TensorEGraph
from .saturate import Saturation

_FREE = ("proj", "tnil", "tcons")


class ENodeConfigs:
    """The operator configuration each e-node of a saturation runs as if extracted:
    the cost model's key for it (the profiler enumerates them with
    ``enode_configurations``)."""

    def __init__(self, saturation: Saturation):
        self.eg = saturation.tensor_egraph()
        self.weight_only = _weight_only_classes(self.eg)
        self.opaque = saturation.program.opaque
        self.constant_nodes = saturation.graph.weight_only_nodes()

    def __call__(self, n) -> OpConfig | None:
        """None when the e-node is free (plumbing, a leaf, or work on weights alone,
        folded at export); ShapeError when its inputs have no known shape."""
        if n.op in _FREE or OPS[n.op].is_leaf:
            return None
        if n.op == "opaque":
            node = self.opaque[n.params["key"]]
            return OpConfig.of(node.op, node.params, [t.type for t in node.inputs], node.outputs,
                               [t.node in self.constant_nodes for t in node.inputs])
        if n.children and all(c in self.weight_only for c in n.children):
            return None
        shapes = [self.eg.shapes.get(c) for c in n.children]
        if any(s is None for s in shapes):
            raise ShapeError(f"e-node {n.id} ({n.op}): an input has no known shape")
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
