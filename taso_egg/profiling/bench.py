"""Predicted vs measured: does the profiled cost model predict what runs?

For each benchmark model, the original graph and the one ``optimize`` returns:

- cpu-ort profile total vs the exported ONNX model run in onnxruntime
  (ORT_ENABLE_ALL, one thread);
- cpu-numpy profile total vs our executor on the exported-and-read-back graph
  (weight-only work folded, as the cost model assumes);

and the user's view: onnxruntime latency of the exported original vs optimized
model, in the same run. Times are medians of process CPU time (one thread; the
machine is shared), wall-clock medians beside them. A prediction is the sum of the
operator costs plus the profile's measured fixed cost of one whole-graph run.

``--time-profiling`` first profiles every configuration of the chosen models from
scratch into temporary profiles (both back ends) and reports the seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

BENCH_MODELS = ["bert", "nasrnn", "resnext50", "resnet50", "nasnet-a", "inception-v3", "squeezenet",
                "vgg19"]


def median_times(runs: dict, repeats: int) -> dict[str, tuple[float, float]]:
    """Interleaved samples of each callable (so load drifts hit all alike): median CPU
    and wall seconds per call."""
    cpu = {k: [] for k in runs}
    wall = {k: [] for k in runs}
    for fn in runs.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in runs.items():
            c0, w0 = time.process_time(), time.perf_counter()
            fn()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    return {k: (float(np.median(cpu[k])), float(np.median(wall[k]))) for k in runs}


def _predict(graph, model) -> tuple[float, str]:
    from ..cost import graph_cost

    model.reset_counts()
    total = graph_cost(graph, model) + model.profile.meta["calibration"]["run_overhead_s"]
    n = model.lookups()
    return total, f"{n['measured']}/{n['measured'] + n['estimated']}"


def _time_profiling(models, repeats, warmups, out) -> None:
    """Profile every configuration from scratch into temporary files; print seconds."""
    from ..cli import main as cli_main

    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("ort", "numpy"):
            t0 = time.perf_counter()
            code = cli_main(["profile", *models, "--backend", backend, "-o",
                             os.path.join(tmp, f"{backend}.json"), "--repeats", str(repeats),
                             "--warmups", str(warmups), "--quiet"])
            if code:
                raise SystemExit(code)
            print(f"profiling {len(models)} models' configurations from scratch with {backend}: "
                  f"{time.perf_counter() - t0:.1f} s", file=out, flush=True)


def main(argv=None) -> int:
    from .. import zoo
    from ..api import optimize
    from ..cost import load_cost_model
    from ..executor import random_inputs, run
    from ..onnx_io.exporter import export_onnx
    from ..rules.lang import load_corpus
    from .backends import make_session, pinned_threads
    from .profiler import exported_graph

    p = argparse.ArgumentParser(prog="python -m taso_egg.profiling.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=BENCH_MODELS, choices=sorted(zoo.MODELS))
    p.add_argument("--repeats", type=int, default=5, help="end-to-end runs per graph (median)")
    p.add_argument("--extractor", default="greedy-dag")
    p.add_argument("--ort-profile", default="cpu-ort")
    p.add_argument("--numpy-profile", default="cpu-numpy")
    p.add_argument("--include-unproved", action="store_true",
                   help="optimize with the corpus's unproved rules too")
    p.add_argument("--skip-numpy", action="store_true", help="only the onnxruntime comparison")
    p.add_argument("--time-profiling", action="store_true",
                   help="first profile the models from scratch and report the seconds")
    args = p.parse_args(argv)
    out = sys.stdout
    if args.time_profiling:
        _time_profiling(args.models, 10, 2, out)

    rules = load_corpus(include_unproved=args.include_unproved)
    ort_model = load_cost_model(args.ort_profile)
    np_model = None if args.skip_numpy else load_cost_model(args.numpy_profile)
    print(f"{'model':<13}{'runtime':<9}{'graph':<10}{'predicted ms':>13}{'measured ms':>12}"
          f"{'error':>8}{'wall ms':>10}{'measured':>10}", file=out)
    user_view, speedups = [], []
    for name in args.models:
        g = zoo.MODELS[name]()
        graphs = {"original": g, "optimized": optimize(g, rules, cost_model=ort_model, extractor=args.extractor).graph}
        comparisons = [("ort", ort_model, graphs)]
        if np_model is not None:
            np_opt = optimize(g, rules, cost_model=np_model, extractor=args.extractor).graph
            comparisons.append(("numpy", np_model, {"original": exported_graph(g),
                                                    "optimized": exported_graph(np_opt)}))
        for runtime, model, pair in comparisons:
            feeds = random_inputs(g)
            with pinned_threads(), np.errstate(all="ignore"):  # TASO's BERT overflows float32
                if runtime == "ort":
                    sessions = {k: make_session(export_onnx(v)) for k, v in pair.items()}
                    runs = {k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sessions.items()}
                else:
                    runs = {k: (lambda v=v, f=feeds: run(v, f)) for k, v in pair.items()}
                times = median_times(runs, args.repeats)
            predicted = {}
            for k, graph in pair.items():
                predicted[k], coverage = _predict(graph, model)
                cpu, wall = times[k]
                print(f"{name:<13}{runtime:<9}{k:<10}{predicted[k] * 1e3:>13.3f}{cpu * 1e3:>12.3f}"
                      f"{(predicted[k] - cpu) / cpu:>+8.1%}{wall * 1e3:>10.3f}{coverage:>10}",
                      file=out, flush=True)
            speedups.append((name, runtime, predicted["original"] / predicted["optimized"],
                             times["original"][0] / times["optimized"][0]))
            if runtime == "ort":
                user_view.append((name, times["original"], times["optimized"]))
    print(f"\n{'model':<13}{'runtime':<9}{'predicted speedup':>18}{'measured speedup':>18}", file=out)
    for name, runtime, pred, meas in speedups:
        print(f"{name:<13}{runtime:<9}{pred:>17.3f}x{meas:>17.3f}x", file=out)
    print("\nThe user's view: onnxruntime (ORT_ENABLE_ALL, 1 thread), exported original vs optimized",
          file=out)
    print(f"{'model':<13}{'original ms':>12}{'optimized ms':>13}{'speedup':>9}{'wall orig':>11}"
          f"{'wall opt':>10}{'speedup':>9}", file=out)
    for name, (cpu0, wall0), (cpu1, wall1) in user_view:
        flag = "  SLOWER" if cpu1 > cpu0 else ""
        print(f"{name:<13}{cpu0 * 1e3:>12.3f}{cpu1 * 1e3:>13.3f}{cpu0 / cpu1:>8.3f}x{wall0 * 1e3:>11.3f}"
              f"{wall1 * 1e3:>10.3f}{wall0 / wall1:>8.3f}x{flag}", file=out)
    print(f"\ncosts: {ort_model.name}" + (f"; {np_model.name}" if np_model else ""), file=out)
    print("times: medians of process CPU time (one thread; wall clock beside it); "
          "'measured' = profiled lookups / all lookups", file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
