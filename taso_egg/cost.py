"""The cost model interface, and the analytic model used until profiles are measured.

``cost(op, params, input_types, output_types) -> seconds``. Ops that only re-view
memory (reshape, transpose, split) cost nothing, as in TASO; so do leaves. Weight-only
operators are folded at export, which callers account for (see ``graph_cost``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from .graph import Graph
from .ops import OPS, TensorType


class CostModel(Protocol):
    name: str

    def cost(self, op: str, params: dict, inputs: Sequence[TensorType],
             outputs: Sequence[TensorType]) -> float: ...


@dataclass(frozen=True)
class AnalyticCost:
    """max(FLOPs / peak, bytes / bandwidth) + a fixed per-kernel overhead.

    ANALYTIC, NOT MEASURED: the constants are round figures for a 2-core CPU, not
    readings of this machine. They rank alternatives; they do not predict seconds.
    """

    name: str = "analytic (uncalibrated CPU constants)"
    peak_flops: float = 50e9
    bandwidth: float = 10e9
    overhead: float = 5e-6

    def cost(self, op, params, inputs, outputs) -> float:
        spec = OPS[op]
        if spec.is_leaf or spec.is_view:
            return 0.0
        flops = spec.flops(params, inputs, outputs) if spec.flops else 0.0
        nbytes = sum(t.size for t in inputs) * 4 + sum(t.size for t in outputs) * 4
        return max(flops / self.peak_flops, nbytes / self.bandwidth) + self.overhead


def graph_cost(graph: Graph, model: CostModel) -> float:
    """Sum of operator costs, weight-only work excluded."""
    folded = graph.weight_only_nodes()
    return sum(model.cost(n.op, n.params, [t.type for t in n.inputs], n.outputs)
               for n in graph.nodes.values() if n.id not in folded)
