"""The operator table: every operator declared once (see base.OpSpec)."""

from . import attention, elementwise, layout, leaves, masks, nn, normalization, opaque  # noqa: F401  (registers the operators)
from .base import FLOAT_DTYPES, ONNX_IMPORTERS, OPS, OpSpec, Shape, TensorType

# The operators other layers build or take apart by what they are, not by a trait: the
# graph's leaves and barriers (input, weight, opaque, the scalar a 0-d weight also is),
# the n-ary concat and the split the e-graph holds in binary and projected form, and
# those the bridge writes a conv bias with (reshape, ewadd) or fuses it into (conv2d),
# and the multiplication whose constant operand the exporter writes as a scale (ewmul).
INPUT, WEIGHT, OPAQUE, SCALAR = (OPS[n] for n in ("input", "weight", "opaque", "scalar"))
CONCAT, SPLIT, RESHAPE, EWADD, EWMUL, CONV2D = (OPS[n] for n in ("concat", "split", "reshape", "ewadd", "ewmul",
                                                                "conv2d"))

__all__ = ["OPS", "ONNX_IMPORTERS", "OpSpec", "TensorType", "Shape", "FLOAT_DTYPES", "INPUT", "WEIGHT",
           "OPAQUE", "SCALAR", "CONCAT", "SPLIT", "RESHAPE", "EWADD", "EWMUL", "CONV2D"]
