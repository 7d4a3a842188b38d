#!/usr/bin/env python3
"""Export a few real-world PyTorch models to ONNX, for testing an ONNX importer.

Standalone script; NOT part of the project's dependencies. Run it with a venv
that has torch, torchvision, transformers, onnxscript, onnx, onnxruntime:

    /work/venvtorch/bin/python tests/torch_zoo/export_models.py [OUT_DIR]

OUT_DIR defaults to /work/torch_models. For every model two exports are tried:
the legacy TorchScript exporter (dynamo=False, opset 17) -> NAME.ts.onnx and
the dynamo exporter (dynamo=True, its default opset) -> NAME.dynamo.onnx.
ResNet-50 also gets a variant with a symbolic batch dimension "batch"
(NAME.dynbatch.onnx, legacy exporter, dynamic_axes; and
NAME.dynbatch.dynamo.onnx, dynamo exporter, dynamic_shapes).
All weights are random (no downloads) and stored inside the .onnx files.
Every file is then run with onnxruntime on random inputs, compared against
PyTorch on the export inputs, and summarised in OUT_DIR/SUMMARY.md.
"""

import argparse
import collections
import os
import sys
import time
import traceback
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

SEED = 0
LEGACY_OPSET = 17
BERT_SEQ = 64


def seed_all():
    torch.manual_seed(SEED)
    np.random.seed(SEED)


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

def make_resnet50():
    import torchvision
    seed_all()
    m = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    return m, (x,), ["input"], ["output"]


def make_squeezenet():
    import torchvision
    seed_all()
    m = torchvision.models.squeezenet1_1(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    return m, (x,), ["input"], ["output"]


class BertWrapper(torch.nn.Module):
    """Returns plain tensors (last_hidden_state, pooler_output)."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                        return_dict=True)
        return out.last_hidden_state, out.pooler_output


def make_bert():
    from transformers import BertConfig, BertModel
    seed_all()
    cfg = BertConfig()  # bert-base: 12 layers, hidden 768, 12 heads, vocab 30522
    m = BertWrapper(BertModel(cfg)).eval()
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, cfg.vocab_size, (1, BERT_SEQ), dtype=torch.int64, generator=g)
    mask = torch.ones(1, BERT_SEQ, dtype=torch.int64)
    mask[:, BERT_SEQ - 8:] = 0  # some padding, exercises the masking path
    return m, (ids, mask), ["input_ids", "attention_mask"], \
        ["last_hidden_state", "pooler_output"]


MODELS = [
    ("resnet50", make_resnet50),
    ("squeezenet1_1", make_squeezenet),
    ("bert", make_bert),
]


# --------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------

def export_legacy(model, args, in_names, out_names, path, dynamic_axes=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, args, path, dynamo=False, opset_version=LEGACY_OPSET,
            input_names=in_names, output_names=out_names,
            dynamic_axes=dynamic_axes, do_constant_folding=True,
            export_params=True)


def export_dynamo(model, args, in_names, out_names, path, dynamic_shapes=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            model, args, dynamo=True, input_names=in_names,
            output_names=out_names, dynamic_shapes=dynamic_shapes,
            external_data=False, optimize=True)
        prog.save(path, external_data=False)


def torch_ref(model, args):
    with torch.no_grad():
        out = model(*args)
    if isinstance(out, torch.Tensor):
        out = (out,)
    return [o.detach().numpy() for o in out]


# --------------------------------------------------------------------------
# Inspection
# --------------------------------------------------------------------------

def dim_str(d):
    if d.HasField("dim_value"):
        return str(d.dim_value)
    if d.HasField("dim_param"):
        return d.dim_param
    return "?"


def vi_str(vi):
    t = vi.type.tensor_type
    dt = onnx.TensorProto.DataType.Name(t.elem_type)
    if not t.HasField("shape"):
        return f"{vi.name}: {dt}[<no shape>]"
    return f"{vi.name}: {dt}[{', '.join(dim_str(d) for d in t.shape.dim)}]"


def walk_nodes(graph):
    for n in graph.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from walk_nodes(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from walk_nodes(g)


def uses_external_data(model):
    return any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in model.graph.initializer)


ORT_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def random_feed(sess, rng, batch=None):
    feed = {}
    for i in sess.get_inputs():
        shape = []
        for k, d in enumerate(i.shape):
            if isinstance(d, int):
                shape.append(d)
            else:  # symbolic
                shape.append(batch if (batch is not None and k == 0) else 1)
        dt = ORT_DTYPES[i.type]
        if dt == np.float32:
            feed[i.name] = rng.standard_normal(shape).astype(dt)
        elif i.name == "attention_mask":
            feed[i.name] = rng.integers(0, 2, shape).astype(dt)
        else:
            feed[i.name] = rng.integers(0, 1000, shape).astype(dt)
    return feed


def inspect_file(path, ref_args=None, ref_outs=None):
    """Returns a dict with the summary of one .onnx file."""
    info = {"file": os.path.basename(path), "size": os.path.getsize(path)}
    m = onnx.load(path, load_external_data=False)
    info["external_data"] = uses_external_data(m)
    info["ir_version"] = m.ir_version
    info["producer"] = f"{m.producer_name} {m.producer_version}"
    info["opsets"] = {(o.domain or "ai.onnx"): o.version for o in m.opset_import}
    info["nodes_top"] = len(m.graph.node)
    nodes = list(walk_nodes(m.graph))
    info["nodes_all"] = len(nodes)
    info["functions"] = [f.name for f in m.functions]
    hist = collections.Counter(
        (f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type)
        for n in nodes)
    for f in m.functions:
        for n in f.node:
            hist[f"[fn]{n.op_type}"] += 1
    info["hist"] = sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))
    info["n_init"] = len(m.graph.initializer)
    info["inputs"] = [vi_str(v) for v in m.graph.input]
    info["outputs"] = [vi_str(v) for v in m.graph.output]
    try:
        onnx.checker.check_model(path, full_check=False)
        info["checker"] = "ok"
    except Exception as e:  # noqa: BLE001
        info["checker"] = f"FAILED: {type(e).__name__}: {str(e)[:200]}"

    # onnxruntime: random inputs, plus the torch reference inputs.
    rng = np.random.default_rng(SEED)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    runs = []
    batches = [None]
    if any(not isinstance(d, int) for i in sess.get_inputs() for d in i.shape):
        batches = [1, 3]
    for b in batches:
        feed = random_feed(sess, rng, b)
        outs = sess.run(None, feed)
        ok = all(np.isfinite(o).all() for o in outs if o.dtype.kind == "f")
        runs.append(f"random inputs {[list(v.shape) for v in feed.values()]} -> "
                    f"{[list(o.shape) for o in outs]} finite={ok}")
    info["ort_random"] = runs
    if ref_args is not None:
        feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), ref_args)}
        outs = sess.run(None, feed)
        diffs = [float(np.max(np.abs(o - r))) for o, r in zip(outs, ref_outs)]
        info["ort_vs_torch"] = "max|diff| = " + ", ".join(f"{d:.3g}" for d in diffs)
    return info


def fmt_info(info):
    L = [f"### {info['file']}", ""]
    L.append(f"- size: {info['size']:,} bytes ({info['size'] / 2**20:.1f} MiB), "
             f"external data: {'YES' if info['external_data'] else 'no'}")
    L.append(f"- producer: {info['producer']}, ir_version {info['ir_version']}")
    L.append("- opsets: " + ", ".join(f"{k}={v}" for k, v in info["opsets"].items()))
    L.append(f"- nodes: {info['nodes_top']} in main graph"
             + (f" ({info['nodes_all']} incl. subgraphs)"
                if info["nodes_all"] != info["nodes_top"] else "")
             + f", initializers: {info['n_init']}"
             + (f", functions: {info['functions']}" if info["functions"] else ""))
    L.append(f"- onnx.checker: {info['checker']}")
    L.append("- inputs:  " + "; ".join(info["inputs"]))
    L.append("- outputs: " + "; ".join(info["outputs"]))
    for r in info["ort_random"]:
        L.append(f"- onnxruntime: {r}")
    if "ort_vs_torch" in info:
        L.append(f"- onnxruntime vs torch on export inputs: {info['ort_vs_torch']}")
    L.append("- op types: " + ", ".join(f"{k} {v}" for k, v in info["hist"]))
    L.append("")
    return "\n".join(L)


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", nargs="?", default="/work/torch_models")
    ap.add_argument("--only", nargs="*", help="model names to export")
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    results = []   # (info dict)
    failures = []  # (file, message)
    for name, make in MODELS:
        if a.only and name not in a.only:
            continue
        model, args, in_names, out_names = make()
        ref = torch_ref(model, args)
        jobs = [
            (f"{name}.ts.onnx",
             lambda p: export_legacy(model, args, in_names, out_names, p)),
            (f"{name}.dynamo.onnx",
             lambda p: export_dynamo(model, args, in_names, out_names, p)),
        ]
        if name == "resnet50":
            dyn_axes = {"input": {0: "batch"}, "output": {0: "batch"}}
            batch = torch.export.Dim("batch", min=1, max=1024)
            jobs += [
                (f"{name}.dynbatch.onnx",
                 lambda p: export_legacy(model, args, in_names, out_names, p,
                                         dynamic_axes=dyn_axes)),
                (f"{name}.dynbatch.dynamo.onnx",
                 lambda p: export_dynamo(model, args, in_names, out_names, p,
                                         dynamic_shapes=({0: batch},))),
            ]
        for fname, fn in jobs:
            path = os.path.join(a.out_dir, fname)
            t0 = time.time()
            try:
                seed_all()
                fn(path)
                dt = time.time() - t0
                print(f"exported {fname} in {dt:.1f}s", flush=True)
                info = inspect_file(path, args, ref)
                info["export_s"] = dt
                results.append(info)
                print(fmt_info(info), flush=True)
            except Exception as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                print(f"FAILED {fname}: {msg}", flush=True)
                traceback.print_exc()
                failures.append((fname, msg))

    import torchvision
    import transformers
    hdr = [
        "# ONNX models exported from PyTorch (random weights)",
        "",
        f"Generated by `tests/torch_zoo/export_models.py` with torch {torch.__version__}, "
        f"torchvision {torchvision.__version__}, transformers {transformers.__version__}, "
        f"onnx {onnx.__version__}, onnxscript "
        f"{__import__('onnxscript').__version__}, onnxruntime {ort.__version__}.",
        "",
        f"Seed {SEED}. `*.ts.onnx` / `*.dynbatch.onnx`: legacy TorchScript exporter "
        f"(`dynamo=False, opset_version={LEGACY_OPSET}`). `*.dynamo.onnx`: dynamo exporter "
        "(`dynamo=True`, default opset, optimize=True). Weights are embedded "
        "(no external data). BERT: `BertModel(BertConfig())` (bert-base, 12 layers), "
        f"inputs input_ids/attention_mask int64 [1, {BERT_SEQ}]; outputs "
        "last_hidden_state, pooler_output. Node counts/histograms include nodes in "
        "subgraphs; `[fn]` marks nodes inside model-local functions.",
        "",
        "| file | size (bytes) | opsets | nodes | export s |",
        "|---|---:|---|---:|---:|",
    ]
    for i in results:
        ops = ", ".join(f"{k}={v}" for k, v in i["opsets"].items())
        hdr.append(f"| {i['file']} | {i['size']:,} | {ops} | {i['nodes_all']} | "
                   f"{i['export_s']:.1f} |")
    hdr.append("")
    if failures:
        hdr.append("## Failures")
        hdr += [f"- {f}: {m}" for f, m in failures]
        hdr.append("")
    hdr.append("## Details")
    hdr.append("")
    text = "\n".join(hdr) + "\n" + "\n".join(fmt_info(i) for i in results)
    with open(os.path.join(a.out_dir, "SUMMARY.md"), "w") as f:
        f.write(text)
    print(f"wrote {os.path.join(a.out_dir, 'SUMMARY.md')}; "
          f"{len(results)} ok, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
