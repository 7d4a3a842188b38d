"""The operator table: every operator declared once (see base.OpSpec)."""

from . import elementwise, layout, leaves, masks, nn, normalization, opaque  # noqa: F401  (registers the operators)
from .base import FLOAT_DTYPES, ONNX_IMPORTERS, OPS, OpSpec, Shape, TensorType

__all__ = ["OPS", "ONNX_IMPORTERS", "OpSpec", "TensorType", "Shape", "FLOAT_DTYPES"]
