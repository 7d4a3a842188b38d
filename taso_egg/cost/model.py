"""The cost model: ``cost(config: OpConfig) -> seconds``.

An ``OpConfig`` is the operator, its parameters, its input and output types, and which
inputs are known before run time (``constant``: weights, or work on weights alone).
The exporter turns those into initializers, which runtimes treat differently
(onnxruntime pre-packs a constant MatMul operand), so a profile keys on it. Callers
that do not know leave ``constant`` out of ``OpConfig.of``: every input then counts as
computed at run time.

Two models implement it:

- ``AnalyticCost``: max(FLOPs / peak, bytes / bandwidth) + a per-kernel overhead;
  views and leaves are free, as in TASO.
- ``ProfiledCost``: the times measured per operator configuration on one device
  (``profiles/<name>.json``, written by ``taso_egg.profiling``), with an AnalyticCost
  calibrated to that device's measured peak throughput, bandwidth and overhead as the
  fallback for configurations not profiled (an unprofiled conv with a bias or an
  activation borrows its profiled bare twin's time first). It counts measured,
  borrowed and estimated lookups.

Work on weights alone is folded at export and costs nothing in either model.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

from ..graph import Graph
from ..ops import CONV2D, OPS
from ..options import DEFAULT_PROFILE
from .config import OpConfig, node_config
from .store import load_profile, resolve_profile



class CostModel(Protocol):
    name: str

    def cost(self, config: OpConfig) -> float: ...


@dataclass(frozen=True)
class AnalyticCost:
    """max(FLOPs / peak, bytes / bandwidth) + a fixed per-kernel overhead.

    With the default constants it is ANALYTIC, NOT MEASURED: round figures for a
    2-core CPU that rank alternatives and do not predict seconds. ProfiledCost builds
    one from a device's measured peak instead.
    """

    name: str = "analytic (uncalibrated CPU constants)"
    peak_flops: float = 50e9
    bandwidth: float = 10e9
    overhead: float = 5e-6

    def cost(self, config: OpConfig) -> float:
        spec = OPS[config.op]
        if spec.is_leaf or spec.is_view:
            return 0.0
        inputs, outputs = config.inputs, config.outputs
        flops = spec.flops(config.param_dict, inputs, outputs) if spec.flops else 0.0
        nbytes = sum(t.size for t in inputs) * 4 + sum(t.size for t in outputs) * 4
        return max(flops / self.peak_flops, nbytes / self.bandwidth) + self.overhead


class ProfiledCost:
    """Measured per-configuration times, falling back to a profiled sibling for a conv
    whose bias or activation makes it unprofiled (``_without_epilogue``), then to an
    AnalyticCost calibrated to the same device. ``lookups()`` says how many costs were
    measured, borrowed and estimated."""

    def __init__(self, profile):
        cal = profile.meta["calibration"]
        self.profile = profile
        self.fallback = AnalyticCost(f"analytic, calibrated on {profile.label}",
                                     cal["peak_flops"], cal["bandwidth"], cal["overhead_s"])
        self.name = (f"profile {profile.label} ({len(profile.entries)} configurations; "
                     f"an unprofiled conv with a bias or activation priced as its profiled bare twin, "
                     f"other unprofiled ones estimated from its measured peak)")
        self.measured: Counter = Counter()   # key -> lookups
        self.estimated: Counter = Counter()
        self.borrowed: Counter = Counter()   # priced as a profiled sibling (_without_epilogue)
        self._keys: dict[OpConfig, str] = {}  # the text key is the costly part of a lookup

    def cost(self, config: OpConfig) -> float:
        if OPS[config.op].is_leaf or config.weight_only:
            return 0.0
        try:
            key = self._keys.get(config)
            if key is None:
                key = self._keys[config] = config.key
        except TypeError:  # unhashable parameter values: compute the key every time
            key = config.key
        entry = self.profile.entries.get(key)
        if entry is not None:
            self.measured[key] += 1
            return entry["seconds"]
        for sibling in _without_epilogue(config):
            entry = self.profile.entries.get(sibling.key)
            if entry is not None:
                self.borrowed[key] += 1
                return entry["seconds"]
        self.estimated[key] += 1
        return self.fallback.cost(config)

    def lookups(self) -> dict[str, int]:
        return {"measured": sum(self.measured.values()), "estimated": sum(self.estimated.values()),
                "borrowed": sum(self.borrowed.values()),
                "measured_configs": len(self.measured), "estimated_configs": len(self.estimated),
                "borrowed_configs": len(self.borrowed)}

    def reset_counts(self) -> None:
        self.measured.clear()
        self.estimated.clear()
        self.borrowed.clear()


def _without_epilogue(config: OpConfig) -> list[OpConfig]:
    """For an unprofiled conv with a bias or an activation, the same conv without its
    bias, then without its activation as well: what it borrows its time from. The bias
    add and activation run in the conv's epilogue, a small part of its time, while the
    analytic estimate of cpu-ort's 367 profiled convs lies between 0.63x and 1.44x of
    their measured times (10th to 90th percentile). Priced apart, a folded batchnorm
    (a conv given a bias) looked 10 % dearer on ResNet-50 than the conv it came from.
    (The profile's 89 pairs of RELU and NONE twins differ by a median 12 %, the RELU
    one faster: noise of the same order.)"""
    if config.op != CONV2D.name:
        return []
    bare = [config] if len(config.inputs) == 2 else \
        [OpConfig(config.op, config.params, config.inputs[:2], config.outputs, config.constant[:2])]
    params = dict(config.params)
    if params.get("activation", "NONE") != "NONE":
        params["activation"] = "NONE"
        b = bare[0]
        bare.append(OpConfig(b.op, tuple(sorted(params.items())), b.inputs, b.outputs, b.constant))
    return [c for c in bare if c != config]


def graph_cost(graph: Graph, model: CostModel) -> float:
    """Sum of operator costs, weight-only work excluded."""
    folded = graph.weight_only_nodes()
    return sum(model.cost(node_config(n, [t.node in folded for t in n.inputs]))
               for n in graph.nodes.values() if n.id not in folded)


def load_cost_model(name_or_path: str | os.PathLike = DEFAULT_PROFILE) -> CostModel:
    """``"analytic"``, the name of a shipped profile (``"cpu-ort"``, ``"cpu-numpy"``),
    or the path of a profile JSON file."""
    if name_or_path == "analytic":
        return AnalyticCost()
    return ProfiledCost(load_profile(resolve_profile(name_or_path)))
