"""The model's precision, which is the user's: which ONNX nodes quantize or widen.

A quantized or half-precision model stores its weights narrow on purpose. The nodes
that round (QuantizeLinear and the quantized operators) or widen stored data
(DequantizeLinear, a Cast of a narrow weight) are carried exactly as the input has
them: never folded into constants (that would store the weight widened, and a file
four times the size), imported as opaque nodes, so rewrites see them as barriers and
work only on the float regions between them, never moving a rounding step.
"""

from __future__ import annotations

import numpy as np

# Operators of the default and onnxruntime's domains that quantize, dequantize or
# compute on quantized data; any "QLinear*" operator is one too (see is_quantizing).
QUANTIZING_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
    "QGemm", "QAttention", "QOrderedMatMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
    "DynamicQuantizeLSTM", "QEmbedLayerNormalization", "MatMulNBits", "MatMulBnb4", "GatherBlockQuantized",
})
_QUANTIZING_DOMAINS = ("", "ai.onnx", "com.microsoft")

# The relative size of one rounding step: a float's machine epsilon; an integer's
# step relative to its range, as quantization uses it.
ROUNDING_STEP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23,
                 "float64": 2.0 ** -52, "int8": 2.0 ** -8, "uint8": 2.0 ** -8, "int16": 2.0 ** -16,
                 "uint16": 2.0 ** -16, "int4": 2.0 ** -4, "uint4": 2.0 ** -4}
# Element types a model stores narrower than float32 on purpose (float8 types are left
# to onnxruntime's kernels).
NARROW_DTYPES = frozenset({"float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int4", "uint4"})


def is_quantizing(op_type: str, domain: str = "") -> bool:
    """Whether an ONNX node of this type quantizes, dequantizes or computes on
    quantized data: a rounding step the model's precision consists of."""
    return (domain or "") in _QUANTIZING_DOMAINS and (op_type in QUANTIZING_OPS
                                                      or op_type.startswith("QLinear"))


def widens_stored(source_dtype: str, target_dtype: str, elements: int) -> bool:
    """Whether converting stored data (a weight of ``elements`` elements) from
    ``source_dtype`` to ``target_dtype`` would store a narrow weight wider. Scalars do
    not count: a scale or zero point is no weight."""
    return (elements > 1 and str(source_dtype) in NARROW_DTYPES
            and np.dtype(target_dtype).itemsize > np.dtype(source_dtype).itemsize)


def is_float(dtype) -> bool:
    """Whether a NumPy dtype holds floats, bfloat16 and float8 (ml_dtypes) included."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or (dtype.kind == "V" and dtype.name.startswith(("bfloat", "float8")))


def quantized_operators(nodes) -> set[tuple[str, ...]]:
    """The outputs (as a tuple, a node's identity) of the ONNX nodes that form quantized operators with
    their Q/DQ neighbours: a node that reads a DequantizeLinear's output or feeds a
    QuantizeLinear. onnxruntime runs such a group, DQ -> op -> Q, as one integer kernel,
    so rewriting the op in between would run it in float: it is carried as it is."""
    dequantized = {o for n in nodes if _is(n, "DequantizeLinear") for o in n.output}
    quantized = {i for n in nodes if _is(n, "QuantizeLinear") for i in n.input[:1]}
    return {tuple(n.output) for n in nodes if not is_quantizing(n.op_type, n.domain)
            and (any(i in dequantized for i in n.input) or any(o in quantized for o in n.output))}


def _is(node, op_type: str) -> bool:
    return node.op_type == op_type and (node.domain or "") in _QUANTIZING_DOMAINS
