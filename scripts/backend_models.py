"""Run ``taso-egg optimize`` on every model the ``onnx`` wheel ships for its backend
tests (``onnx/backend/test/data``: pytorch-converted, pytorch-operator, simple, light)
and classify each:

- ok: exit 0, and the written model's onnxruntime outputs equal the expected outputs
  (``input_*.pb`` -> ``output_*.pb`` of every ``test_data_set_*``) within the onnx
  backend tests' tolerance (rtol 1e-3, atol 1e-7; the light models' expected outputs
  come from onnx's reference evaluator on its dummy inputs, as its runner makes them);
- refused: exit 1 with one line on stderr; acceptable only where onnxruntime itself
  cannot run the input model (the ``ort`` column says whether it can);
- crashed: a traceback, another exit code, more than one error line, or a timeout;
- wrong: exit 0 but the written model does not load, run, or match the expected outputs;
- unchecked: exit 0, and neither the written model nor the input runs in onnxruntime
  (a kernel it lacks, a locale it needs), so nothing can be compared.

Each model runs in its own process (``python -m taso_egg.cli``), ``--measure 0``.

    python scripts/backend_models.py [--only SUBSTR ...] [--timeout S] [--jobs N]
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KINDS = ("pytorch-converted", "pytorch-operator", "simple", "light")
RTOL, ATOL = 1e-3, 1e-7


@dataclass
class Case:
    kind: str
    name: str
    model: str
    data_sets: list  # [(inputs: {name: array}, outputs: [array])]


@dataclass
class Outcome:
    case: Case
    verdict: str  # ok, refused, crashed, wrong
    detail: str
    ort_runs_input: bool
    seconds: float


def data_root() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def _read_tensor(path):
    import onnx
    from onnx import numpy_helper

    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def _read_value(path):
    """A tensor, or a sequence/optional as onnx's loader reads it (a list, or None)."""
    import onnx
    from onnx import numpy_helper

    with open(path, "rb") as f:
        data = f.read()
    t = onnx.TensorProto()
    t.ParseFromString(data)
    if t.dims or t.raw_data or t.float_data or t.int64_data or t.int32_data or t.string_data \
            or t.double_data:
        return numpy_helper.to_array(t)
    s = onnx.SequenceProto()
    s.ParseFromString(data)
    if s.elem_type:
        return numpy_helper.to_list(s)
    o = onnx.OptionalProto()
    o.ParseFromString(data)
    if o.elem_type:
        return numpy_helper.to_optional(o)
    return numpy_helper.to_array(t)


def cases(root: str) -> list[Case]:
    import onnx

    out = []
    for kind in KINDS:
        folder = os.path.join(root, kind)
        if kind == "light":
            from onnx.backend.test.runner import Runner

            for model in sorted(glob.glob(os.path.join(folder, "*.onnx"))):
                proto = onnx.load(model, load_external_data=False)
                inits = {i.name for i in proto.graph.initializer}
                inputs = {x.name: Runner.generate_dummy_data(x, seed=0, random=False)
                          for x in proto.graph.input if x.name not in inits}
                expected = [_read_tensor(p) for p in
                            sorted(glob.glob(os.path.splitext(model)[0] + "_output_*.pb"))]
                out.append(Case(kind, os.path.basename(model)[:-5], model, [(inputs, expected)]))
            continue
        for test in sorted(os.listdir(folder)):
            model = os.path.join(folder, test, "model.onnx")
            if not os.path.isfile(model):
                continue
            proto = onnx.load(model, load_external_data=False)
            inits = {i.name for i in proto.graph.initializer}
            names = [x.name for x in proto.graph.input if x.name not in inits]
            sets = []
            for ds in sorted(glob.glob(os.path.join(folder, test, "test_data_set_*"))):
                ins = [_read_value(p) for p in sorted(glob.glob(os.path.join(ds, "input_*.pb")),
                                                     key=_index)]
                outs = [_read_value(p) for p in sorted(glob.glob(os.path.join(ds, "output_*.pb")),
                                                      key=_index)]
                sets.append((dict(zip(names, ins)), outs))
            out.append(Case(kind, test, model, sets))
    return out


def _index(path: str) -> int:
    return int(os.path.basename(path).split("_")[1].split(".")[0])


def _ort_outputs(model, feeds):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _same(expected, got) -> str:
    """'' when ``got`` matches ``expected`` (arrays, lists of arrays, None), else why."""
    if expected is None or got is None:
        return "" if expected is None and got is None else "optional presence differs"
    if isinstance(expected, list) or isinstance(got, list):
        if not (isinstance(expected, list) and isinstance(got, list)) or len(expected) != len(got):
            return "sequence lengths differ"
        return next((w for w in (_same(e, g) for e, g in zip(expected, got)) if w), "")
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.shape != got.shape:
        return f"shape {list(got.shape)}, expected {list(expected.shape)}"
    if expected.dtype.kind in "fc":
        if not np.allclose(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True):
            return f"values differ (max abs {np.nanmax(np.abs(got.astype(float) - expected)):.3g})"
        return ""
    return "" if np.array_equal(expected, got) else "values differ"


def _input_shapes(case: Case) -> list[str]:
    """--input-shape options for the symbolic dimensions of tensor inputs, from the
    first data set (the model's own test inputs fix them)."""
    import onnx

    proto = onnx.load(case.model, load_external_data=False)
    args = []
    if not case.data_sets:
        return args
    inputs = case.data_sets[0][0]
    for x in proto.graph.input:
        value = inputs.get(x.name)
        if not x.type.HasField("tensor_type") or not isinstance(value, np.ndarray):
            continue
        dims = x.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") or d.dim_value <= 0 for d in dims) and value.ndim:
            args += ["--input-shape", f"{x.name}={','.join(str(s) for s in value.shape)}"]
    return args


def run_case(case: Case, timeout: float, workdir: str) -> Outcome:
    out = os.path.join(workdir, f"{case.kind}-{case.name}.onnx")
    ort_runs = True
    try:
        for inputs, _ in case.data_sets:
            _ort_outputs(case.model, inputs)
    except Exception:
        ort_runs = False
    cmd = [sys.executable, "-m", "taso_egg.cli", "optimize", case.model, "-o", out, "--measure", "0",
           "--extract-time-limit", "10", *_input_shapes(case)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome(case, "crashed", f"timeout after {timeout:g} s", ort_runs, time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("taso-egg: error:")]
    if "Traceback" in proc.stderr or proc.returncode not in (0, 1):
        last = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return Outcome(case, "crashed", last[0][:200], ort_runs, seconds)
    if proc.returncode == 1:
        if len(errors) != 1:
            return Outcome(case, "crashed", f"exit 1 with {len(errors)} error lines", ort_runs, seconds)
        return Outcome(case, "refused", errors[0][len("taso-egg: error: "):][:200], ort_runs, seconds)
    try:
        for inputs, expected in case.data_sets:
            got = _ort_outputs(out, inputs)
            if len(got) != len(expected):
                return Outcome(case, "wrong", f"{len(got)} outputs, expected {len(expected)}",
                               ort_runs, seconds)
            for i, (e, g) in enumerate(zip(expected, got)):
                why = _same(e, g)
                if why:
                    ref = _ort_outputs(case.model, inputs)[i]
                    if _same(e, ref):  # onnxruntime itself misses the expected output
                        if not _same(ref, g):
                            continue
                    return Outcome(case, "wrong", f"output {i}: {why}", ort_runs, seconds)
    except Exception as e:
        if not ort_runs:
            same = Path(out).read_bytes() == Path(case.model).read_bytes()
            return Outcome(case, "unchecked", f"written{' unchanged' if same else ', changed'}; onnxruntime "
                           f"runs neither it nor the input ({str(e).splitlines()[0][:90]})", ort_runs, seconds)
        return Outcome(case, "wrong", f"the written model does not run: {str(e).splitlines()[0][:150]}",
                       ort_runs, seconds)
    note = next((line for line in proc.stdout.splitlines() if line.startswith("wrote ")), "")
    return Outcome(case, "ok", note[:200], ort_runs, seconds)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="*", default=(), help="substrings of the case names to run")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--jobs", type=int, default=1)
    args = p.parse_args(argv)
    selected = [c for c in cases(data_root())
                if not args.only or any(s in f"{c.kind}/{c.name}" for s in args.only)]
    with tempfile.TemporaryDirectory() as workdir, ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda c: run_case(c, args.timeout, workdir), selected))
    print(f"{'model':<58} {'verdict':<8} {'ort':<4} {'s':>6}  detail")
    for o in outcomes:
        print(f"{o.case.kind + '/' + o.case.name:<58} {o.verdict:<8} {'yes' if o.ort_runs_input else 'no':<4} "
              f"{o.seconds:6.1f}  {o.detail}")
    counts = {v: sum(o.verdict == v for o in outcomes) for v in ("ok", "refused", "crashed", "wrong", "unchecked")}
    unjustified = sum(o.verdict == "refused" and o.ort_runs_input for o in outcomes)
    print(f"\n{len(outcomes)} models: " + ", ".join(f"{k} {v}" for k, v in counts.items())
          + f"; refused although onnxruntime runs the input: {unjustified}")
    return 0 if counts["crashed"] == counts["wrong"] == unjustified == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
