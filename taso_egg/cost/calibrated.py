"""A cost model calibrated on one measured runtime profile of the input.

onnxruntime fuses operators and changes layouts, so a sum of per-operator costs prices
work it does not execute as such: an activation fused into a convolution costs it next
to nothing, a layer norm it runs as one kernel costs one kernel's time. Its per-node
profiler says what each of its kernels took; ``spread`` shares each kernel's time among
the input's nodes it computes (in proportion to their predicted costs), and
``CalibratedCost.fit`` turns that into scales, measured over predicted, per kind of
runtime kernel, and gives each operator the scale of the kernel that computes it
(overall for an operator the input lacks): a candidate's node costs its base cost times
its operator's scale. Finer scales are noise the extractor chases: per configuration it
swapped configurations one profile made look dear for unmeasured ones at the average
scale (predicted 1.04-1.05x, measured 0.98-0.99x on a ResNet-50 and a MobileNetV3).

The arithmetic only: ``taso_egg.product.calibrate`` takes the profile.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from .config import OpConfig
from .model import CostModel


def spread(kernels: Iterable[tuple[float, Sequence]], predicted: Mapping) -> tuple[dict, float]:
    """Each measured kernel's seconds shared among the nodes it computes, in proportion to
    their ``predicted`` costs (node -> seconds): ``kernels`` are (seconds, nodes, ...).
    Returns the measured seconds per node (every node of ``predicted``; 0 for one no
    kernel computes: fused away or folded) and the seconds no priced node took."""
    measured = dict.fromkeys(predicted, 0.0)
    unattributed = 0.0
    for seconds, nodes, *_ in kernels:
        priced = [n for n in nodes if predicted.get(n, 0.0) > 0.0]
        total = sum(predicted[n] for n in priced)
        if total <= 0.0:
            unattributed += seconds
            continue
        for n in priced:
            measured[n] += seconds * predicted[n] / total
    return measured, unattributed


class CalibratedCost:
    """``base``'s costs times measured-over-predicted scales per operator, each the
    scale of the runtime kernel that computes most of it (``fit``)."""

    def __init__(self, base: CostModel, by_op: dict[str, float], overall: float):
        self.base = base
        self.by_op, self.overall = by_op, overall
        self.name = (f"{getattr(base, 'name', 'cost model')}, calibrated per operator on one onnxruntime "
                     f"profile of the input ({len(by_op)} operators measured)")

    @staticmethod
    def fit(base: CostModel, nodes: Iterable[tuple[OpConfig, float, str]]) -> CalibratedCost:
        """Scales from the input's nodes as (configuration, measured seconds, the kind of
        runtime kernel that computed it) triples, each priced by ``base``: per kind, the
        measured seconds of its nodes over their predicted seconds; an operator takes
        the scale of the kind that computed most of its predicted cost (a conv and a conv
        with a residual both run as the runtime's Conv: one scale, not two noisy ones
        the extractor would trade against each other). Overall: every node's."""
        measured, predicted = defaultdict(float), defaultdict(float)
        op_kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for config, seconds, kind in nodes:
            cost = base.cost(config)
            if cost > 0.0:
                measured[kind] += seconds
                predicted[kind] += cost
                op_kinds[config.op][kind] += cost
        total = sum(predicted.values())
        overall = sum(measured.values()) / total if total > 0 else 1.0
        by_op = {op: measured[k] / predicted[k] for op, kinds in op_kinds.items()
                 for k in [max(sorted(kinds), key=kinds.get)]}
        return CalibratedCost(base, by_op, overall)

    def cost(self, config: OpConfig) -> float:
        return self.base.cost(config) * self.by_op.get(config.op, self.overall)

    def lookups(self) -> dict[str, int]:
        return self.base.lookups() if hasattr(self.base, "lookups") else {}

    def reset_counts(self) -> None:
        if hasattr(self.base, "reset_counts"):
            self.base.reset_counts()
