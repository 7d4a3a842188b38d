"""Outputs read at their last position only, on the caller's word (``--last-position``).

A generation loop reads ``logits[:, -1]`` and nothing else; an export returns every
position. Where the caller says so, the output becomes its last position along one
axis (a ``Slice`` of length 1, so the rank is kept and ``logits[:, -1]`` still reads
it), and the select then moves up through per-position operators as it does where a
graph reads one position itself. This changes the interface, which is never done
unasked: the caller names each output, and what was done is said back
(``describe``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import OnnxImportError
from ..graph import claim_unique_name

# Slice's end for "to the end of the axis".
_INT64_MAX = (1 << 63) - 1
# The axis read when the caller names none: a sequence model's positions ([batch, sequence, ...]).
DEFAULT_AXIS = 1


def parse_last_position(items) -> dict[str, int]:
    """``["logits", "hidden:1"]`` -> ``{"logits": 1, "hidden": 1}`` (``NAME[:AXIS]``, one line on a mistake)."""
    outputs: dict[str, int] = {}
    for item in items or ():
        name, _, axis = item.partition(":")
        try:
            axis = int(axis) if axis else DEFAULT_AXIS
        except ValueError:
            axis = None
        if not name or axis is None:
            raise OnnxImportError(f"--last-position {item!r}: expected OUTPUT or OUTPUT:AXIS (e.g. logits:1)")
        if name in outputs:
            raise OnnxImportError(f"--last-position names output {name!r} twice")
        outputs[name] = axis
    return outputs


def read_last_position(model, outputs: Mapping[str, int]) -> None:
    """Make each named output of ``model`` (a ModelProto or a fed.FedModel, changed in
    place) its last position along its axis: the node that made it now makes
    ``NAME.all_positions``, which a ``Slice`` ``[-1:]`` reads. One line names what is
    wrong: an output the model lacks, an axis past its rank, an output that is an input
    or a weight, an opset older than Slice's inputs (10)."""
    from onnx import TensorProto, helper

    graph = model.graph
    declared = {o.name: o for o in graph.output}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if outputs and opset < 10:
        raise OnnxImportError(f"--last-position: the model's opset {opset} predates Slice with inputs (10)")
    taken = {t for n in graph.node for t in (*n.input, *n.output)} | {t.name for t in graph.initializer} \
        | {i.name for i in graph.input}
    for name, axis in outputs.items():
        if name not in declared:
            raise OnnxImportError(f"--last-position: the model has no output {name!r} "
                                  f"(its outputs: {', '.join(declared)})")
        dims = declared[name].type.tensor_type.shape.dim
        rank = len(dims)
        if not declared[name].type.tensor_type.HasField("shape") or not -rank <= axis < rank:
            raise OnnxImportError(f"--last-position {name}:{axis}: output {name!r} has "
                                  + (f"rank {rank}" if declared[name].type.tensor_type.HasField("shape")
                                     else "no declared shape") + ", so it has no such axis")
        producers = [n for n in graph.node if name in n.output]
        if not producers:
            raise OnnxImportError(f"--last-position: output {name!r} is an input or a weight, not computed")
        full = claim_unique_name(f"{name}.all_positions", taken)
        for node in graph.node:  # the producer, and any node that also reads the full output
            node.output[:] = [full if t == name else t for t in node.output]
            node.input[:] = [full if t == name else t for t in node.input]
        consts = []
        for what, value in (("starts", -1), ("ends", _INT64_MAX), ("axes", axis)):
            consts.append(claim_unique_name(f"{name}.last_position_{what}", taken))
            graph.initializer.append(helper.make_tensor(consts[-1], TensorProto.INT64, [1], [value]))
        graph.node.append(helper.make_node("Slice", [full, *consts], [name], name=claim_unique_name(f"{name}.last_position", taken)))
        dim = dims[axis]
        dim.Clear()
        dim.dim_value = 1


def describe(outputs: Mapping[str, int]) -> str:
    """What ``read_last_position`` changed, for the headline and the notes."""
    return ", ".join(f"{name} along axis {axis}" for name, axis in outputs.items()) + \
        " read at the last position only (--last-position: the interface changes there, the axis becomes 1)"

