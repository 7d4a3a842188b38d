"""Other tools' optimizations of an ONNX model, made as a user would make them, for the
benchmark (``python -m taso_egg.research.benchmarks --onnx DIR --peers``) to time beside taso-egg's:

- onnxsim: ``onnxsim.simplify`` (constant folding, shape inference, dead code);
- onnxslim: ``onnxslim.slim`` (the same, plus pattern fusions);
- ort-transformers: onnxruntime's transformers optimizer (``optimize_model``: attention,
  LayerNorm and GELU fusions into onnxruntime's contrib operators), for transformers
  only, its model type guessed (``transformer_kind``).

onnxsim and onnxslim are an optional extra (``pip install 'taso-egg[peers]'``); the
transformers optimizer ships inside onnxruntime. A tool that is not installed or
does not apply gives a ``PeerOutput`` saying why instead of a model; ``run_peers``
makes one of a tool's failure too, so that a peer never ends the benchmark."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Callable

INSTALL_HINT = "pip install 'taso-egg[peers]'"
# The transformers optimizer's Python fusions alone (opt_level 0): levels 1 and up first
# run onnxruntime's own graph optimizations, which imports torch (onnxruntime 1.32) and
# writes optimized_model_o*_cpu.onnx into the working folder; the sessions that time the
# result apply onnxruntime's optimizations (ORT_ENABLE_ALL) anyway.
ORT_OPT_LEVEL = 0


@dataclass(frozen=True)
class PeerOutput:
    """A peer's model, or ``None`` with ``why`` (not installed, does not apply,
    failed); ``how`` says how it was run when that was guessed (a model type)."""

    model: object | None
    why: str = ""
    how: str = ""


def transformer_kind(model) -> str | None:
    """``"gpt2"`` for a causal transformer (a triangular mask: a Trilu node, a boolean
    or integer square constant that is lower triangular, or positions compared with
    positions, as exporters build ``k <= q`` from two Ranges), ``"bert"`` for another
    transformer (MatMul with Softmax, or LayerNormalization), else None."""
    ops = {n.op_type for n in model.graph.node}
    if not ("LayerNormalization" in ops or {"MatMul", "Softmax"} <= ops):
        return None
    causal = "Trilu" in ops or _compares_positions(model) or _has_causal_mask(model)
    return "gpt2" if causal else "bert"


_COMPARISONS = ("Less", "LessOrEqual", "Greater", "GreaterOrEqual")


def _compares_positions(model, depth: int = 8) -> bool:
    """Whether a comparison's two inputs both come from a Range (within ``depth`` nodes)."""
    producer = {out: n for n in model.graph.node for out in n.output}

    def from_range(name: str, depth: int) -> bool:
        node = producer.get(name)
        if node is None or depth == 0:
            return False
        return node.op_type == "Range" or any(from_range(i, depth - 1) for i in node.input)

    return any(n.op_type in _COMPARISONS and len(n.input) == 2 and all(from_range(i, depth) for i in n.input)
               for n in model.graph.node)


_MASK_TYPES = (9, 2, 6, 7)  # TensorProto BOOL, UINT8, INT32, INT64


def _has_causal_mask(model) -> bool:
    import numpy as np
    from onnx import numpy_helper

    tensors = list(model.graph.initializer) + [a.t for n in model.graph.node if n.op_type == "Constant"
                                               for a in n.attribute if a.name == "value"]
    for t in tensors:
        dims = list(t.dims)
        if len(dims) >= 2 and dims[-1] == dims[-2] > 1 and t.data_type in _MASK_TYPES:
            a = numpy_helper.to_array(t).reshape(-1, dims[-2], dims[-1])[0] != 0
            if a.any() and np.array_equal(a, np.tril(np.ones_like(a))):
                return True
    return False


def onnxsim(model) -> PeerOutput:
    try:
        from onnxsim import simplify
    except ImportError:
        return PeerOutput(None, f"not installed ({INSTALL_HINT})")
    simplified, _ = simplify(model)  # its own check's verdict: the benchmark checks every candidate
    return PeerOutput(simplified)


def onnxslim(model) -> PeerOutput:
    try:
        from onnxslim import slim
    except ImportError:
        return PeerOutput(None, f"not installed ({INSTALL_HINT})")
    return PeerOutput(slim(model))


def ort_transformers(model) -> PeerOutput:
    kind = transformer_kind(model)
    if kind is None:
        return PeerOutput(None, "not a transformer")
    try:
        from onnxruntime.transformers.optimizer import optimize_model
    except ImportError as e:
        return PeerOutput(None, f"not installed (onnxruntime.transformers: {e})")
    optimized = optimize_model(model, model_type=kind, opt_level=ORT_OPT_LEVEL, use_gpu=False)
    return PeerOutput(optimized.model, how=f"{kind}, opt_level {ORT_OPT_LEVEL}")


PEERS: dict[str, Callable] = {"onnxsim": onnxsim, "onnxslim": onnxslim, "ort-transformers": ort_transformers}


def run_peers(model, peers: dict[str, Callable] | None = None) -> dict[str, PeerOutput]:
    """Each peer's output for ``model`` (a ModelProto, left as it is); a peer that
    raises gives its exception, in one line, as the reason."""
    out = {}
    for name, peer in (PEERS if peers is None else peers).items():
        try:
            with contextlib.redirect_stdout(sys.stderr):  # their chatter stays out of the table
                out[name] = peer(_copy(model))
        except Exception as e:  # a third-party tool's failure is a cell, not the end of the table
            message = str(e).strip().splitlines()
            out[name] = PeerOutput(None, f"failed: {type(e).__name__}" + (f": {message[0][:200]}" if message else ""))
    return out


def _copy(model):
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # some peers edit the model they are given
    return copy
