"""Models as they are deployed: run `taso-egg optimize IN -o OUT` (no other flag) on each
ONNX file given and print one row per model: exit code, whether the interface is
identical (input/output names, order, dtypes, symbolic dims), the largest relative error
of OUT against IN in onnxruntime at two sizes of every symbolic dim, the weights' dtypes
before and after, file sizes (external data included), peak RSS against the weights,
seconds, what was written and the measured speedup line.

    .venv/bin/python scripts/deployed_table.py /path/to/a.onnx /path/to/b.onnx ... [--out DIR]

Models and outputs stay outside the repository; nothing here is run by the tests.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from taso_egg.product.dims import input_types
from taso_egg.product.dims import interface as symbolic_interface

SIZES = ({"batch": 1, "other": 16}, {"batch": 2, "other": 32})  # two sizes of each symbolic dim


def interface(model) -> list:
    inits = {t.name for t in model.graph.initializer}

    def vi(v):
        tt = v.type.tensor_type
        dims = tuple(d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else "?")
                     for d in tt.shape.dim) if tt.HasField("shape") else None
        return (v.name, tt.elem_type, dims)

    return [[vi(v) for v in model.graph.input if v.name not in inits], [vi(v) for v in model.graph.output]]


def weight_dtypes(model) -> dict[str, int]:
    count = Counter()
    for t in model.graph.initializer:
        count[helper.tensor_dtype_to_np_dtype(t.data_type).name] += int(np.prod(t.dims)) if t.dims else 1
    return dict(count)


def file_bytes(path: Path) -> int:
    data = Path(f"{path}.data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def feeds(model, sizes: dict, rng) -> dict:
    """Inputs as a deployed model gets them, each symbolic dim that leads an input at
    ``sizes["batch"]``, the others at ``sizes["other"]``: floats N(0, 1); token ids
    from a range every vocabulary holds, masks all ones, other integers (token types)
    0 or 1 (independent of optimize's own random feeds, which are 0 or 1 throughout)."""
    iface = symbolic_interface(model)
    leading = {dims[0] for dims in iface.dims.values() if dims and isinstance(dims[0], str)}
    at = {s: sizes["batch"] if s in leading else sizes["other"] for s in iface.symbols}
    out = {}
    for name, shape, dtype in input_types(iface, at):
        if np.issubdtype(dtype, np.integer):
            out[name] = (np.ones(shape, dtype) if "mask" in name else
                         rng.integers(0, 100 if "input_ids" in name else 2, shape).astype(dtype))
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def max_rel_error(original: Path, written: Path) -> list[float]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    a = ort.InferenceSession(str(original), opts, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(written), opts, providers=["CPUExecutionProvider"])
    model = onnx.load(str(original), load_external_data=False)
    errors = []
    for sizes in SIZES:
        f = feeds(model, sizes, np.random.default_rng(0))
        errors.append(worst_relative_error(a.run(None, f), b.run(None, f)))
    return errors


def worst_relative_error(expected, actual) -> float:
    """The largest difference of any output, relative to that output's largest entry
    (absolute where it is all zero or empty)."""
    worst = 0.0
    for x, y in zip(expected, actual):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        peak = float(np.max(np.abs(x))) if x.size else 0.0
        diff = float(np.max(np.abs(x - y), initial=0.0))
        worst = max(worst, diff / peak if peak else diff)
    return worst


def run(path: Path, out_dir: Path, taso_egg: str, errors=max_rel_error) -> dict:
    """One `taso-egg optimize` row; ``errors(path, written)`` measures the written model
    (None: not measured here)."""
    out = out_dir / path.name
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-v", taso_egg, "optimize", str(path), "-o", str(out)],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    row = {"model": path.name, "rc": proc.returncode, "seconds": seconds,
           "rss_gb": int(rss.group(1)) / 2**20 if rss else float("nan")}
    original = onnx.load(str(path), load_external_data=False)
    row["weights_gb"] = file_bytes(path) / 2**30
    row["dtypes_before"] = weight_dtypes(original)
    row["size_before"] = file_bytes(path)
    wrote = [line for line in proc.stdout.splitlines() if line.startswith("wrote ")]
    names = ("the input, unchanged", "the input, re-exported: the importer's clean-up")
    row["written"] = next((n for n in names if wrote and wrote[-1].endswith(f"({n})")), "the extracted graph")
    speed = [line for line in proc.stdout.splitlines() if line.startswith("speedup:")]
    row["speedup"] = speed[0][len("speedup: "):][:90] if speed else ""
    if proc.returncode != 0:
        row["error"] = (proc.stderr.strip().splitlines() or [""])[-1][:160]
        return row
    written = onnx.load(str(out), load_external_data=False)
    row["interface"] = interface(original) == interface(written)
    row["dtypes_after"] = weight_dtypes(written)
    row["size_after"] = file_bytes(out)
    if errors:
        row["errors"] = errors(path, out)
    return row


def table_arguments(argv, doc: str, prefix: str):
    """The models, the folder the written ones go to (made), and the taso-egg command."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", type=Path)
    p.add_argument("--out", type=Path, default=None, help="folder for the written models (default: a temporary one)")
    p.add_argument("--taso-egg", default=str(Path(sys.executable).with_name("taso-egg")))
    args = p.parse_args(argv)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix=prefix))
    out_dir.mkdir(parents=True, exist_ok=True)
    return args.models, out_dir, args.taso_egg


def main(argv=None) -> int:
    models, out_dir, taso_egg = table_arguments(argv, __doc__, "deployed-")
    print("| model | exit | interface identical | max rel err (batch 1, other 16 / batch 2, other 32) | weights before "
          "-> after | MB before -> after | peak RSS GB (budget 2w+1) | s | written | speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in models:
        r = run(path, out_dir, taso_egg)
        budget = 2 * r["weights_gb"] + 1
        if r["rc"]:
            print(f"| {r['model']} | {r['rc']} | - | - | {r['dtypes_before']} | {r['size_before'] / 1e6:.1f} | "
                  f"{r['rss_gb']:.2f} ({budget:.2f}) | {r['seconds']:.0f} | {r.get('error', '')} | |", flush=True)
            continue
        same = "same" if r["dtypes_before"] == r["dtypes_after"] else f"{r['dtypes_before']} -> {r['dtypes_after']}"
        errs = " / ".join(f"{e:.1e}" for e in r["errors"])
        print(f"| {r['model']} | 0 | {'yes' if r['interface'] else 'NO'} | {errs} | {same} | "
              f"{r['size_before'] / 1e6:.1f} -> {r['size_after'] / 1e6:.1f} | {r['rss_gb']:.2f} ({budget:.2f}) | "
              f"{r['seconds']:.0f} | {r['written']} | {r['speedup']} |", flush=True)
    print(f"written models in {out_dir}; weights = the input file(s) on disk")
    return 0


if __name__ == "__main__":
    sys.exit(main())
