"""A cost model calibrated on one measured runtime profile of the input.

onnxruntime fuses operators and changes layouts, so a sum of per-operator costs prices
work it does not execute as such: an activation fused into a convolution costs it next
to nothing, a layer norm it runs as one kernel costs one kernel's time. Its per-node
profiler says what each of its kernels took; ``spread`` shares each kernel's time among
the input's nodes it computes (in proportion to their predicted costs), and
``CalibratedCost.fit`` turns that into scales, measured over predicted, per operator
(overall for an operator the input lacks): a candidate's node costs its base cost times
its operator's scale. Per configuration instead, the extractor chased the noise: it
swapped measured configurations that one profile made look dear for unmeasured ones at
the average scale (predicted 1.04-1.05x, measured 0.98-0.99x on a ResNet-50 and a
MobileNetV3; per operator the errors were 1.0-1.3 %).

The arithmetic only: ``taso_egg.calibrate`` takes the profile.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from .config import OpConfig
from .model import CostModel


def spread(kernels: Iterable[tuple[float, Sequence]], predicted: Mapping) -> tuple[dict, float]:
    """Each measured kernel's seconds shared among the nodes it computes, in proportion to
    their ``predicted`` costs (node -> seconds): ``kernels`` are (seconds, nodes) pairs.
    Returns the measured seconds per node (every node of ``predicted``; 0 for one no
    kernel computes: fused away or folded) and the seconds no priced node took."""
    measured = dict.fromkeys(predicted, 0.0)
    unattributed = 0.0
    for seconds, nodes in kernels:
        priced = [n for n in nodes if predicted.get(n, 0.0) > 0.0]
        total = sum(predicted[n] for n in priced)
        if total <= 0.0:
            unattributed += seconds
            continue
        for n in priced:
            measured[n] += seconds * predicted[n] / total
    return measured, unattributed


class CalibratedCost:
    """``base``'s costs times measured-over-predicted scales per operator (``fit``)."""

    def __init__(self, base: CostModel, by_op: dict[str, float], overall: float, unattributed: float = 0.0):
        self.base = base
        self.by_op, self.overall = by_op, overall
        self.unattributed = unattributed  # measured seconds no priced node took (reported)
        self.name = (f"{getattr(base, 'name', 'cost model')}, calibrated per operator on one onnxruntime "
                     f"profile of the input ({len(by_op)} operators measured)")

    @staticmethod
    def fit(base: CostModel, nodes: Iterable[tuple[OpConfig, float]], unattributed: float = 0.0) -> CalibratedCost:
        """Scales from the input's nodes as (configuration, measured seconds) pairs, each
        priced by ``base``: the measured seconds of every node of an operator (of the
        whole input) over their predicted seconds."""
        measured, predicted = defaultdict(float), defaultdict(float)
        for config, seconds in nodes:
            cost = base.cost(config)
            if cost > 0.0:
                measured[config.op] += seconds
                predicted[config.op] += cost
        total = sum(predicted.values())
        overall = sum(measured.values()) / total if total > 0 else 1.0
        return CalibratedCost(base, {op: measured[op] / predicted[op] for op in predicted}, overall, unattributed)

    def cost(self, config: OpConfig) -> float:
        return self.base.cost(config) * self.by_op.get(config.op, self.overall)

    def lookups(self) -> dict[str, int]:
        return self.base.lookups() if hasattr(self.base, "lookups") else {}

    def reset_counts(self) -> None:
        if hasattr(self.base, "reset_counts"):
            self.base.reset_counts()
