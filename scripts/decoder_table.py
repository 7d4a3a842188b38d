"""Decoders as deployed: run `taso-egg optimize IN -o OUT` (no other flag) on each ONNX
file given and print one row per model: exit code, whether the interface is identical,
the largest relative error of OUT against IN in onnxruntime at an empty cache, at
past 31 and at batch 2 (a prefill: 8 tokens, 8 at batch 2, 64), what was written, the
speedup line, seconds and peak RSS.

    .venv/bin/python scripts/decoder_table.py /path/to/model.onnx ... [--out DIR]

Dims are sized by their names, as the exporters write them: `batch*`, `past*`
(`past_sequence_length + sequence_length` and `total*` are past + new), `kv_cache_dim`
(64, onnxruntime-genai's head size), the rest the new tokens. Models and outputs stay
outside the repository; nothing here is run by the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from deployed_table import interface, run as optimize_row, table_arguments, worst_relative_error  # scripts/ is on sys.path when run

CASES = (("empty cache", 1, 0, 1), ("past 31", 1, 31, 1), ("batch 2, past 31", 2, 31, 1))
PREFILL_CASES = (("8 tokens", 1, 0, 8), ("batch 2, 64 tokens", 2, 0, 64))


def dim_size(name: str, batch: int, past: int, new: int) -> int:
    name = name.lower()
    if "batch" in name:
        return batch
    if "kv_cache_dim" in name:
        return 64
    if "total" in name or ("past" in name and "+" in name):
        return past + new
    if "past" in name:
        return past
    return new


def feeds(sess, batch: int, past: int, new: int, rng) -> dict:
    out = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else dim_size(str(d), batch, past, new) for d in i.shape]
        if "int" in i.type:
            dtype = np.int32 if "int32" in i.type else np.int64
            if "mask" in i.name:
                out[i.name] = np.ones(shape, dtype)
            elif "position" in i.name:
                out[i.name] = np.broadcast_to(np.arange(past, past + shape[-1], dtype=dtype), shape).copy()
            else:
                out[i.name] = rng.integers(0, 100, shape).astype(dtype)
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def takes_cache(sess) -> bool:
    return any("past" in i.name for i in sess.get_inputs())


def errors(original: Path, written: Path) -> list[str]:
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    a = ort.InferenceSession(str(original), opts, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(written), opts, providers=["CPUExecutionProvider"])
    cells = []
    for label, batch, past, new in (CASES if takes_cache(a) else PREFILL_CASES):
        f = feeds(a, batch, past, new, np.random.default_rng(0))
        try:
            cells.append(f"{label}: {worst_relative_error(a.run(None, f), b.run(None, f)):.1e}")
        except Exception as e:  # the original itself may refuse a case (genai's GQA at batch 2 with a cache)
            cells.append(f"{label}: fails ({str(e).splitlines()[0][-80:]})")
    return cells


def main(argv=None) -> int:
    models, out_dir, taso_egg = table_arguments(argv, __doc__, "decoders-")
    print("| model | exit | interface identical | max rel err | written | speedup | s | peak RSS GB |")
    print("|---|---|---|---|---|---|---|---|")
    for i, path in enumerate(models):
        case_dir = out_dir / f"{i}"  # exports of one architecture share file names
        case_dir.mkdir(exist_ok=True)
        r = optimize_row(path, case_dir, taso_egg, errors=None)
        name = "/".join(path.parts[-3:] if path.parent.name in ("optimum", "genai") else path.parts[-2:])
        if r["rc"]:
            print(f"| {name} | {r['rc']} | - | - | {r.get('error', '')} | | {r['seconds']:.0f} | {r['rss_gb']:.2f} |", flush=True)
            continue
        same = interface(onnx.load(str(path), load_external_data=False)) == interface(
            onnx.load(str(case_dir / path.name), load_external_data=False))
        errs = "; ".join(errors(path, case_dir / path.name))
        print(f"| {name} | 0 | {'yes' if same else 'NO'} | {errs} | {r['written']} | {r['speedup']} | "
              f"{r['seconds']:.0f} | {r['rss_gb']:.2f} |", flush=True)
    print(f"written models in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
