"""A cost model calibrated on one measured runtime profile of the input.

onnxruntime fuses operators and changes layouts, so a sum of per-operator costs prices
work it does not execute as such: an activation fused into a convolution costs it next
to nothing, a layer norm it runs as one kernel costs one kernel's time. Its per-node
profiler says what each of its kernels took; ``spread`` shares each kernel's time among
the input's nodes it computes (in proportion to their predicted costs), and
``CalibratedCost.fit`` turns that into scales, measured over predicted: per operator
configuration (a conv with a bias or an activation: its bare twin's, as
``ProfiledCost`` borrows), per operator, and overall, in that order of preference. A candidate's
node costs its base cost times the finest scale the input measured for it: a node of a
kind onnxruntime fuses away in the input costs what it cost there (next to nothing).

The arithmetic only: ``taso_egg.calibrate`` takes the profile.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from .config import OpConfig
from .model import CostModel, without_epilogue


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
    """``base``'s costs times measured-over-predicted scales (``fit``)."""

    def __init__(self, base: CostModel, by_key: dict[str, float], by_op: dict[str, float], overall: float,
                 unattributed: float = 0.0):
        self.base = base
        self.by_key, self.by_op, self.overall = by_key, by_op, overall
        self.unattributed = unattributed  # measured seconds no priced node took (reported)
        self._keys: dict[OpConfig, str] = {}  # the text key is the costly part of a lookup
        self.name = (f"{getattr(base, 'name', 'cost model')}, calibrated on one onnxruntime profile of the "
                     f"input ({len(by_key)} configurations, {len(by_op)} operators measured)")

    @staticmethod
    def fit(base: CostModel, nodes: Iterable[tuple[OpConfig, float]], unattributed: float = 0.0) -> CalibratedCost:
        """Scales from the input's nodes as (configuration, measured seconds) pairs, each
        priced by ``base``: the measured seconds of every node of a configuration (of an
        operator; of the whole input) over their predicted seconds."""
        measured_key, predicted_key = defaultdict(float), defaultdict(float)
        measured_op, predicted_op = defaultdict(float), defaultdict(float)
        op_of = {}
        for config, seconds in nodes:
            predicted = base.cost(config)
            if predicted <= 0.0:
                continue
            key = config.key
            op_of[key] = config.op
            measured_key[key] += seconds
            predicted_key[key] += predicted
            measured_op[config.op] += seconds
            predicted_op[config.op] += predicted
        predicted_all = sum(predicted_op.values())
        overall = sum(measured_op.values()) / predicted_all if predicted_all > 0 else 1.0
        return CalibratedCost(base, {k: measured_key[k] / predicted_key[k] for k in predicted_key},
                              {op: measured_op[op] / predicted_op[op] for op in predicted_op}, overall,
                              unattributed)

    def scale(self, config: OpConfig) -> float:
        try:
            key = self._keys.get(config)
            if key is None:
                key = self._keys[config] = config.key
        except TypeError:  # unhashable parameter values
            key = config.key
        scale = self.by_key.get(key)
        for sibling in without_epilogue(config) if scale is None else ():
            scale = self.by_key.get(sibling.key)  # a conv's bias or activation: its bare twin's
            if scale is not None:
                break
        return self.by_op.get(config.op, self.overall) if scale is None else scale

    def cost(self, config: OpConfig) -> float:
        predicted = self.base.cost(config)
        return predicted * self.scale(config) if predicted > 0.0 else predicted

    def lookups(self) -> dict[str, int]:
        return self.base.lookups() if hasattr(self.base, "lookups") else {}

    def reset_counts(self) -> None:
        if hasattr(self.base, "reset_counts"):
            self.base.reset_counts()
