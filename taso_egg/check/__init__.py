"""Numerical equivalence checks: every rewritten or exported graph passes one before
it is returned or written.

- ``runtime.check_onnx_model``: two ONNX models in onnxruntime (float32), the runtime
  users deploy; ``onnx_precision``: the precision a written model must keep.
- ``regions.check_locally``: an extracted graph against its input, region by region.
- ``whole_graph.check_graphs_equivalent``: any two graphs, whole.

Both graph checks run on ``scaled_executor`` (float64, tracked exponents) and judge
differences by ``tolerance``'s policy.
"""
