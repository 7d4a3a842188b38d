"""taso-egg's kernel form with a fast path chosen at run time: what onnxruntime's ``If``
costs against what genai's shortcuts save (issue 57's last lever, tested).

The kernel form (``optimize --attention kernel``) is exact for any mask: each
GroupQueryAttention reads ``attention_mask`` as its bias, each token's angles by its own
position id, ``query_seqlens``, and a NaN guard follows it. When the mask has no zero,
the position ids are ``past, past + 1, ...`` on every row and the last of them is in a
table, genai's form is exact too: no bias, no guard, the angles read from a constant
table by the positions the kernel infers. This writes the model with

- ``--where model``: one ``If`` on that condition, genai's form of the whole graph in one
  branch and the exact graph in the other;
- ``--where layer``: the condition once, then one ``If`` a layer around its attention and
  guard (the exact angle rows and bias computed for every step outside);
- ``--where none``: genai's form alone, exact only where the condition holds (the bound
  a fast path could reach).

The table is the model's own angle subgraph run on positions 0 .. MAX-1.

    python scripts/fast_path_if.py WRITTEN.onnx OUT.onnx --where model [--max-position 4096]

Then ``python -m taso_egg.bench --generate EXPORT WRITTEN OUT.onnx GENAI --step-at 31 255``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper, utils

from taso_egg.onnx_io.onnx_nodes import needed_nodes


def _angle_table(path: Path, cos_rows: str, sin_rows: str, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """The model's angles for positions 0 .. positions-1, by its own subgraph."""
    with tempfile.TemporaryDirectory() as tmp:
        angles = Path(tmp) / "angles.onnx"
        utils.extract_model(str(path), str(angles), ["position_ids"], [cos_rows, sin_rows], check_model=False)
        session = ort.InferenceSession(str(angles), providers=["CPUExecutionProvider"])
        cos, sin = session.run(None, {"position_ids": np.arange(positions, dtype=np.int64)[None]})
    return cos.reshape(positions, -1), sin.reshape(positions, -1)


def _copy(n: onnx.NodeProto) -> onnx.NodeProto:
    return onnx.NodeProto.FromString(n.SerializeToString())


def fast_path(path: Path, where: str, max_position: int) -> onnx.ModelProto:
    model = onnx.load(path)
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    if not gqa or any(len(n.input) < 17 or not n.input[10] for n in gqa):
        raise SystemExit(f"{path}: no GroupQueryAttention with a bias and query_seqlens "
                         "(write it with optimize --attention kernel)")
    cos, sin = _angle_table(path, producer[gqa[0].input[7]].input[0], producer[gqa[0].input[8]].input[0],
                            max_position)
    g.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in (
        ("fast_cos", cos), ("fast_sin", sin), ("fast_zero", np.array(0, np.int64)),
        ("fast_one", np.array(1, np.int64)), ("fast_max", np.array(max_position, np.int64))))
    guards = {}  # the kernel's raw output -> the guard's nodes and output
    for n in g.node:
        if n.op_type == "Where" and n.input[2] in {k.output[0] for k in gqa}:
            guards[n.input[2]] = [producer[n.input[0]], n]
    outputs = [o.name for o in g.output]

    def fast_form(n: onnx.NodeProto) -> onnx.NodeProto:
        """GroupQueryAttention as genai writes it: the table, no position ids, no bias."""
        n = _copy(n)
        n.input[:] = list(n.input[:7]) + ["fast_cos", "fast_sin"] + [""] * 7 + [n.input[16]]
        if n.output[0] in guards:
            n.output[0] = guards[n.output[0]][1].output[0]
        return n

    guard_nodes = {id(x) for pair in guards.values() for x in pair}
    fast = needed_nodes([fast_form(n) if n.op_type == "GroupQueryAttention" else _copy(n)
                    for n in g.node if id(n) not in guard_nodes], outputs)
    past = next(i.name for i in g.input if i.name.startswith("past"))
    cond = [
        helper.make_node("ReduceMin", ["attention_mask"], ["fast_mask_min"], keepdims=0),
        helper.make_node("Greater", ["fast_mask_min", "fast_zero"], ["fast_no_zero"]),
        helper.make_node("Shape", [past], ["fast_past_vec"], start=2, end=3),
        helper.make_node("Shape", ["position_ids"], ["fast_seq_vec"], start=1, end=2),
        helper.make_node("Squeeze", ["fast_past_vec"], ["fast_past"]),
        helper.make_node("Squeeze", ["fast_seq_vec"], ["fast_seq"]),
        helper.make_node("Add", ["fast_past", "fast_seq"], ["fast_total"]),
        helper.make_node("Range", ["fast_past", "fast_total", "fast_one"], ["fast_expected"]),
        helper.make_node("Sub", ["position_ids", "fast_expected"], ["fast_off"]),
        helper.make_node("Abs", ["fast_off"], ["fast_abs"]),
        helper.make_node("ReduceMax", ["fast_abs"], ["fast_worst"], keepdims=0),
        helper.make_node("Equal", ["fast_worst", "fast_zero"], ["fast_in_order"]),
        helper.make_node("LessOrEqual", ["fast_total", "fast_max"], ["fast_in_table"]),
        helper.make_node("And", ["fast_no_zero", "fast_in_order"], ["fast_both"]),
        helper.make_node("And", ["fast_both", "fast_in_table"], ["fast_cond"]),
    ]

    def branch(nodes, outs, name):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                   for o in outs])

    if where == "none":
        body = fast
    elif where == "model":
        body = cond + [helper.make_node("If", ["fast_cond"], outputs, then_branch=branch(fast, outputs, "fast"),
                                        else_branch=branch([_copy(n) for n in g.node], outputs, "exact"))]
    else:
        body = list(cond)
        for n in g.node:
            if id(n) in guard_nodes:
                continue
            if n.op_type != "GroupQueryAttention":
                body.append(_copy(n))
                continue
            guard = guards.get(n.output[0], [])
            outs = [guard[1].output[0] if guard else n.output[0], n.output[1], n.output[2]]
            body.append(helper.make_node("If", ["fast_cond"], outs,
                                         then_branch=branch([fast_form(n)], outs, "fast_" + outs[1]),
                                         else_branch=branch([_copy(n)] + [_copy(x) for x in guard], outs,
                                                            "exact_" + outs[1])))
    del g.node[:]
    g.node.extend(body)
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="a model written by optimize --attention kernel")
    ap.add_argument("out", type=Path, help="the .onnx to write (its weights beside it)")
    ap.add_argument("--where", choices=("model", "layer", "none"), default="model")
    ap.add_argument("--max-position", type=int, default=4096, help="rows of the angle table")
    args = ap.parse_args(argv)
    model = fast_path(args.model, args.where, args.max_position)
    onnx.save(model, args.out, save_as_external_data=True, location=args.out.name + ".data")
    print(f"wrote {args.out}: {len(model.graph.node)} nodes at the top")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
