"""What operators cost: the lookup key (``config.OpConfig``, ``node_config``), the profiles on disk
(``store``), and the cost models over them (``model``: ``AnalyticCost``,
``ProfiledCost``, ``graph_cost``, ``load_cost_model``; ``calibrated``: one scaled by a measured
runtime profile of the input)."""

from .calibrated import CalibratedCost
from .config import OpConfig, node_config
from .model import AnalyticCost, CostModel, ProfiledCost, graph_cost, load_cost_model

__all__ = ["CalibratedCost", "OpConfig", "node_config", "AnalyticCost", "CostModel",
           "ProfiledCost", "graph_cost", "load_cost_model"]
