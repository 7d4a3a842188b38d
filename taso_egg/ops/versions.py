"""Which ONNX IR version goes with an opset (onnx.checker and onnxruntime insist)."""

DEFAULT_OPSET = 17
MIN_OPSET = 13  # Split, Squeeze and Unsqueeze take their sizes/axes as inputs from here on


def ir_version_for(opset: int) -> int:
    if opset <= 18:
        return 8
    if opset <= 20:
        return 9
    return 10
