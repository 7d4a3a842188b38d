"""taso-egg: an equality-saturation superoptimizer for deep-learning graphs."""

from .errors import (ExecutionError, ExportError, GraphError, OnnxImportError, ShapeError,
                     TasoEggError, VerificationError)
from .executor import random_inputs, run
from .graph import Graph, Node, Tensor, new_graph
from .onnx_io.exporter import export_onnx
from .onnx_io.importer import load_onnx
from .options import (CheckOptions, CostOptions, DecisionOptions, ExtractionOptions, Hooks, Limits,
                      OptimizeOptions, SearchOptions)

# Saturation and extraction need egglog and HiGHS; they load when first named, so that
# the graph IR, the executor and the profiler run where those are not installed (the
# GPU machine: scripts/gpu_run.sh).
_LAZY = {name: "api" for name in ("optimize_model", "OptimizeReport", "optimize", "OptimizeResult",
                                  "extract_graph", "Extraction", "saturate", "Saturation")}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "optimize_model", "OptimizeReport",
    "Graph", "Node", "Tensor", "new_graph", "run", "random_inputs", "load_onnx", "export_onnx",
    "optimize", "OptimizeResult", "saturate", "Saturation", "extract_graph", "Extraction",
    "OptimizeOptions", "Limits", "ExtractionOptions", "CostOptions", "DecisionOptions", "CheckOptions",
    "SearchOptions", "Hooks",
    "TasoEggError", "ShapeError", "GraphError", "OnnxImportError", "ExportError",
    "ExecutionError", "VerificationError",
]
