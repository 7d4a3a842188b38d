"""The product path: an ONNX file in, a faster ONNX file out, as ``taso-egg optimize``
runs it. Its modules, in the order the data flows through them:

1. ``optimize_onnx.OnnxInput.read``  validate and read the file (external data; opsets upgraded)
2. ``dims``          size the symbolic dims, once: ties among them, first, second and empty sizes
3. ``dynamic``       import the model at those sizes (``DynamicModel``)
4. ``calibrate``     one onnxruntime profile of the input scales the cost model
5. ``optimize_graph`` saturate, extract, decide, check (``optimize``); after extraction,
   ``pack_nbits`` packs the 4-bit products of one activation into one,
   ``join_moves`` makes split trees and reshape chains one step each, and
   ``fuse_attention`` writes a decoder's attention as onnxruntime's kernels
6. ``decide``        predict each candidate from kernel profiles; time the ones that could pay
7. ``guard``         paired rounds, the signed-rank interval: faster, or not
8. ``timing``        whole models timed as deployed (sessions, rounds, kernel profiles)
9. ``symbolize``     the chosen graph written back with the input's symbolic dims
   (``dynamic.write_symbolic`` checks it at both sizes)
10. ``optimize_onnx`` the path as one call (``optimize_onnx``, ``optimize_model``): what is written
11. ``phases``        seconds per phase of one optimization

Beside it, measured the way users run their models: ``generate`` (a decoder's greedy
generation and decode step with its cache), ``step_floor`` (a step's weight products
alone), ``padded`` (a padded batch, compared call by call) and ``peers`` (onnxsim, onnxslim,
onnxruntime's transformers optimizer, as their users call them).
"""
