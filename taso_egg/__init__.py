"""taso-egg: an equality-saturation superoptimizer for deep-learning graphs."""

from .errors import (ExecutionError, ExportError, GraphError, OnnxImportError, ShapeError,
                     TasoEggError, VerificationError)
from .executor import random_inputs, run
from .graph import Graph, Node, Tensor, new_graph
from .onnx_io.exporter import export_onnx
from .onnx_io.importer import load_onnx
from .api import Extraction, OptimizeResult, extract_graph, optimize
from .egraph.saturate import Limits, Saturation, saturate

__all__ = [
    "Graph", "Node", "Tensor", "new_graph", "run", "random_inputs", "load_onnx", "export_onnx",
    "optimize", "OptimizeResult", "saturate", "Saturation", "Limits", "extract_graph", "Extraction",
    "TasoEggError", "ShapeError", "GraphError", "OnnxImportError", "ExportError",
    "ExecutionError", "VerificationError",
]
