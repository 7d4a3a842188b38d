#!/usr/bin/env python3
"""Export well-known architectures to ONNX the way users deploy them, for benchmarking
and testing taso-egg against real third-party files.

Standalone script, NOT part of the project's dependencies (sibling of export_models.py,
whose graph walk it reuses). Run it with a venv that has torch, torchvision,
transformers, onnxscript, onnx, onnxruntime (and onnxconverter-common only if torch
cannot run a float16 CNN on the CPU):

    VENV/bin/python tests/torch_zoo/export_deploy.py [--out DIR] [--only JOB ...]

DIR defaults to /work/exports/models. Jobs run one at a time, in priority order (see
JOBS). All weights are random (configs only, torchvision weights=None: no downloads).
After each file is written it is checked and recorded at once, so the files are usable
while later jobs still run: onnx.checker, then onnxruntime on random inputs at two sizes
of every symbolic dim (batch 1 and 2, sequence 16 and 32, ...) compared with the torch
model on the same inputs where that is cheap. DIR/MANIFEST.json (one entry per file,
replaced when the file is made again) and DIR/MANIFEST.md (made from it) describe every
file: interface with dim_param names, weight dtypes, sizes, op-type counts, whether
onnxruntime runs it, suggested ``--input-shape`` values; failed exports are entries too.
"""

import argparse
import collections
import contextlib
import datetime
import json
import os
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_models import walk_nodes  # noqa: E402

SEED = 0
LEGACY_OPSET = 17
THREADS = 2  # the machine's two cores are shared with other work
# torch.export's upper bounds (BERT's position table has 512 rows)
DYNAMO_MAX = {"batch": 1024, "sequence": 512, "samples": 10**6}

# Sizes the symbolic dims are run at (two each), and the sizes suggested for taso-egg's
# --input-shape (representative deployment sizes). Keys are the roles jobs give each axis.
TEST_SIZES = {"batch": (1, 2), "sequence": (16, 32), "samples": (8000, 16000)}
SUGGESTED_SIZES = [{"batch": 1, "sequence": 128, "samples": 16000},
                   {"batch": 8, "sequence": 128, "samples": 16000}]


def seed_all():
    torch.manual_seed(SEED)
    np.random.seed(SEED)


# --------------------------------------------------------------------------
# Exporters
# --------------------------------------------------------------------------

def export_legacy(model, args, path, in_names, out_names, roles):
    """TorchScript exporter, opset 17, symbolic dims named after their roles (``roles``
    names the outputs' axes too)."""
    dynamic_axes = {n: {ax: r for ax, r in enumerate(rs) if r} for n, rs in roles.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, path, dynamo=False, opset_version=LEGACY_OPSET,
                          input_names=in_names, output_names=out_names,
                          dynamic_axes={k: v for k, v in dynamic_axes.items() if v},
                          do_constant_folding=True)


def export_dynamo(model, args, path, in_names, out_names, roles):
    """torch.export-based exporter (its default opset, optimize=True), one torch.export.Dim
    per role."""
    dims = {}

    def dim(role):
        if role not in dims:
            dims[role] = torch.export.Dim(role, min=1, max=DYNAMO_MAX[role])
        return dims[role]

    dynamic_shapes = tuple({ax: dim(r) for ax, r in enumerate(roles[n]) if r} or None
                           for n in in_names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(model, args, dynamo=True, input_names=in_names,
                                 output_names=out_names, dynamic_shapes=dynamic_shapes,
                                 external_data=False, optimize=True)
        prog.save(path, external_data=False)


# --------------------------------------------------------------------------
# Inspection and the manifest
# --------------------------------------------------------------------------

DTYPE = onnx.TensorProto.DataType.Name


def value_info(vi):
    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in t.shape.dim] if t.HasField("shape") else None
    return {"name": vi.name, "dtype": DTYPE(t.elem_type), "dims": dims}


def weight_dtypes(model):
    """{dtype: {"tensors": n, "elements": n}} over initializers and Constant nodes."""
    out = collections.defaultdict(lambda: {"tensors": 0, "elements": 0})
    tensors = list(model.graph.initializer)
    tensors += [a.t for n in walk_nodes(model.graph) if n.op_type == "Constant"
                for a in n.attribute if a.name == "value"]
    for t in tensors:
        e = out[DTYPE(t.data_type)]
        e["tensors"] += 1
        e["elements"] += int(np.prod(t.dims)) if len(t.dims) else 1
    return dict(sorted(out.items()))


def external_data_bytes(model, folder):
    locations = {kv.value for t in model.graph.initializer
                 if t.data_location == onnx.TensorProto.EXTERNAL
                 for kv in t.external_data if kv.key == "location"}
    return sorted(locations), sum(os.path.getsize(os.path.join(folder, p)) for p in locations)


def op_counts(model):
    hist = collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
        for n in walk_nodes(model.graph))
    for f in model.functions:
        hist.update(f"[fn]{n.op_type}" for n in f.node)
    return dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))


NP_OF_ORT = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def make_feed(sess, roles, sizes, int_high, rng):
    """Random inputs: each symbolic dim at its role's size; attention masks have the
    tail of every row after the first padded out."""
    feed = {}
    for i in sess.get_inputs():
        shape = []
        for ax, d in enumerate(i.shape):
            if isinstance(d, int):
                shape.append(d)
            else:
                role = roles.get(i.name, [None] * (ax + 1))[ax]
                if role is None:
                    raise ValueError(f"input {i.name} axis {ax} is symbolic ({d}) but the job "
                                     "gave it no role")
                shape.append(sizes[role])
        dt = NP_OF_ORT[i.type]
        if dt in (np.float32, np.float16):
            feed[i.name] = rng.standard_normal(shape).astype(dt)
        elif i.name == "attention_mask":
            m = np.ones(shape, dt)
            m[1:, shape[1] * 3 // 4:] = 0
            feed[i.name] = m
        elif i.name == "token_type_ids":
            m = np.zeros(shape, dt)
            m[:, shape[1] // 2:] = 1
            feed[i.name] = m
        else:
            feed[i.name] = rng.integers(0, int_high.get(i.name, 1000), shape).astype(dt)
    return feed


def check_with_ort(path, roles, int_high, torch_fn):
    """Runs the file at two sizes of its symbolic dims; returns (ok, run records)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    symbolic = {r for rs in roles.values() for r in rs if r}
    rng = np.random.default_rng(SEED)
    runs = []
    for k in (0, 1) if symbolic else (0,):
        sizes = {r: TEST_SIZES[r][k] for r in TEST_SIZES}
        feed = make_feed(sess, roles, sizes, int_high, rng)
        t0 = time.time()
        outs = sess.run(None, feed)
        rec = {"input_shapes": {n: list(v.shape) for n, v in feed.items()},
               "output_shapes": [list(o.shape) for o in outs],
               "ort_s": round(time.time() - t0, 3),
               "finite": bool(all(np.isfinite(o.astype(np.float32)).all()
                                  for o in outs if o.dtype.kind == "f"))}
        if torch_fn is not None:
            refs = torch_fn(feed)
            rec["max_abs_diff_vs_torch"] = [float(np.max(np.abs(o.astype(np.float32) - r)))
                                            for o, r in zip(outs, refs)]
            rec["max_abs_torch"] = [float(np.max(np.abs(r))) for r in refs]
        runs.append(rec)
    return all(r["finite"] for r in runs), runs


def suggested_shapes(inputs, roles):
    out = []
    for sizes in SUGGESTED_SIZES:
        parts = []
        for vi in inputs:
            if all(isinstance(d, int) for d in vi["dims"]):
                continue
            rs = roles.get(vi["name"], [])
            dims = [d if isinstance(d, int) else sizes[rs[ax]] for ax, d in enumerate(vi["dims"])]
            parts.append(f"--input-shape {vi['name']}={','.join(map(str, dims))}")
        if parts and " ".join(parts) not in out:
            out.append(" ".join(parts))
    return out


class Manifest:
    """MANIFEST.json + MANIFEST.md in the output folder, rewritten after every entry."""

    def __init__(self, folder):
        self.folder = folder
        self.json_path = os.path.join(folder, "MANIFEST.json")

    def put(self, entry):
        # read afresh: another run may have added entries since this one started
        entries = []
        if os.path.exists(self.json_path):
            with open(self.json_path) as f:
                entries = json.load(f)["files"]
        paths = [e["path"] for e in entries]
        if entry["path"] in paths:
            entries[paths.index(entry["path"])] = entry
        else:
            entries.append(entry)
        self.entries = entries
        self._write()

    def _write(self):
        import torchvision
        import transformers
        versions = {"torch": torch.__version__, "torchvision": torchvision.__version__,
                    "transformers": transformers.__version__, "onnx": onnx.__version__,
                    "onnxscript": __import__("onnxscript").__version__,
                    "onnxruntime": ort.__version__}
        data = {"generator": "tests/torch_zoo/export_deploy.py", "versions": versions,
                "test_sizes": TEST_SIZES, "files": self.entries}
        for path, text in ((self.json_path, json.dumps(data, indent=1)),
                           (os.path.join(self.folder, "MANIFEST.md"), manifest_md(data))):
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)


def fmt_vi(v):
    dims = "<no shape>" if v["dims"] is None else ", ".join(map(str, v["dims"]))
    return f"`{v['name']}` {v['dtype']}[{dims}]"


def manifest_md(data):
    L = ["# Third-party ONNX exports (random weights)", "",
         f"Made by `{data['generator']}` with "
         + ", ".join(f"{k} {v}" for k, v in data["versions"].items()) + ".",
         "Symbolic dims are named dim_params. Each file was run in onnxruntime (CPU) on "
         "random inputs at two sizes of every symbolic dim "
         + ", ".join(f"{k} {a}/{b}" for k, (a, b) in data["test_sizes"].items())
         + " and, where noted, compared with the torch model on the same inputs.", "",
         "| file | model | exporter | opset | size MiB | ext. data MiB | ORT runs |",
         "|---|---|---|---|---:|---:|---|"]
    for e in data["files"]:
        if "error" in e:
            L.append(f"| {e['path']} | {e['model']} | {e['exporter']} | - | - | - | "
                     f"EXPORT FAILED |")
            continue
        L.append(f"| {e['path']} | {e['model']} | {e['exporter']} | {e['opset']} | "
                 f"{e['file_bytes'] / 2**20:.1f} | {e['external_data_bytes'] / 2**20:.1f} | "
                 f"{'yes' if e['ort_runs'] else 'NO'} |")
    L.append("")
    for e in data["files"]:
        L += [f"## {e['path']}", "", f"- model: {e['model']}", f"- exporter: {e['exporter']}"]
        if e.get("notes"):
            L.append(f"- notes: {e['notes']}")
        if "error" in e:
            L += [f"- FAILED: {e['error']}", ""]
            continue
        L.append(f"- opset: {e['opset']} (all: {e['opsets']}), ir_version {e['ir_version']}, "
                 f"onnx.checker: {e['checker']}")
        L.append(f"- inputs: " + "; ".join(fmt_vi(v) for v in e["inputs"]))
        L.append(f"- outputs: " + "; ".join(fmt_vi(v) for v in e["outputs"]))
        L.append("- weights: " + ", ".join(f"{k} {v['tensors']} tensors / {v['elements']:,} elements"
                                           for k, v in e["weight_dtypes"].items()))
        L.append(f"- file: {e['file_bytes']:,} bytes"
                 + (f"; external data {e['external_data_files']}: "
                    f"{e['external_data_bytes']:,} bytes" if e["external_data_files"] else ""))
        L.append(f"- nodes: {e['node_count']}; op types: "
                 + ", ".join(f"{k} {v}" for k, v in e["op_counts"].items()))
        if e["ort_runs"]:
            for r in e["ort_check"]:
                s = (f"- onnxruntime: {r['input_shapes']} -> {r['output_shapes']}, "
                     f"finite={r['finite']}, {r['ort_s']} s")
                if "max_abs_diff_vs_torch" in r:
                    s += (f"; max|ORT - torch| = {r['max_abs_diff_vs_torch']} "
                          f"(max|torch| = {[round(x, 3) for x in r['max_abs_torch']]})")
                L.append(s)
        else:
            L.append(f"- onnxruntime: FAILED: {e['ort_error']}")
        for s in e["suggested_input_shape"]:
            L.append(f"- suggested: `{s}`")
        L.append("")
    return "\n".join(L)


class Recorder:
    def __init__(self, folder):
        self.folder = folder
        self.manifest = Manifest(folder)
        self.failures = 0

    def path(self, fname):
        return os.path.join(self.folder, fname)

    @contextlib.contextmanager
    def exporting(self, fname, model_desc, exporter, notes=""):
        """Wraps one export: a failure becomes a manifest entry, not the end of the run."""
        t0 = time.time()
        print(f"--- {fname}: exporting ({exporter})", flush=True)
        try:
            yield
        except Exception as e:  # noqa: BLE001 -- a failed export is recorded and reported
            traceback.print_exc()
            msg = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:400]}"
            print(f"FAILED {fname}: {msg}", flush=True)
            self.failures += 1
            self.manifest.put({"path": fname, "model": model_desc, "exporter": exporter,
                               "notes": notes, "error": msg})
        else:
            print(f"    exported in {time.time() - t0:.1f} s", flush=True)

    def record(self, fname, model_desc, exporter, roles, int_high=None, torch_fn=None,
               notes=""):
        path = self.path(fname)
        m = onnx.load(path, load_external_data=False)
        inputs = [value_info(v) for v in m.graph.input
                  if v.name not in {t.name for t in m.graph.initializer}]
        ext_files, ext_bytes = external_data_bytes(m, self.folder)
        try:
            onnx.checker.check_model(path, full_check=False)
            checker = "ok"
        except Exception as e:  # noqa: BLE001
            checker = f"FAILED: {type(e).__name__}: {str(e)[:200]}"
        opsets = {(o.domain or "ai.onnx"): o.version for o in m.opset_import}
        entry = {"path": fname, "model": model_desc, "exporter": exporter, "notes": notes,
                 "opset": opsets.get("ai.onnx"), "opsets": opsets, "ir_version": m.ir_version,
                 "producer": f"{m.producer_name} {m.producer_version}", "checker": checker,
                 "inputs": inputs, "outputs": [value_info(v) for v in m.graph.output],
                 "weight_dtypes": weight_dtypes(m), "file_bytes": os.path.getsize(path),
                 "external_data_files": ext_files, "external_data_bytes": ext_bytes,
                 "node_count": sum(1 for _ in walk_nodes(m.graph)), "op_counts": op_counts(m),
                 "suggested_input_shape": suggested_shapes(inputs, roles)}
        del m
        try:
            entry["ort_runs"], entry["ort_check"] = check_with_ort(
                path, roles, int_high or {}, torch_fn)
        except Exception as e:  # noqa: BLE001 -- recorded: the file exists but ORT fails
            traceback.print_exc()
            entry["ort_runs"] = False
            entry["ort_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            self.failures += 1
        self.manifest.put(entry)
        print(f"    recorded {fname}: ORT runs={entry['ort_runs']} "
              + json.dumps(entry.get("ort_check", entry.get("ort_error")))[:600], flush=True)


def torch_runner(model, in_names):
    """A function from an ORT feed to the torch model's outputs (numpy, float32)."""
    def run(feed):
        args = [torch.from_numpy(feed[n]) for n in in_names]
        with torch.no_grad():
            out = model(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return [o.float().numpy() for o in out]
    return run


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

def torchvision_model(name, dtype=torch.float32):
    import torchvision
    seed_all()
    return getattr(torchvision.models, name)(weights=None).eval().to(dtype)


def liven(model):
    """Re-initialises a torchvision model so that random inputs give outputs of order 1:
    its own init gives ViT a zero head (all outputs 0) and MobileNetV3 fan-out depthwise
    convs (outputs ~1e-10), which would let any graph pass a numerical check."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
                fan_in = mod.weight[0].numel()
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * (2 / fan_in) ** 0.5)
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.1)
            elif isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.copy_(torch.randn(mod.running_mean.shape, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=g) + 0.5)
    return model


IMAGE_ROLES = {"input": ["batch", None, None, None], "output": ["batch", None]}


def export_cnn(rec, name, fname_stem, dynamo=False, live=False):
    """A torchvision classifier with a symbolic batch: legacy exporter (and dynamo)."""
    model = torchvision_model(name)
    desc = f"torchvision {name} (weights=None)"
    if live:
        model = liven(model)
        desc += ", re-initialised (fan-in normal convs/linears, random BN statistics)"
    args = (torch.randn(2, 3, 224, 224),)
    run = torch_runner(model, ["input"])
    jobs = [(f"{fname_stem}.dynbatch.onnx", "legacy TorchScript (dynamo=False), opset 17, "
             "dynamic_axes", export_legacy)]
    if dynamo:
        jobs.append((f"{fname_stem}.dynbatch.dynamo.onnx",
                     "dynamo (dynamo=True, optimize=True), dynamic_shapes", export_dynamo))
    for fname, exporter, fn in jobs:
        with rec.exporting(fname, desc, exporter):
            fn(model, args, rec.path(fname), ["input"], ["output"], IMAGE_ROLES)
            rec.record(fname, desc, exporter, IMAGE_ROLES, torch_fn=run)


def job_resnet50(rec):
    export_cnn(rec, "resnet50", "resnet50", dynamo=True)


class LogitsOnly(torch.nn.Module):
    """Plain-tensor interface for a transformers model: returns .logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids, return_dict=True).logits


BERT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
TEXT_ROLES = {**{n: ["batch", "sequence"] for n in BERT_NAMES}, "logits": ["batch", None]}


def bert_classifier():
    from transformers import BertConfig, BertForSequenceClassification
    seed_all()
    cfg = BertConfig(num_labels=2)  # bert-base: 12 layers, hidden 768, vocab 30522
    return LogitsOnly(BertForSequenceClassification(cfg).eval()).eval(), cfg


def text_args(vocab, names, batch=2, seq=16):
    g = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[1:, seq * 3 // 4:] = 0
    types = torch.zeros(batch, seq, dtype=torch.int64)
    return (ids, mask, types)[:len(names)]


BERT_DESC = "transformers BertForSequenceClassification, bert-base config (12x768, 2 labels), random init"


def job_bert(rec):
    model, cfg = bert_classifier()
    args = text_args(cfg.vocab_size, BERT_NAMES)
    run = torch_runner(model, BERT_NAMES)
    for fname, exporter, fn in [
            ("bert.onnx", "legacy TorchScript (dynamo=False), opset 17, dynamic_axes",
             export_legacy),
            ("bert.dynamo.onnx", "dynamo (dynamo=True, optimize=True), dynamic_shapes",
             export_dynamo)]:
        with rec.exporting(fname, BERT_DESC, exporter):
            fn(model, args, rec.path(fname), BERT_NAMES, ["logits"], TEXT_ROLES)
            rec.record(fname, BERT_DESC, exporter, TEXT_ROLES,
                       int_high={"input_ids": cfg.vocab_size}, torch_fn=run)


ONES_MASK_NOTE = ("the legacy exporter fails on plain model(input_ids) (UnsupportedOperatorError: "
                  "aten::diff, transformers 5's packed-sequence check when no attention_mask "
                  "is given), so the wrapper passes an all-ones mask made from input_ids' "
                  "shape; the interface is still input_ids alone")


class LastTokenLogits(torch.nn.Module):
    """GPT-2 prefill as deployed for generation's first step: logits of the last position.
    ``ones_mask`` passes an all-ones attention mask made from input_ids' shape: without a
    mask transformers 5 looks for packed sequences with torch.diff, which the legacy
    exporter cannot export (aten::diff)."""

    def __init__(self, model, ones_mask=False):
        super().__init__()
        self.model = model
        self.ones_mask = ones_mask

    def forward(self, input_ids):
        mask = torch.ones_like(input_ids) if self.ones_mask else None
        return self.model(input_ids=input_ids, attention_mask=mask,
                          use_cache=False).logits[:, -1, :]


def job_gpt2(rec):
    from transformers import GPT2Config, GPT2LMHeadModel
    seed_all()
    cfg = GPT2Config()  # gpt2 small: 12 layers, 768, vocab 50257
    lm = GPT2LMHeadModel(cfg).eval()
    model = LastTokenLogits(lm).eval()
    roles = {"input_ids": ["batch", "sequence"], "logits": ["batch", None]}
    args = text_args(cfg.vocab_size, ["input_ids"])
    run = torch_runner(model, ["input_ids"])
    desc = ("transformers GPT2LMHeadModel, gpt2-small config (12x768), random init, wrapped: "
            "model(input_ids, use_cache=False).logits[:, -1, :]")
    for fname, exporter, fn, wrapper, notes in [
            ("gpt2.prefill_last.onnx", "legacy TorchScript (dynamo=False), opset 17, "
             "dynamic_axes; wrapper passes attention_mask=ones_like(input_ids)", export_legacy,
             LastTokenLogits(lm, ones_mask=True).eval(), ONES_MASK_NOTE),
            ("gpt2.prefill_last.dynamo.onnx", "dynamo (dynamo=True, optimize=True), "
             "dynamic_shapes", export_dynamo, model, "")]:
        with rec.exporting(fname, desc, exporter, notes):
            fn(wrapper, args, rec.path(fname), ["input_ids"], ["logits"], roles)
            rec.record(fname, desc, exporter, roles, int_high={"input_ids": cfg.vocab_size},
                       torch_fn=run, notes=notes)


class RandomImages:
    """onnxruntime CalibrationDataReader over a few random normalised images."""

    def __init__(self, n, shape, name="input"):
        rng = np.random.default_rng(SEED)
        self.batches = iter([{name: rng.standard_normal(shape).astype(np.float32)}
                             for _ in range(n)])

    def get_next(self):
        return next(self.batches, None)


def job_resnet18_qdq(rec):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
    model = torchvision_model("resnet18")
    args = (torch.randn(1, 3, 224, 224),)
    run = torch_runner(model, ["input"])
    desc = "torchvision resnet18 (weights=None), fixed batch 1"
    fixed = {"input": [None] * 4, "output": [None] * 2}
    src = "resnet18.onnx"
    exporter = "legacy TorchScript (dynamo=False), opset 17, static shape"
    with rec.exporting(src, desc, exporter):
        export_legacy(model, args, rec.path(src), ["input"], ["output"], fixed)
        rec.record(src, desc, exporter, fixed, torch_fn=run)
    fname = "resnet18.qdq.onnx"
    exporter = ("onnxruntime.quantization: quant_pre_process, then quantize_static(QuantFormat.QDQ, "
                "activation QInt8, weight QInt8, per_channel=False, MinMax) on resnet18.onnx, "
                "8 random calibration images")
    with rec.exporting(fname, desc + ", int8 static QDQ", exporter):
        with tempfile.TemporaryDirectory() as tmp:
            pre = os.path.join(tmp, "pre.onnx")
            quant_pre_process(rec.path(src), pre)
            quantize_static(pre, rec.path(fname), RandomImages(8, (1, 3, 224, 224)),
                            quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                            weight_type=QuantType.QInt8, per_channel=False)
        rec.record(fname, desc + ", int8 static QDQ", exporter, fixed, torch_fn=run,
                   notes="compared with the fp32 torch model: the diff is quantization error")


def job_bert_dynint8(rec):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    src, fname = "bert.onnx", "bert.dynint8.onnx"
    model, cfg = bert_classifier()
    exporter = "onnxruntime.quantization.quantize_dynamic(weight_type=QInt8) on bert.onnx"
    with rec.exporting(fname, BERT_DESC + ", dynamic int8", exporter):
        if not os.path.exists(rec.path(src)):
            export_legacy(model, text_args(cfg.vocab_size, BERT_NAMES), rec.path(src),
                          BERT_NAMES, ["logits"], TEXT_ROLES)
        quantize_dynamic(rec.path(src), rec.path(fname), weight_type=QuantType.QInt8)
        rec.record(fname, BERT_DESC + ", dynamic int8", exporter, TEXT_ROLES,
                   int_high={"input_ids": cfg.vocab_size},
                   torch_fn=torch_runner(model, BERT_NAMES),
                   notes="compared with the fp32 torch model: the diff is quantization error")


def job_resnet18_fp16(rec):
    fname = "resnet18.fp16.onnx"
    desc = "torchvision resnet18 (weights=None) in float16, symbolic batch"
    model = torchvision_model("resnet18", torch.float16)
    args = (torch.randn(2, 3, 224, 224, dtype=torch.float16),)
    exporter = "legacy TorchScript (dynamo=False), opset 17, dynamic_axes, of model.half() (CPU)"
    with rec.exporting(fname, desc, exporter):
        export_legacy(model, args, rec.path(fname), ["input"], ["output"], IMAGE_ROLES)
        ref32 = torch_runner(torchvision_model("resnet18"), ["input"])
        rec.record(fname, desc, exporter, IMAGE_ROLES,
                   torch_fn=lambda feed: ref32({"input": feed["input"].astype(np.float32)}),
                   notes="compared with the float32 torch model on the same (fp16-rounded) "
                         "inputs: the diff is fp16 error")


def job_vision_zoo(rec):
    for name in ("vit_b_16", "convnext_tiny", "mobilenet_v3_large"):
        export_cnn(rec, name, name, live=True)


def job_wav2vec2(rec):
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    seed_all()
    cfg = Wav2Vec2Config(num_hidden_layers=4)  # base-sized otherwise (768 hidden, 7 conv layers)
    base = Wav2Vec2Model(cfg).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = base

        def forward(self, input_values):
            return self.m(input_values, return_dict=True).last_hidden_state

    model = Hidden().eval()
    roles = {"input_values": ["batch", "samples"], "last_hidden_state": ["batch", "frames", None]}
    desc = ("transformers Wav2Vec2Model, base config with 4 layers (768 hidden, conv feature "
            "extractor), random init; output last_hidden_state")
    fname = "wav2vec2.onnx"
    exporter = "legacy TorchScript (dynamo=False), opset 17, dynamic_axes"
    with rec.exporting(fname, desc, exporter):
        export_legacy(model, (torch.randn(2, 16000),), rec.path(fname), ["input_values"],
                      ["last_hidden_state"], roles)
        rec.record(fname, desc, exporter, roles, torch_fn=torch_runner(model, ["input_values"]))


def job_clip_vision(rec):
    from transformers import CLIPVisionConfig, CLIPVisionModel
    seed_all()
    cfg = CLIPVisionConfig()  # ViT-B/32: 224 px, patch 32, 12 layers, hidden 768
    base = CLIPVisionModel(cfg).eval()

    class Outputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = base

        def forward(self, pixel_values):
            out = self.m(pixel_values=pixel_values, return_dict=True)
            return out.last_hidden_state, out.pooler_output

    model = Outputs().eval()
    roles = {"pixel_values": ["batch", None, None, None],
             "last_hidden_state": ["batch", None, None], "pooler_output": ["batch", None]}
    desc = "transformers CLIPVisionModel, default config (ViT-B/32, 12x768), random init"
    fname = "clip_vision.onnx"
    exporter = "legacy TorchScript (dynamo=False), opset 17, dynamic_axes"
    with rec.exporting(fname, desc, exporter):
        export_legacy(model, (torch.randn(2, 3, 224, 224),), rec.path(fname), ["pixel_values"],
                      ["last_hidden_state", "pooler_output"], roles)
        rec.record(fname, desc, exporter, roles, torch_fn=torch_runner(model, ["pixel_values"]))


class FullLogits(torch.nn.Module):
    """All positions' logits; the all-ones mask is there for the legacy exporter (see
    LastTokenLogits)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                          use_cache=False).logits


def job_gpt2_large(rec):
    """GPT-2 large sized (~774M params, ~3.1 GB float32): weights in one external .data file."""
    from transformers import GPT2Config, GPT2LMHeadModel
    seed_all()
    cfg = GPT2Config(n_embd=1280, n_layer=36, n_head=20)
    model = FullLogits(GPT2LMHeadModel(cfg).eval()).eval()
    n_params = sum(p.numel() for p in model.parameters())
    roles = {"input_ids": ["batch", "sequence"], "logits": ["batch", "sequence", None]}
    fname = "gpt2_large.onnx"
    desc = (f"transformers GPT2LMHeadModel, gpt2-large config (36x1280, 20 heads), "
            f"{n_params:,} params, random init; output full logits; wrapper passes "
            "attention_mask=ones_like(input_ids)")
    exporter = ("legacy TorchScript (dynamo=False), opset 17, dynamic_axes; re-saved with "
                "onnx.save(save_as_external_data=True, all_tensors_to_one_file=True)")
    with rec.exporting(fname, desc, exporter):
        with tempfile.TemporaryDirectory(dir=rec.folder) as tmp:
            # past 2 GB the legacy exporter writes one file per tensor beside the model:
            # gather them into one .data file beside the final model.
            raw = os.path.join(tmp, "raw.onnx")
            export_legacy(model, text_args(cfg.vocab_size, ["input_ids"]), raw, ["input_ids"],
                          ["logits"], roles)
            m = onnx.load(raw, load_external_data=True)
            for p in (rec.path(fname), rec.path(fname + ".data")):
                if os.path.exists(p):
                    os.remove(p)
            onnx.save(m, rec.path(fname), save_as_external_data=True,
                      all_tensors_to_one_file=True, location=fname + ".data", size_threshold=1024)
            del m
        rec.record(fname, desc, exporter, roles, int_high={"input_ids": cfg.vocab_size},
                   torch_fn=torch_runner(model, ["input_ids"]), notes=ONES_MASK_NOTE)


JOBS = {
    "resnet50": job_resnet50,
    "bert": job_bert,
    "gpt2": job_gpt2,
    "resnet18_qdq": job_resnet18_qdq,
    "bert_dynint8": job_bert_dynint8,
    "resnet18_fp16": job_resnet18_fp16,
    "vision_zoo": job_vision_zoo,
    "wav2vec2": job_wav2vec2,
    "clip_vision": job_clip_vision,
    "gpt2_large": job_gpt2_large,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/work/exports/models")
    ap.add_argument("--only", nargs="*", choices=list(JOBS), help="jobs to run (default: all)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(THREADS)
    rec = Recorder(a.out)
    for name, job in JOBS.items():
        if a.only and name not in a.only:
            continue
        print(f"=== {name} ({datetime.datetime.now():%H:%M:%S})", flush=True)
        job(rec)
    print(f"done; {rec.failures} failure(s); manifest in {a.out}/MANIFEST.md")
    return 1 if rec.failures else 0


if __name__ == "__main__":
    sys.exit(main())
