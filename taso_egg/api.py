"""The public calls, in one place: what a user imports from ``taso_egg`` (lazily) or
from here. Each lives in the stage package that does the work:

- ``optimize_model``: an ONNX file or ModelProto in, the optimized model out (and
  written), as ``taso-egg optimize`` runs it (``product.optimize_onnx``);
- ``optimize``, ``extract_graph``, ``runtime_form``: one ``Graph`` saturated,
  extracted, decided and checked (``product.optimize_graph``);
- ``saturate``: a graph grown into an e-graph (``egraph.saturate``).
"""

from __future__ import annotations

from .egraph.saturate import Saturation, saturate
from .product.optimize_graph import (CheckReport, Extraction, OptimizeResult, OptimizeStats, Writer, extract_graph,
                                     optimize, runtime_calibrated, runtime_cost, runtime_form)
from .product.optimize_onnx import OptimizeReport, optimize_model

__all__ = ["optimize_model", "OptimizeReport", "optimize", "OptimizeResult", "OptimizeStats", "CheckReport",
           "Writer", "extract_graph", "Extraction", "runtime_form", "runtime_cost", "runtime_calibrated",
           "saturate", "Saturation"]
