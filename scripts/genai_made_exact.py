"""onnxruntime-genai's decoder model made exact the way taso-egg's kernel form is: what
its speed costs (issue 57's premise test).

genai's builder derives GroupQueryAttention's lengths from the mask's row sums, reads no
mask otherwise, turns keys by a position it infers, and has no NaN guard: left padding
and holes in ``attention_mask`` give other logits than the export (``bench --generate
EXPORT GENAI --padded``). This writes the same model with what exactness takes:

- ``mask``: every row's keys the whole cache (``seqlens_k`` = total - 1 and the
  total from ``attention_mask``'s shape, ``query_seqlens`` the new tokens), and
  ``attention_mask`` as the bias (0 where a key is kept, -inf where not, [B, 1, S, T]);
- ``angles``: a ``position_ids`` input, each new token turned by its own position id
  (its row of genai's cos/sin tables gathered, one row a token, padded to the keys);
- ``--nan-guard``: a row that sees no key gives 0, as the export's softmax guard does.

    python scripts/genai_made_exact.py GENAI_DIR/model.onnx OUT_DIR [--parts mask,angles] [--nan-guard]

Then ``python -m taso_egg.bench --generate EXPORT WRITTEN OUT_DIR/model.onnx GENAI_DIR/model.onnx
--step-at 31 255`` times the three against the export (``--padded`` shows it exact).
genai's ``genai_config.json`` is copied beside it (the bench reads the cache sizes there).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from taso_egg.onnx_io.onnx_nodes import needed_nodes


def made_exact(model: onnx.ModelProto, parts: set[str], nan_guard: bool) -> onnx.ModelProto:
    g = model.graph
    half = next(int(i.dims[1]) for i in g.initializer if i.name == "cos_cache")
    added: list = []

    def const(name, value):
        g.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, out, **attrs):
        added.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    mask_shape = node("Shape", ["attention_mask"], "x_mask_shape")
    ids_shape = node("Shape", ["input_ids"], "x_ids_shape")
    total = node("Gather", [mask_shape, const("x_one", np.array(1, np.int64))], "x_total", axis=0)
    batch = node("Gather", [mask_shape, const("x_first", np.array([0], np.int64))], "x_batch", axis=0)
    total32 = node("Cast", [total], "x_total32", to=TensorProto.INT32)
    seqlens = node("Expand", [node("Sub", [total32, const("x_one32", np.array(1, np.int32))], "x_last"), batch],
                   "x_seqlens")
    seq = node("Gather", [ids_shape, const("x_one_again", np.array(1, np.int64))], "x_seq", axis=0)
    query = node("Cast", [node("Expand", [seq, batch], "x_seq_rows")], "x_query_seqlens", to=TensorProto.INT32)
    seen = node("Unsqueeze", [node("Cast", ["attention_mask"], "x_seen", to=TensorProto.BOOL),
                              const("x_axes", np.array([1, 2], np.int64))], "x_seen_rows")
    bias_row = node("Where", [seen, const("x_open", np.array(0, np.float32)),
                              const("x_closed", np.array(-np.inf, np.float32))], "x_bias_row")
    seq_vec = node("Gather", [ids_shape, const("x_seq_axis", np.array([1], np.int64))], "x_seq_vec", axis=0)
    tokens = node("Concat", [const("x_lead", np.array([1, 1], np.int64)), seq_vec,
                             const("x_tail", np.array([1], np.int64))], "x_tokens", axis=0)
    bias = node("Expand", [bias_row, tokens], "x_bias")
    pads = node("Concat", [const("x_no_pad", np.array([0, 0], np.int64)),
                           node("Reshape", [total, const("x_one_vec", np.array([1], np.int64))], "x_total_vec"),
                           const("x_pad_zero", np.array([0], np.int64))], "x_pads", axis=0)
    tables = {}
    for name in ("cos_cache", "sin_cache"):
        rows = node("Reshape", [node("Gather", [name, "position_ids"], f"x_{name}_tokens", axis=0),
                                const(f"x_{name}_rows_shape", np.array([-1, half], np.int64))], f"x_{name}_rows")
        tables[name] = node("Pad", [rows, pads], f"x_{name}_padded")
    batch_seq = node("Gather", [ids_shape, const("x_batch_seq", np.array([0, 1], np.int64))], "x_bs", axis=0)
    count = node("ReduceProd", [batch_seq], "x_count", keepdims=0)
    numbers = node("Reshape", [node("Range", [const("x_start", np.array(0, np.int64)), count,
                                              const("x_step", np.array(1, np.int64))], "x_numbers"), batch_seq],
                   "x_token_rows")
    if "angles" in parts:
        g.input.insert(2, helper.make_tensor_value_info("position_ids", TensorProto.INT64,
                                                        ["batch_size", "sequence_length"]))
    nodes = []
    for n in g.node:
        nodes.append(n)
        if n.op_type != "GroupQueryAttention":
            continue
        inputs = list(n.input) + [""] * (17 - len(n.input))
        if "mask" in parts:
            inputs[5], inputs[6], inputs[10], inputs[16] = seqlens, total32, bias, query
        if "angles" in parts:
            inputs[7], inputs[8], inputs[9] = tables["cos_cache"], tables["sin_cache"], numbers
        while inputs[-1] == "":
            inputs.pop()
        n.input[:] = inputs
        if nan_guard:
            out, raw = n.output[0], n.output[0] + "_raw"
            n.output[0] = raw
            nodes += [helper.make_node("IsNaN", [raw], [raw + "_isnan"]),
                      helper.make_node("Where", [raw + "_isnan", "x_open", raw], [out])]
    kept = needed_nodes(added + nodes, [o.name for o in g.output])
    del g.node[:]
    g.node.extend(kept)
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path, help="onnxruntime-genai's model.onnx")
    ap.add_argument("out", type=Path, help="folder to write model.onnx (and its data) into")
    ap.add_argument("--parts", default="mask,angles", help="what to make exact: mask, angles (default both)")
    ap.add_argument("--nan-guard", action="store_true", help="zero a row that sees no key, as the export does")
    args = ap.parse_args(argv)
    parts = {p for p in args.parts.split(",") if p}
    if parts - {"mask", "angles"}:
        ap.error(f"unknown parts {sorted(parts - {'mask', 'angles'})}: choose from mask, angles")
    args.out.mkdir(parents=True, exist_ok=True)
    model = made_exact(onnx.load(args.model), parts, args.nan_guard)
    onnx.save(model, args.out / "model.onnx", save_as_external_data=True, location="model.onnx.data")
    config = args.model.parent / "genai_config.json"
    if config.exists():
        shutil.copy(config, args.out / config.name)
    print(f"wrote {args.out / 'model.onnx'}: {len(model.graph.node)} nodes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
